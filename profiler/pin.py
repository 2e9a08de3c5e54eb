"""Pinning ranks to CPU cores, and a torchrun entry point that does it per local rank.

An affinity spec lists one core set per local rank, comma-separated; a core set is a core
(``3``), a range (``0-3``) or several joined by ``+`` (``0+2``). ``"0,1,1"`` puts rank 0
alone on core 0 and ranks 1 and 2 together on core 1: a fast device and two devices of
half its speed, on a 2-core machine (the heterogeneous CPU testbed, :mod:`profiler.testbed`).

As a launcher, under torchrun::

    python -m torch.distributed.run --nproc_per_node 3 -m profiler.pin 0,1,1 program.py --steps 5

each worker pins itself to its local rank's cores, then runs ``program.py`` as ``__main__``
with the remaining arguments (its directory first on ``sys.path``, as ``python program.py``
would have it).
"""

from __future__ import annotations

import os
import runpy
import sys

from hapc.errors import UserError


def parse_affinity(spec: str | None, *, available: set[int] | None = None) -> list[set[int]] | None:
    """``"0,1,1"`` -> ``[{0}, {1}, {1}]``; None or empty -> None (no pinning)."""
    if not spec:
        return None
    if available is None:
        available = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    out: list[set[int]] = []
    for i, part in enumerate(spec.split(",")):
        cores: set[int] = set()
        for piece in part.strip().split("+"):
            try:
                if "-" in piece:
                    lo, hi = (int(x) for x in piece.split("-", 1))
                    cores.update(range(lo, hi + 1))
                else:
                    cores.add(int(piece))
            except ValueError:
                raise UserError(f"--affinity {spec!r}: rank {i}: {piece!r} is not a core number, "
                                "a range like 0-3, or cores joined by + (0+2)") from None
        if not cores:
            raise UserError(f"--affinity {spec!r}: rank {i} has no cores")
        missing = sorted(cores - available) if available else []
        if missing:
            raise UserError(f"--affinity {spec!r}: rank {i}: core {missing[0]} is not available here "
                            f"(available: {format_cores(available)})")
        out.append(cores)
    return out


def format_cores(cores: set[int]) -> str:
    return "+".join(str(c) for c in sorted(cores))


def format_affinity(affinity: list[set[int]] | None) -> str:
    return ",".join(format_cores(c) for c in affinity) if affinity else ""


def pin(cores: set[int] | None) -> None:
    """Restrict this process (and the threads it starts later) to ``cores``."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: python -m profiler.pin AFFINITY program.py [args...]  (under torchrun)", file=sys.stderr)
        return 2
    spec, program, rest = args[0], args[1], args[2:]
    affinity = parse_affinity(spec)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if affinity is not None:
        if local_rank >= len(affinity):
            print(f"profiler.pin: affinity {spec!r} names {len(affinity)} ranks, this is local rank {local_rank}",
                  file=sys.stderr)
            return 2
        pin(affinity[local_rank])
    sys.argv = [program, *rest]
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    runpy.run_path(program, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
