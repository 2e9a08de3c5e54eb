"""Run a function in a forked child on a spare core while this process does other work.

``hapc replan`` searches the new cluster under two overlap assumptions; each search and its
simulation take about a quarter of the command's second and do not depend on each other, so
the second one runs in a child. A fork shares the parent's memory (the graph, the cached
strategies) without copying or pickling it; only the child's result comes back, pickled
through a pipe. Where there is no spare core, no ``fork`` (Windows), or ``HAPC_SERIAL`` is
set in the environment, or the child fails in any way, the function simply runs here: the
result is the same either way, only the wall time differs.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def spare_core() -> bool:
    """Whether a child process could run beside this one on a core of its own."""
    if os.environ.get("HAPC_SERIAL") or not hasattr(os, "fork"):
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        cores = os.cpu_count() or 1
    return cores >= 2


class Beside(Generic[T]):
    """``job()`` started in a forked child (or deferred, without a spare core); :meth:`result`
    returns its value, computing it here when the child could not."""

    def __init__(self, job: Callable[[], T]) -> None:
        self._job = job
        self._pid = 0
        self._read = -1
        if not spare_core():
            return
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:                                     # the child: run, send, leave at once
            os.close(read)
            try:
                payload = pickle.dumps(job(), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException:                       # the parent runs it again and sees the error
                payload = b""
            with os.fdopen(write, "wb") as pipe:
                pipe.write(payload)
            os._exit(0)                                 # no atexit handlers, no flushing the parent's buffers
        os.close(write)
        self._pid, self._read = pid, read

    @property
    def forked(self) -> bool:
        """Whether the job runs in a child now (else :meth:`result` will compute it here)."""
        return self._pid != 0

    def ready(self) -> bool:
        """Whether :meth:`result` would return without waiting for the child (true when there
        is none: the job then runs when asked)."""
        if not self._pid:
            return True
        readable, _, _ = select.select([self._read], [], [], 0)
        return bool(readable)             # the child writes its whole result once, at its end

    def cancel(self) -> None:
        """Stop the child (its result is not wanted) and reap it."""
        if self._pid:
            os.kill(self._pid, signal.SIGKILL)
            os.close(self._read)
            os.waitpid(self._pid, 0)
            self._pid = 0

    def result(self) -> T:
        if self._pid:
            with os.fdopen(self._read, "rb") as pipe:   # read all before waiting: a full pipe blocks the child
                payload = pipe.read()
            os.waitpid(self._pid, 0)
            self._pid = 0
            if payload:
                try:
                    return pickle.loads(payload)
                except Exception:       # noqa: BLE001 - a garbled result: compute it here instead
                    pass
        return self._job()
