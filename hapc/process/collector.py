"""Python's cyclic garbage collector, paused or frozen where it would find nothing to free.

Everything in hapc that turns the collector off, freezes the heap or asks for a freeze at exit
goes through this module:

* :func:`gc_paused`: the search and the simulator allocate millions of small tuples, dicts and
  lists and free them by reference counting, yet the collector still runs every few hundred
  allocations and, in its older generations, walks every live object (the graph, the price
  caches, the memo tables) to find nothing. Pausing it loses nothing as long as the paused code
  keeps no reference cycles alive (the search's objects hold each other by weak reference where
  they must point back, see :class:`synth.search.Searcher`). With ``freeze_after`` the objects
  made meanwhile are frozen when it ends (long-lived imports: :mod:`hapc.frontend.torchimport`).
* :func:`gc_frozen` and :func:`gc_frozen_for_fork`: a forked child shares the parent's memory
  page by page until either writes to a page; a collection writes to every object it visits,
  and so copies the pages the fork shares. Frozen objects are skipped.
* :func:`freeze_at_exit`: a process that ends does not need the interpreter's last collection.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused(*, freeze_after: bool = False) -> Iterator[None]:
    """The cyclic collector off inside the block, then back to what it was (on if it was on),
    also when the block raises; nested pauses leave it off until the outermost one ends.

    With ``freeze_after``, everything alive when the block ends is frozen (``gc.freeze``: later
    collections skip it) just before the collector comes back on; where the collector was off
    before the block, it stays off and nothing is frozen."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if freeze_after:
                gc.freeze()
            gc.enable()


@contextmanager
def gc_frozen() -> Iterator[None]:
    """The objects alive at the start of the block frozen inside it, so that collections there
    (in this process, and in a child forked inside the block, which inherits the freeze) leave
    them and the pages that hold them alone; unfrozen when the block ends. Where something else
    has frozen objects already, the block leaves that freeze as it is and freezes nothing."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def gc_frozen_for_fork() -> Iterator[None]:
    """``gc.freeze()`` before the block and ``gc.unfreeze()`` after it, for a block that forks:
    the unfreeze runs in the parent and in the child alike, and leaves every object alive at the
    fork in the collector's oldest generation, which only a full collection visits. The child's
    frequent young collections then never touch, and so never copy, the parent's objects. Unlike
    :func:`gc_frozen` this also ends an earlier freeze (``gc.unfreeze`` releases every frozen
    object)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def freeze_at_exit() -> None:
    """Freeze the heap as the interpreter exits, before its last collection, which would visit
    everything a command made (the graph, programs, simulations) and find no garbage in it.
    Registered once per process however often this is called (each call moves the one
    registration to the front of the exit handlers, so it runs before those registered earlier).
    Nothing changes until exit, so an in-process caller is unaffected. Garbage in reference
    cycles is then never collected, so a file left open in one would never be flushed by its
    finaliser: only for a command that closes its files itself (``with`` blocks)."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
