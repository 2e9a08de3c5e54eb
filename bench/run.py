"""``make bench``: run every benchmark section, each in its own process, then render
BENCHMARKS.md.

Own processes so that one section's caches and warm imports never flatter another's timings,
and a section that fails leaves the others' figures in results.json. About 10 minutes on the
2-core development machine when it is otherwise idle.

    python -m bench.run [--only synthesis,quality] [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.common import ROOT

SECTIONS = ("machine_speed", "synthesis", "compile_time", "quality", "runtime", "pipeline", "scale", "program_size", "replan_time")
QUICK_ARGS = {"synthesis": ["--quick"], "compile_time": ["--repeats", "1"], "scale": ["--repeats", "1"],
              "runtime": ["--launches", "1", "--steps", "6", "--no-calibration"],
              "program_size": ["--quick"], "replan_time": ["--repeats", "1"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"sections to run (of {', '.join(SECTIONS)})")
    parser.add_argument("--quick", action="store_true", help="fewer models and repeats (a smoke run)")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}")
    failed = []
    started = time.perf_counter()
    for section in chosen:
        print(f"bench.{section}", flush=True)
        t0 = time.perf_counter()
        extra = QUICK_ARGS.get(section, []) if args.quick else []
        rc = subprocess.call([sys.executable, "-m", f"bench.{section}", *extra], cwd=ROOT)
        verdict = "ok" if rc == 0 else f"FAILED (exit {rc})"
        print(f"bench.{section}: {verdict} in {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(section)
    subprocess.call([sys.executable, "-m", "bench.render"], cwd=ROOT)
    failures = f"; failed: {', '.join(failed)}" if failed else ""
    print(f"bench: {time.perf_counter() - started:.0f} s in all{failures}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
