"""How a compile gets its model file's trace: from the trace cache, else traced (in a child
forked before torch is imported where that is possible, :mod:`hapc.frontend.cache.child`; else here),
with the new cache entry written while the compile goes on to plan.

:func:`trace_model_file` is the one entry point (``hapc compile`` and
``synthesize("model.py", ...)``); the cache itself (:mod:`hapc.frontend.cache.store`, with its
keys, sources and entry format) knows nothing of processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hapc.process.fork import Beside, single_threaded
from hapc.frontend.cache.keys import TraceKey
from hapc.frontend.cache.sources import Recorder, process_start_ns
from hapc.frontend.cache.store import TraceCache
from hapc.frontend.cache.child import TraceChild, may_trace_in_child, trace_in_child


class StoreBeside:
    """A new entry written by a forked child (:class:`hapc.process.fork.Beside`) while this process
    goes on to plan: listing and stamping the sources and pickling the graph cost a quarter of
    a second, which a compile need not wait for. :meth:`path` waits for the child and passes
    on its notes; where there is no spare core the entry is written then, here."""

    def __init__(self, cache: TraceCache, key: TraceKey, traced: Any, recorder: Recorder) -> None:
        process_start_ns()          # this process's start, not the child's (cached)
        self._note = cache.note

        def store() -> tuple[str | None, list[str]]:
            notes: list[str] = []
            cache.note = notes.append
            try:
                written = cache.store(key, traced, recorder)
            finally:
                cache.note = self._note
            return (str(written) if written is not None else None), notes

        self._done: tuple[Path | None] | None = None
        # Not beside other Python threads: one of them may hold a lock the child would need
        # (hapc.process.fork.single_threaded); then it is written here and now.
        self._writing = Beside(store) if single_threaded() else None
        if self._writing is None:
            self._finish(*store())

    def _finish(self, written: str | None, notes: list[str]) -> None:
        for msg in notes:
            self._note(msg)
        self._done = (Path(written) if written is not None else None,)

    def path(self) -> Path | None:
        """The entry, once written (None, after its notes, when it could not be)."""
        if self._done is None:
            self._finish(*self._writing.result())
        return self._done[0]

    def close(self, *, interrupted: bool = False) -> None:
        """Stop writing the entry if it is still being written (after an error or Ctrl-C; the
        writer starts no process of its own, so ``interrupted`` changes nothing)."""
        if self._done is None:
            self._writing.cancel()
            self._done = (None,)


def trace_model_file(path: str | os.PathLike, overrides: Mapping[str, Any], trace: Callable[[], Any], *,
                     cache: TraceCache | None, device: str = "cpu", beside: bool = False,
                     child_precision: str | None = None,
                     meanwhile: Callable[[], None] = lambda: None,
                     ) -> tuple[Any, Path | StoreBeside | TraceChild | None]:
    """The graph of model file ``path`` with ``overrides``, traced for ``device`` (part of the
    cache key; ``trace()`` must trace for it): from ``cache`` when it holds a sound
    entry (a :class:`hapc.frontend.cache.store.CachedTrace`), else ``trace()`` (which loads the file,
    builds the model and traces it, returning a :class:`hapc.frontend.tracer.Traced`) while recording
    the files it reads, and then stored. Returns the traced model and its entry (None when not cached); with
    ``beside``, a new entry is written while the caller goes on, and comes as a
    :class:`StoreBeside` whose ``path()`` the caller must call before it ends.

    With ``child_precision``, where :func:`hapc.frontend.cache.child.may_trace_in_child` allows it,
    ``trace()`` runs in a child forked before torch is imported; the graph then comes as a
    :class:`hapc.frontend.cache.child.ChildTrace`, with the node strategies of its ``child_precision``
    graph installed from the child, and the entry as the :class:`hapc.frontend.cache.child.TraceChild`,
    whose ``path()`` or ``close()`` the caller must call before it ends.

    ``meanwhile()``, work that needs no graph, runs after the lookup and before any tracing:
    here while the child traces, else before ``trace()``."""
    key = TraceKey.for_model_file(path, overrides, device=device) if cache is not None else None
    hit = cache.lookup(key) if cache is not None and key is not None else None
    if hit is not None:
        meanwhile()
        return hit, hit.entry
    if child_precision is not None and os.path.isfile(path) and may_trace_in_child():
        return trace_in_child(trace, child_precision, cache, key, meanwhile)
    meanwhile()
    recorder = Recorder()
    with recorder.active():
        traced = trace()
    if cache is None or key is None:
        return traced, None
    if beside:
        return traced, StoreBeside(cache, key, traced, recorder)
    return traced, cache.store(key, traced, recorder)
