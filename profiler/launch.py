"""Running an emitted program under torchrun on this machine and reading its step times.

The program (:mod:`hapc.codegen`) prints ``step i loss <x> time <seconds>`` on rank 0 every
step. The measured step time of a run is the median over the steps after the first (the
first pays for allocation and gloo's connection set-up, which a long training run does not).
Each rank gets ``OMP_NUM_THREADS=1`` unless told otherwise, as ``hapc profile`` measured with
one thread per rank, and may be pinned to cores (:mod:`profiler.pin`).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from profiler.workers import free_port

_STEP = re.compile(r"^step\s+(\d+)\s+loss\s+(\S+)\s+time\s+([0-9.eE+-]+)", re.MULTILINE)
_REPO = Path(__file__).resolve().parent.parent


@dataclass
class RunResult:
    """One run of an emitted program: its step times, losses, and what went wrong if anything."""

    program: str
    step_seconds: list[float]
    losses: list[float]
    returncode: int
    seconds: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and len(self.step_seconds) >= 2

    @property
    def measured_seconds(self) -> float:
        """Median step time without the first step."""
        return statistics.median(self.step_seconds[1:]) if len(self.step_seconds) > 1 else float("nan")


def parse_steps(stdout: str) -> tuple[list[float], list[float]]:
    """(step seconds, losses) from a program's output, in step order."""
    steps = sorted((int(m.group(1)), float(m.group(2)), float(m.group(3))) for m in _STEP.finditer(stdout))
    return [t for _, _, t in steps], [loss for _, loss, _ in steps]


def torchrun_command(program: str | Path, nproc: int, *, steps: int, device: str = "cpu",
                     affinity: str | None = None, port: int | None = None,
                     extra: list[str] | None = None) -> list[str]:
    """``python -m torch.distributed.run ...`` for ``program`` (pinned through profiler.pin if asked)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={port or free_port()}"]
    args = [str(program), "--device", device, "--steps", str(steps), *(extra or [])]
    if affinity:
        return cmd + ["-m", "profiler.pin", affinity] + args
    return cmd + args


def run_program(program: str | Path, nproc: int, *, steps: int = 6, device: str = "cpu", affinity: str | None = None,
                threads: int = 1, timeout_seconds: float = 300.0, extra: list[str] | None = None) -> RunResult:
    """Run ``program`` on ``nproc`` local ranks and collect its step times."""
    import time

    program = Path(program).resolve()
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join([str(_REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    cmd = torchrun_command(program, nproc, steps=steps, device=device, affinity=affinity, extra=extra)
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, cwd=program.parent, env=env, capture_output=True, text=True,
                              timeout=timeout_seconds)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        times, losses = parse_steps(out)
        return RunResult(str(program), times, losses, -1, time.perf_counter() - started,
                         f"timed out after {timeout_seconds:.0f} s")
    times, losses = parse_steps(proc.stdout)
    error = ""
    if proc.returncode != 0 or len(times) < 2:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        interesting = [ln for ln in lines if "Error" in ln or "error" in ln] or lines
        error = interesting[-1][:300] if interesting else f"exit code {proc.returncode}"
    return RunResult(str(program), times, losses, proc.returncode, time.perf_counter() - started, error)
