"""``hapc compile`` of a 48-layer GPT (hidden 768), end to end: a fresh process that starts
Python, traces the model on the meta device, synthesizes, writes plan.json and the report, and
emits program.py — the wall time a user waits. The target is under 10 s.

Also recorded: the time ``hapc compile`` itself reports (from loading the cluster to the
last file written; without interpreter start-up and imports).

    python -m bench.compile_time [--repeats 3] [--layers 48]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import HAP8, ROOT, model_path, save_section, say


def compile_once(layers: int, out: Path) -> tuple[float, float | None, bool, str]:
    cmd = [sys.executable, "-m", "hapc.cli", "compile", str(model_path("gpt")), "--cluster", str(HAP8),
           "-o", str(out), "--set", f"layers={layers}", "-q"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"hapc compile failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    said = re.search(r"wrote .* in ([0-9.]+) s", proc.stdout)
    summary = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    return wall, float(said.group(1)) if said else None, (out / "program.py").exists(), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_time", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=48)
    args = parser.parse_args(argv)
    walls, reported, emitted, summary = [], [], True, ""
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            wall, said, emitted_now, summary = compile_once(args.layers, Path(tmp) / f"run{i}")
            walls.append(wall)
            if said is not None:
                reported.append(said)
            emitted = emitted and emitted_now
            say(f"hapc compile gpt-{args.layers}: {wall:.1f} s wall"
                + (f" ({said:.1f} s reported)" if said is not None else ""))
    save_section("compile", {
        "model": f"gpt-{args.layers}", "cluster": HAP8.stem, "repeats": args.repeats,
        "wall_seconds": statistics.median(walls), "wall_runs": walls,
        "reported_seconds": statistics.median(reported) if reported else None,
        "emitted_program": emitted, "target_seconds": 10.0, "summary_first_line": summary,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
