"""Pausing Python's cyclic garbage collector around the stages that write a plan's files.

Saving, loading and emitting a plan build tens of thousands of small dicts, lists, tuples and
strings (60k values for a 48-layer GPT) that reference counting frees and none of which is in a
cycle. Each allocation burst still triggers the cyclic collector, whose older generations walk
every object the process holds (a replan's cost model and caches): about half of
``Plan.save`` and ``Plan.load`` went to those walks. The search (synth.search) pauses it for
the same reason.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside the block (reference counting still frees everything
    acyclic); the collector is back as it was afterwards, also on an exception."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def without_collection(fn: F) -> F:
    """``fn`` run under :func:`collector_paused`."""
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with collector_paused():
            return fn(*args, **kwargs)
    return wrapped  # type: ignore[return-value]
