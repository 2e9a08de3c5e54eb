"""``make demo``: compile the example GPT for the small mixed cluster, check the plan in the
in-process executor, then run the emitted program on CPU ranks with ``--verify``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "configs" / "models" / "gpt.py"
CLUSTER = ROOT / "configs" / "clusters" / "small-mixed.yaml"
OUT = ROOT / "demo-out"
DEMO_BATCH = 24


def main() -> int:
    import torch

    from hapc.cli import main as hapc_main
    from hapc.codegen.executor import replicated_program, run
    from hapc.frontend.modelfile import load_model_file
    from hapc.plan.plan import Plan
    from hapc.frontend.tracer import trace

    # SMALL's sizes with a batch that the 2:1 shares split exactly (rows 8/8/4/4): at SMALL's 5
    # rows, rounding gives a fast device a slow one's work and the plan no edge over dp-even.
    small = {**load_model_file(str(MODEL)).module.SMALL, "batch": DEMO_BATCH}
    sets = [f"{k}={v}" for k, v in small.items()]
    print(f"$ hapc compile {MODEL.relative_to(ROOT)} --cluster {CLUSTER.relative_to(ROOT)} -o demo-out "
          + " ".join(f"--set {s}" for s in sets), flush=True)
    args = ["compile", str(MODEL), "--cluster", str(CLUSTER), "-o", str(OUT)]
    for s in sets:
        args += ["--set", s]
    rc = hapc_main(args)
    if rc:
        return rc

    plan = Plan.load(OUT / "plan.json")
    mf = load_model_file(str(MODEL), small)
    torch.manual_seed(0)
    model, inputs = mf.build_model(), mf.build_inputs()
    traced = trace(model, inputs)
    got = run(plan.program, traced, inputs, dtype=torch.float64)
    ref = run(replicated_program(traced.graph), traced, inputs, dtype=torch.float64)
    err = max([abs(got.loss - ref.loss).item()] +
              [(got.grads[p] - ref.grads[p]).abs().max().item() for p in ref.grads])
    print(f"in-process executor, {plan.cluster.world} simulated ranks: loss and gradients match one device, "
          f"max_abs_err={err:.2e}" if err < 1e-9 else f"in-process executor: MISMATCH max_abs_err={err:.2e}")
    if err >= 1e-9:
        return 1

    print("the CPU ranks below are alike: their run checks the program's numbers, not its speed-up, which the "
          "cost model predicts for the cluster file's fast and slow devices", flush=True)
    program = OUT / "program.py"
    if not program.exists():
        print("(no program.py: code generation is not available in this build)")
        return 0
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={plan.cluster.world}",
           str(program), "--device", "cpu", "--verify", "--steps", "3"]
    print("$ torchrun " + " ".join(cmd[3:]), flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
