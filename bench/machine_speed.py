"""How fast this machine is, by two fixed workloads that no hapc change can move, so that
figures from different sessions' machines can be compared (sessions have landed on VMs whose
speed differed by 3-4x on the same 2-core, 24 GiB shape: the same commit's whole synthesize of
ViT-24 took 5.07 s on one and 1.57 s on another).

* ``python_seconds``: a fixed pure-Python workload (dict and list work, as the search and
  simulator do), median of 5 runs in this process;
* ``import_torch_seconds``: ``import torch`` in a fresh interpreter, median of 3 (what every
  cold ``hapc compile`` pays first).

To compare a figure across machines, scale it by the ratio of these (the first for planning
figures, the second for cold compiles).

    python -m bench.machine_speed
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from bench.common import ROOT, save_section, say


def python_workload() -> int:
    """A fixed mix of dict lookups, tuple building and sorting (about 0.2 s on a 2026 VM core)."""
    table: dict[tuple[int, int], int] = {}
    total = 0
    for i in range(800_000):
        key = (i % 997, i % 89)
        table[key] = table.get(key, 0) + i
    for _ in range(80):
        total += sum(sorted(table.values(), reverse=True)[:100])
    return total


def _timed_python() -> float:
    start = time.perf_counter()
    python_workload()
    return time.perf_counter() - start


def _timed_import_torch() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], cwd=ROOT, check=True)
    return time.perf_counter() - start


def main() -> int:
    python_seconds = statistics.median(_timed_python() for _ in range(5))
    torch_seconds = statistics.median(_timed_import_torch() for _ in range(3))
    say(f"fixed Python workload {python_seconds:.3f} s, import torch {torch_seconds:.2f} s")
    save_section("machine_speed", {"python_seconds": python_seconds, "import_torch_seconds": torch_seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
