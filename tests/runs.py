"""What many test folders share: the example models traced at their ``SMALL`` size, plans and
emitted programs for them, and real ``torchrun`` runs of emitted programs on CPU ranks (gloo)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import torch

import hapc
from hapc.codegen import emit
from synth.baselines import baseline_program

REPO = Path(__file__).resolve().parents[1]
MODELS = ["mlp", "gpt", "bert", "vit", "vgg", "moe"]
SMALL_MIXED = REPO / "configs" / "clusters" / "small-mixed.yaml"


@functools.cache
def traced_small(name: str):
    """(traced SMALL model, its model-file path, SMALL kwargs), traced once per process."""
    from conftest import load_model_file

    path = REPO / "configs" / "models" / f"{name}.py"
    module = load_model_file(path)
    torch.manual_seed(0)
    model = module.model(**module.SMALL)
    return hapc.trace(model, tuple(module.inputs(**module.SMALL))), path, dict(module.SMALL)


def plan_for(name: str, plan: str, cluster):
    """A program for ``name`` at SMALL size: a baseline by name, or "synth" (the synthesizer,
    with only the instant dp-flops baseline to beat, to keep tests quick)."""
    traced, _, _ = traced_small(name)
    if plan == "synth":
        from synth.synthesize import synthesize_program

        return synthesize_program(traced.graph, cluster, baselines=("dp-flops",)).best.program
    return baseline_program(plan, traced.graph, cluster)


def emit_model(name: str, program, out_dir: Path, cluster=None) -> Path:
    traced, path, small = traced_small(name)
    return Path(emit(program, str(path), str(out_dir), model_kwargs=small, cluster=cluster,
                     constants=traced.constants))


def torchrun(program: Path, n: int, *args: str, env: dict | None = None, timeout: float = 240):
    """Run an emitted program on ``n`` CPU ranks; return the completed process.

    A run in which a rank was killed by a signal (torchrun reports ``exitcode: -6``: gloo's
    TCP transport aborting the process, seen once in CI under torch 2.14.1) is run once more,
    with a warning carrying the first run's cause lines. A deterministic crash fails twice;
    a wrong result never passes, since callers check the second run's output as they would
    the first's."""
    child_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))

    def launch():
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
               "--master_port", str(_free_port()), str(program), "--device", "cpu", *args]
        return subprocess.run(cmd, cwd=program.parent, env=child_env, capture_output=True,
                              text=True, timeout=timeout, check=False)

    proc = launch()
    if proc.returncode != 0 and _killed_by_signal(proc):
        warnings.warn(f"{program.name}: a rank died by a signal; ran once more. First run:\n"
                      f"{failure_excerpt(proc)}", stacklevel=2)
        proc = launch()
    return proc


def _killed_by_signal(proc) -> bool:
    """Whether torchrun reported a rank that a signal ended (other than the SIGTERM torchrun
    itself sends the survivors once one rank has failed)."""
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", proc.stderr)
    return any(int(c) < 0 and int(c) != -15 for c in codes)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def failure_excerpt(proc) -> str:
    """What a failed torchrun printed that names the cause: a crashing rank's own lines (a C++
    ``terminate called ... what(): ...``, a Python exception) come long before torchrun's
    SIGTERM bookkeeping, so a plain tail of stderr loses them."""
    telling = ("terminate called", "what():", "Error", "Exception", "Fatal", "Abort", "abort")
    causes = [ln for ln in proc.stderr.splitlines()
              if any(t in ln for t in telling) and "ChildFailedError" not in ln]
    return "\n".join(causes[:40]) + "\n--- stderr tail ---\n" + proc.stderr[-2000:]


def verify_line(proc) -> str:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("verify:")]
    assert lines, f"no verify line (rc={proc.returncode}):\n{proc.stdout[-2000:]}\n{failure_excerpt(proc)}"
    return lines[0]


def step_losses(stdout: str) -> dict[int, float]:
    """``{step: loss}`` from an emitted program's ``step N loss L ...`` lines."""
    return {int(ln.split()[1]): float(ln.split()[3]) for ln in stdout.splitlines() if ln.startswith("step ")}


def run_losses(proc) -> dict[int, float]:
    """The step losses of a torchrun that must have succeeded."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return step_losses(proc.stdout)


def import_program(path: Path):
    """An emitted program.py as a module (its tables and helpers), without running it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"emitted_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def single_device_run(program_path: Path, steps: int):
    """The losses (and the final model) of the user's model trained on one device the way the
    emitted program trains it: same seed, optimizer and batch."""
    program = import_program(program_path)
    torch.manual_seed(program.SEED)
    model = program._call_with(program.M.model, program.MODEL_KWARGS)
    optimizer = program.make_optimizer(list(model.parameters()))
    batch = tuple(program._call_with(program.M.inputs, program.MODEL_KWARGS))
    losses = []
    for _ in range(steps):
        loss = model(*batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, model
