"""A cold ``hapc compile`` traces in a child process forked before torch is imported.

A compile whose trace is not in the cache (:mod:`hapc.frontend.cache.store`) spends most of its time
before the first op is seen: ``import torch``, ``torch._dynamo`` and torch.export's tracer. A
compile that finds its trace in the cache imports none of them: it reads the graph and every
node's candidate strategies and plans in a small, torch-free process. So a cold compile forks first, while it is still that
small process: the child imports torch, loads the model file, traces it and derives the
strategies (the sharding rules import torch, and the child has it), and sends back what a
cache entry would hold (the graph as :mod:`pickle` bytes of hapc IR, the constant tensors as
``torch.save`` bytes, the strategies in :mod:`synth.reuse`'s format); this process meanwhile
imports the planning side (numpy, HiGHS, the search), then plans exactly as a warm compile
does. While this process searches, the child writes the cache entry and its strategies,
reports where, and leaves. The process that plans never imports torch (unless writing the
program needs the constant tensors), so it also never pays for tearing torch down at exit,
and the child leaves with ``os._exit``.

Results are the same as tracing here: the graph, its strategies and its constants are the
ones a warm compile reads from the entry. A model-file or tracing error comes back as its
one-line message and is raised here as the same :class:`hapc.errors.UserError`; a child that
fails any other way (or dies) is not trusted: the trace then runs here as it always did, so
an internal error reads as it always did. Where a fork is unsafe or useless (no ``fork``, one
core, ``HAPC_SERIAL``, other threads running, or torch already imported, as in a notebook or a
test process) nothing is forked: see :func:`may_trace_in_child`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hapc.errors import UserError
from hapc.process.fork import BesideEach, single_threaded, spare_core
from hapc.frontend.cache.irpickle import dump_ir, load_ir
from hapc.frontend.cache.keys import TraceKey
from hapc.frontend.cache.sources import Recorder, process_start_ns
from hapc.frontend.cache.store import CachedTrace, StoredConstants, TraceCache, constants_blob, strategies_path


# How long a child interrupted by Ctrl-C may take to unwind (stopping the short trace it runs
# beside itself) before it is killed.
GRACE_SECONDS = 0.5


def may_trace_in_child() -> bool:
    """Whether a cold trace should run in a forked child: there is a spare core and ``fork``
    (:func:`hapc.process.fork.spare_core`), this process has not imported torch (else there is no
    import to overlap, and a fork could copy a CUDA context) and runs no other thread (a lock
    one of them held would never be released in the child)."""
    return spare_core() and "torch" not in sys.modules and single_threaded()


@dataclass
class ChildTrace(CachedTrace):
    """A graph traced by the child, standing in for :class:`hapc.frontend.tracer.Traced` as a cache
    hit does: same graph, constants loaded (with torch) only when read, strategies installed
    from the child's file instead of derived from the rules here."""

    from_cache: bool = False


class TraceChild:
    """The child that traces ``trace()`` (it loads the model file, builds and traces the model,
    returning a :class:`hapc.frontend.tracer.Traced`) and, with ``cache``/``key``, stores the entry.

    :meth:`traced` waits for the graph; :meth:`path` for the entry (None when not stored),
    passing on the child's notes; :meth:`close` stops the child if it still runs and removes
    the scratch directory. Use it as a context manager, so that an error or Ctrl-C in this
    process never leaves the child behind.
    """

    def __init__(self, trace: Callable[[], Any], precision: str, cache: TraceCache | None,
                 key: TraceKey | None) -> None:
        self._trace, self._precision, self._cache, self._key = trace, precision, cache, key
        self._scratch = Path(tempfile.mkdtemp(prefix="hapc-trace-"))
        self._parent = os.getpid()
        self._made: tuple[Any, Recorder, Any] | None = None     # in the process that traced
        self._entry: tuple[Path | None] | None = None
        process_start_ns()            # this process's start, not the child's (cached)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()            # else the child would inherit, and never write, what waits
        self._jobs = BesideEach([self._trace_job, self._store_job])

    def __enter__(self) -> TraceChild:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(interrupted=exc_type is not None and issubclass(exc_type, KeyboardInterrupt))

    # ---- in the child (or here, when the child failed) ----------------------------------------

    def _trace_job(self) -> tuple:
        """Trace and return what this process plans from: ``("error", message)`` for the model's
        error; in the child, ``("graph", graph bytes, constants or None, seconds)`` with the
        strategies derived into the scratch directory; here, ``("traced", traced)``."""
        recorder = Recorder()
        try:
            with recorder.active():
                traced = self._trace()
        except UserError as exc:
            return "error", str(exc)
        finally:
            _flush()
        self._made = traced, recorder, None
        if os.getpid() == self._parent:        # the child failed: traced here, as without one
            return "traced", traced
        from hapc.ir.precision import autocast_graph
        from synth import reuse

        graph = autocast_graph(traced.graph, self._precision)      # the graph the search will see
        reuse.write(graph, self._strategies_file())     # derives each distinct node's strategies
        self._made = traced, recorder, graph
        blob = dump_ir(traced.graph)
        if load_ir(blob) != traced.graph:      # the child leaves, and the trace runs here
            raise ValueError("the traced graph does not read back equal")
        return "graph", blob, constants_blob(traced), traced.seconds

    def _store_job(self) -> tuple[str | None, list[str]]:
        """Write the cache entry (in the child, with the strategies it derived); returns the
        entry (None when not written) and the notes that say why not."""
        if self._made is None or self._cache is None or self._key is None:
            return None, []
        traced, recorder, graph = self._made
        notes: list[str] = []
        cache = TraceCache(self._cache.root, note=notes.append)
        written = cache.store(self._key, traced, recorder)
        if written is not None and graph is not None:
            cache.store_strategies(written, self._precision, graph)
        _flush()
        return (str(written) if written is not None else None), notes

    def _strategies_file(self) -> Path:
        return strategies_path(self._scratch / "child.trace", self._precision)

    # ---- here -----------------------------------------------------------------------------------

    def traced(self) -> ChildTrace | Any:
        """The child's graph (waits for it), or the :class:`hapc.frontend.tracer.Traced` of a trace made
        here when the child failed; raises the model's :class:`UserError`."""
        done = self._jobs.result(0)
        if done[0] == "error":
            raise UserError(done[1])
        if done[0] == "traced":
            return done[1]
        _, graph, constants, seconds = done
        stored = StoredConstants(constants[1], list(constants[0])) if constants is not None else {}
        note = self._cache.note if self._cache is not None else (lambda msg: None)
        return ChildTrace(load_ir(graph), seconds, self._scratch / "child.trace", stored, note=note)

    def path(self) -> Path | None:
        """The cache entry the child wrote (waits for it), after passing on its notes."""
        if self._entry is None:
            written, notes = self._jobs.result(1)
            for msg in notes:
                if self._cache is not None:
                    self._cache.note(msg)
            self._entry = (Path(written) if written is not None else None,)
            self.close()
        return self._entry[0]

    def close(self, *, interrupted: bool = False) -> None:
        """Stop the child if it still runs (its results are not wanted) and remove the scratch
        directory (the strategies, installed by now or never). ``interrupted``: after a Ctrl-C,
        which reached the child too, it first gets a moment to stop what it started itself."""
        if interrupted:
            self._jobs.cancel_after(GRACE_SECONDS)
        else:
            self._jobs.cancel()
        shutil.rmtree(self._scratch, ignore_errors=True)


def _flush() -> None:
    """What the model printed in the child: it leaves with ``os._exit``, which flushes nothing."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def trace_in_child(trace: Callable[[], Any], precision: str, cache: TraceCache | None,
                   key: TraceKey | None, meanwhile: Callable[[], None] = lambda: None,
                   ) -> tuple[ChildTrace, TraceChild]:
    """Fork a :class:`TraceChild`, run ``meanwhile()`` here, and return the child's graph with
    the child (whose :meth:`TraceChild.path` the caller must call, or :meth:`~TraceChild.close`,
    before it ends). The child is closed here when anything fails."""
    child = TraceChild(trace, precision, cache, key)
    try:
        meanwhile()
        return child.traced(), child
    except BaseException as exc:
        child.close(interrupted=isinstance(exc, KeyboardInterrupt))
        raise

