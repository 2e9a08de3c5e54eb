"""Where each rank's step time goes: compute, communication, idle (``program.py --timings``).

A rank's step is either computing or blocked in a collective (a blocking call, or waiting on an
asynchronous one). Blocked time is communication plus idling for slower ranks to arrive; the
two are told apart the way a straggler shows itself: the rank with the most compute waits for
nobody, and every other rank idles, at most, for the difference between its compute and the
slowest rank's. So per step

    compute_r = step_r - blocked_r
    idle_r    = min(blocked_r, max_q compute_q - compute_r)
    comm_r    = blocked_r - idle_r

On a GPU, NCCL calls return once queued, so blocked time is only what the host waits for
(``wait``, the step's final synchronisation counts as compute): there the split is a lower
bound on communication plus idle, and per-rank compute is still each rank's own.

The cost is a clock read around each collective call and one small all-gather per step (outside
the timed region); nothing changes when ``--timings`` is off. Rank 0 prints one line per rank
and step, which ``hapc replan --measured`` reads::

    timing step 3 rank 1 compute_s 0.012345 comm_s 0.002100 idle_s 0.000400

This module depends on torch only: code generation copies it beside emitted programs.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
import torch.distributed as dist

# The collectives a step may call (hapc_collectives and the skeleton use a subset).
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter",
               "all_to_all_single", "all_to_all", "broadcast", "reduce", "gather", "scatter", "barrier")


class _TimedWork:
    """An asynchronous collective's handle whose ``wait`` counts as blocked time."""

    def __init__(self, work: Any, clock: StepClock) -> None:
        self._work, self._clock = work, clock

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._clock.blocked_seconds += time.perf_counter() - started

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class StepClock:
    """Counts the seconds this rank spends blocked in collectives during a step."""

    def __init__(self) -> None:
        self.blocked_seconds = 0.0
        self._started = 0.0
        self._originals: dict[str, Any] = {}

    def install(self) -> None:
        """Time every collective of ``torch.distributed`` from now on (until ``uninstall``)."""
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None and name not in self._originals:
                self._originals[name] = fn
                setattr(dist, name, self._timed(fn))

    def uninstall(self) -> None:
        for name, fn in self._originals.items():
            setattr(dist, name, fn)
        self._originals.clear()

    def _timed(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                work = fn(*args, **kwargs)
            finally:
                self.blocked_seconds += time.perf_counter() - started
            return _TimedWork(work, self) if kwargs.get("async_op") and work is not None else work
        return timed

    def start(self) -> None:
        self.blocked_seconds = 0.0
        self._started = time.perf_counter()

    def stop(self) -> tuple[float, float]:
        """(step seconds, blocked seconds) since ``start``."""
        return time.perf_counter() - self._started, self.blocked_seconds


def split(step_seconds: list[float], blocked_seconds: list[float]) -> list[tuple[float, float, float]]:
    """(compute, comm, idle) seconds per rank from each rank's step and blocked seconds."""
    compute = [max(0.0, s - b) for s, b in zip(step_seconds, blocked_seconds)]
    slowest = max(compute, default=0.0)
    out = []
    for c, b in zip(compute, blocked_seconds):
        idle = min(b, slowest - c)
        out.append((c, b - idle, idle))
    return out


def report(step: int, step_seconds: float, blocked_seconds: float, device: torch.device) -> list[str]:
    """Every rank's line for this step (on rank 0; an empty list elsewhere). Collective: every
    rank calls it, after the clock has stopped."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    mine = torch.tensor([step_seconds, blocked_seconds], dtype=torch.float64, device=device)
    if world > 1:
        everyone = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
    else:
        everyone = [mine]
    if (dist.get_rank() if dist.is_initialized() else 0) != 0:
        return []
    parts = split([float(t[0]) for t in everyone], [float(t[1]) for t in everyone])
    return [f"timing step {step} rank {r} compute_s {c:.6f} comm_s {m:.6f} idle_s {i:.6f}"
            for r, (c, m, i) in enumerate(parts)]
