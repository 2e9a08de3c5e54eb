"""Measured runs: the emitted data-parallel program against torch DDP on the same CPU ranks,
and the cost model's accuracy after calibration.

**DP vs DDP.** The ``dp-even`` baseline plan of a GPT (2 layers, hidden 256, sequence 64) for
two CPU workers is emitted with ``hapc.codegen`` and run under torchrun (gloo); the same model,
batch split and optimizer run under ``bench/ddp_reference.py`` (hand-written torch DDP, the
reference the code generator's own tests use). Launches alternate (emitted,
DDP, emitted, DDP, ...) so a change in the machine's load hits both; each launch reports the
median of its steps after the first, and the figure kept is the median over launches. The
target is an emitted program within 5 % of DDP.

**Calibration.** ``hapc profile`` measures the two CPU ranks (a cluster file, as a user
would write one), then ``hapc calibrate`` (its library form, two alternating rounds) emits
and runs every distinct plan of a GPT and an MLP and compares it with the simulator's
prediction (rank correlation, median relative error), before and after fitting the cost
model's knobs, with leave-one-out errors. Without ``profiler.calibrate`` the section says "not
measured yet".

    python -m bench.runtime [--launches 2] [--steps 12]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ROOT, model_path, save_section, say, trace_model

DP_MODEL = {"layers": 2, "hidden": 256, "heads": 4, "seq": 64, "vocab": 1000, "batch": 8, "dropout": 0.0}
CPU2 = {"name": "cpu2", "nodes": [{"devices": [{"type": "cpu", "count": 2}], "intra_link": "loopback"}]}
_PORT = [29611]


def _torchrun(script: Path, args: list[str], world: int) -> float:
    """Median step seconds (steps 2..K) of one launch."""
    _PORT[0] += 1
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}",
           f"--master_port={_PORT[0]}", str(script), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=script.parent, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} failed ({proc.returncode}): {out.strip()[-800:]}")
    median = re.search(r"median step time ([0-9.eE+-]+) s", out)
    if median is None:
        raise RuntimeError(f"{script.name} printed no median step time: {out.strip()[-800:]}")
    return float(median.group(1))


DDP_REFERENCE = ROOT / "tests" / "ddp_reference.py"


def dp_vs_ddp(launches: int, steps: int) -> dict[str, Any]:
    if importlib.util.find_spec("hapc.codegen") is None:
        return {"status": "not measured yet", "why": "hapc.codegen is not in this build"}
    if not DDP_REFERENCE.exists():
        return {"status": "not measured yet", "why": f"no {DDP_REFERENCE.relative_to(ROOT)}"}
    from costmodel.cluster import load_cluster
    from hapc.api import baseline

    cluster = load_cluster(CPU2)
    traced = trace_model("gpt", **DP_MODEL)
    with tempfile.TemporaryDirectory() as tmp:
        plan = baseline(traced, None, cluster, "dp-even", model_file=str(model_path("gpt")),
                        model_kwargs=DP_MODEL)
        program = plan.emit(tmp)
        sets = [f"--set={k}={v}" for k, v in DP_MODEL.items()]
        ddp_args = [str(model_path("gpt")), *sets, "--steps", str(steps)]
        program_args = ["--steps", str(steps), "--device", "cpu"]
        emitted_runs, ddp_runs = [], []
        for _ in range(launches):
            emitted_runs.append(_torchrun(Path(program), program_args, cluster.world))
            ddp_runs.append(_torchrun(DDP_REFERENCE, ddp_args, cluster.world))
            say(f"emitted dp {emitted_runs[-1] * 1e3:.1f} ms/step, ddp {ddp_runs[-1] * 1e3:.1f} ms/step")
    emitted, ddp_s = statistics.median(emitted_runs), statistics.median(ddp_runs)
    return {"status": "measured", "model": "gpt " + " ".join(f"{k}={v}" for k, v in DP_MODEL.items()),
            "ranks": cluster.world, "backend": "gloo", "steps_per_launch": steps, "launches": launches,
            "emitted_step_seconds": emitted, "ddp_step_seconds": ddp_s,
            "emitted_runs": emitted_runs, "ddp_runs": ddp_runs,
            "overhead": emitted / ddp_s - 1, "target_overhead": 0.05}


CALIBRATION_MODELS = (("gpt", DP_MODEL),
                      ("mlp", {"layers": 3, "features": 512, "hidden": 2048, "classes": 100, "batch": 128}))


def calibration(steps: int, repeats: int = 2) -> dict[str, Any]:
    """``hapc profile`` of two CPU ranks, then ``hapc calibrate`` (the library form) of a GPT
    and an MLP on them: every distinct plan (baselines and hapc's) emitted, run and compared
    with its prediction, then the cost model's knobs fitted on all runs together (with
    leave-one-out errors)."""
    if importlib.util.find_spec("profiler.calibrate") is None:
        return {"status": "not measured yet", "why": "profiler.calibrate is not in this build"}
    from profiler.calibrate import calibrate
    from profiler.profile import profile

    with tempfile.TemporaryDirectory() as tmp:
        cluster_file = Path(tmp) / "cpu2.yaml"
        say("profiling 2 CPU ranks")
        profile(cluster_file, nproc=2, say=lambda m: None)
        runs_path = str(Path(tmp) / "runs.json")
        notes: list[str] = []
        for model, kwargs in CALIBRATION_MODELS:
            runs, fit, more = calibrate(str(model_path(model)), str(cluster_file), overrides=kwargs,
                                        steps=steps, repeats=repeats, runs_path=runs_path,
                                        workdir=str(Path(tmp) / "work"), say=say)
            notes += more
    loo = fit.error_leave_one_out
    return {"status": "measured", "model": "gpt and mlp", "cluster": "2 CPU ranks, profiled by hapc profile",
            "runs": len(runs), "notes": notes,
            "plans": [{"plan": f"{r.plan} ({Path(r.model).stem})",
                       "measured": m, "before": b, "after": a}
                      for r, m, b, a in zip(runs, fit.measured, fit.before, fit.after)],
            "rho_before": fit.rho_before, "rho_after": fit.rho_after, "error_before": fit.error_before,
            "pairs_before": fit.pairs_before, "pairs_after": fit.pairs_after,
            "error_after": fit.error_after, "error_leave_one_out": None if math.isnan(loo) else loo,
            "scales": fit.scales}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=3, help="torchrun launches of each program")
    parser.add_argument("--steps", type=int, default=12, help="steps per launch (the first is not timed)")
    parser.add_argument("--calibration-steps", type=int, default=8, help="steps per calibration run")
    parser.add_argument("--no-calibration", action="store_true", help="skip the calibration runs")
    args = parser.parse_args(argv)
    data: dict[str, Any] = {}
    jobs = [("dp_vs_ddp", lambda: dp_vs_ddp(args.launches, args.steps))]
    if not args.no_calibration:
        jobs.append(("calibration", lambda: calibration(args.calibration_steps)))
    for key, fn in jobs:
        try:
            data[key] = fn()
        except Exception as exc:  # noqa: BLE001  (a broken piece marks its row, not the whole bench)
            data[key] = {"status": "failed", "why": f"{type(exc).__name__}: {str(exc).strip()[:400]}"}
        say(f"{key}: {data[key].get('status')}")
    save_section("runtime", data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
