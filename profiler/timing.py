"""Timing one piece of work on a device that other ranks (or other programs) may share.

A single timing on a shared machine is noise (another process, a page fault, a frequency
step); the median of a few repeats is what a steady training loop sees. ``sync`` waits for
asynchronous devices (``torch.cuda.synchronize``) so that the clock measures the work, not
the launch.

Each repeat runs the work for a fixed stretch of wall-clock time (a *window*) and divides
by the calls completed. Ranks that share a CPU core and start together (after a barrier)
then compete for the core during the whole window, and each measures the share it gets.
With a fixed number of calls instead, the scheduler may run one rank's calls to the end
before the other's start, and both would seem to own the core.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def window_seconds(work: Callable[[], object], *, window_seconds: float, repeats: int = 3, warmup: int = 1,
                   sync: Callable[[], None] | None = None) -> float:
    """Median over ``repeats`` windows of (window length / calls completed in it)."""
    return statistics.median(window_samples(work, window_seconds=window_seconds, repeats=repeats, warmup=warmup,
                                            sync=sync))


def window_samples(work: Callable[[], object], *, window_seconds: float, repeats: int = 3, warmup: int = 1,
                   sync: Callable[[], None] | None = None) -> list[float]:
    """Seconds per call in each of ``repeats`` windows: their median is the measurement, their
    range its noise (see :func:`relative_spread`)."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        work()
    sync()
    samples = []
    for _ in range(max(1, repeats)):
        calls = 0
        start = time.perf_counter()
        while True:
            work()
            calls += 1
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= window_seconds:
                break
        samples.append(elapsed / calls)
    return samples


def relative_spread(samples: list[float]) -> float:
    """Half the range of ``samples`` over their median: a measurement that repeats within it
    cannot be told apart from this one."""
    centre = statistics.median(samples)
    return (max(samples) - min(samples)) / 2 / centre if centre > 0 else 0.0
