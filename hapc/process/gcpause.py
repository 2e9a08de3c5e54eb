"""Pausing Python's cyclic garbage collector around allocation-heavy work that makes no cycles.

The search and the simulator allocate millions of small tuples, dicts and lists and free them
by reference counting. The cyclic collector still runs every few hundred allocations and, in
its older generations, walks every live object (the graph, the price caches, the memo
tables): 6-10% of a whole ``synthesize()`` finds nothing to free. Pausing it loses nothing as
long as the paused code keeps no reference cycles alive (the search's objects hold each other
by weak reference where they must point back, see :class:`synth.search.Searcher`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off inside the block, then back to what it was (on if it was on),
    also when the block raises; nested pauses leave it off until the outermost one ends."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
