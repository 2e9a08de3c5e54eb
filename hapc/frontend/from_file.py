"""From a model file to its traced graph: the one path ``hapc compile`` and
``synthesize("model.py")`` share.

A model file (design.md section 3) is loaded, built on the meta device and traced
(:func:`hapc.frontend.modelfile.load_and_trace`) for the cluster's device type, through the
trace cache when one is given
(:mod:`hapc.frontend.cache.cached_trace`). What comes back is a :class:`ModelFileTrace`: the
graph, plus what the plan must hand back to the cache afterwards (each node's strategies, so
that the next hit searches without the sharding rules) and what must end with the caller (a
child that traces or writes the entry). The command line asks for more overlap than a library
call (tracing in a child forked before torch is imported, writing the entry beside the
search); the graph is the same either way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from hapc.frontend.cache.cached_trace import trace_model_file
from hapc.frontend.cache.store import TraceCache


class ModelFileTrace:
    """A model file's graph (``traced``: a :class:`hapc.frontend.tracer.Traced` or a cache
    hit) with its trace-cache entry. Use it as a context manager, or call :meth:`close`: a
    child writing a new entry must end with the caller."""

    def __init__(self, traced: Any, entry: Any, cache: TraceCache | None) -> None:
        self.traced = traced
        self._entry = entry
        self._cache = cache

    def keep_strategies(self, graph: Any, precision: str) -> None:
        """Store each node's strategies of the planned ``graph`` with the cache entry, unless
        the graph had them from the cache already or there is no entry."""
        if self._entry is None or getattr(self.traced, "strategies_installed", False):
            return
        path = self._entry if isinstance(self._entry, Path) else self._entry.path()   # a child's: once written
        if path is not None:
            self._cache.store_strategies(path, precision, graph)

    def close(self, exc_type: type[BaseException] | None = None) -> None:
        """End the entry's writer, if a child writes it. After an error it may finish (the next
        compile, with the mistake fixed, then finds the trace); after Ctrl-C it is stopped."""
        if not hasattr(self._entry, "close"):
            return
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        try:
            if not interrupted:
                self._entry.path()
        finally:
            self._entry.close(interrupted=interrupted)

    def __enter__(self) -> ModelFileTrace:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(exc_type)


def trace_file(path: str | os.PathLike, overrides: Mapping[str, Any], *, cache: TraceCache | None,
               device: str = "cpu", command_line: bool = False, precision: str | None = None,
               meanwhile: Callable[[], None] = lambda: None) -> ModelFileTrace:
    """The graph of the model file at ``path`` with ``overrides``, traced for ``device`` (the
    cluster's device type, :func:`hapc.codegen.launch.run_device`; see
    :mod:`hapc.frontend.ondevice`), from ``cache`` when it holds a sound entry, else traced and
    stored there.

    With ``command_line`` the process is one that compiles and ends: torch is imported with the
    collector paused and then frozen (:mod:`hapc.frontend.torchimport`), the trace may run in a
    child forked before that import (its strategies derived there for ``precision``), and a new
    entry is written beside the caller's planning. A library caller's process is left as it is.
    ``meanwhile()``, work that needs no graph, runs while a child traces, else before the trace."""
    from hapc.frontend.modelfile import load_and_trace

    overrides = dict(overrides)
    traced, entry = trace_model_file(
        path, overrides, lambda: load_and_trace(str(path), overrides, device=device, quiet_imports=command_line),
        cache=cache, device=device, beside=command_line, child_precision=precision if command_line else None,
        meanwhile=meanwhile)
    return ModelFileTrace(traced, entry, cache)
