"""What ``hapc replan`` spends after planning (issue 15: <= 0.25 s of its second): loading the
old plan.json, saving the new one, report.md and program.py, for a 48-layer GPT on HAP's 8
devices after dropping rank 7.

Each step is timed in one process, as the command runs it (the replanned plan keeps the old
plan's graph), repeated; the figures are the fastest run's wall and CPU milliseconds (the
least disturbed by other load), and the first run's (what one command pays: a first emit
also reads the runtime's facts). The old plan is compiled once first, into a temporary
folder unless ``--plan`` names one.

    python -m bench.after_planning [--repeats 5] [--plan OLD/plan.json]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import HAP8, ROOT, model_path, say


def _old_plan(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "hapc.cli", "compile", str(model_path("gpt")), "--set", "layers=48",
                    "--cluster", str(HAP8), "-o", str(folder), "-q"], cwd=ROOT, check=True, capture_output=True)
    return folder / "plan.json"


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(plan_file: Path, out: Path, repeats: int) -> dict[str, dict[str, float]]:
    """Per step: first and fastest (wall, CPU) seconds over ``repeats`` runs."""
    from costmodel.cluster_edit import surviving_ranks, without_devices
    from hapc.plan.plan import Plan
    from hapc.elastic.replan import replan
    from hapc.report.summary import write_report
    from synth import reuse

    old = Plan.load(plan_file)
    reuse.load(old.graph, reuse.cache_path(plan_file))
    plan = replan(old, without_devices(old.cluster, [7]), survivors=surviving_ranks(old.cluster.world, [7])).plan
    out.mkdir(parents=True, exist_ok=True)
    steps = {"load": lambda: Plan.load(plan_file), "save": lambda: plan.save(out / "plan.json"),
             "report": lambda: write_report(plan, out), "program": lambda: plan.emit(out)}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for _ in range(max(1, repeats)):
        for name, step in steps.items():
            runs[name].append(_timed(step))
    return {name: {"first_wall_s": r[0][0], "first_cpu_s": r[0][1], "wall_s": min(w for w, _ in r),
                   "cpu_s": min(c for _, c in r)} for name, r in runs.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--plan", type=Path, default=None, help="the old plan.json (default: compile one)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        plan_file = args.plan or _old_plan(Path(tmp) / "old")
        figures = measure(plan_file, Path(tmp) / "new", args.repeats)
    say(f"{'step':8s} {'first wall':>11s} {'first CPU':>10s} {'best wall':>10s} {'best CPU':>9s}   (ms)")
    for name, f in figures.items():
        say(f"{name:8s} {f['first_wall_s'] * 1e3:11.1f} {f['first_cpu_s'] * 1e3:10.1f} "
            f"{f['wall_s'] * 1e3:10.1f} {f['cpu_s'] * 1e3:9.1f}")
    total = {k: sum(f[k] for f in figures.values()) for k in ("first_wall_s", "wall_s")}
    say(f"after planning: {total['first_wall_s'] * 1e3:.0f} ms first, {total['wall_s'] * 1e3:.0f} ms best "
        f"(target <= 250 ms wall on a quiet machine)")


if __name__ == "__main__":
    main()
