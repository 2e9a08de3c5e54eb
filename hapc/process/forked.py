"""Run functions in a forked child on a spare core while this process does other work.

Three places use it: ``hapc replan`` searches the new cluster under two overlap assumptions
in one child (:class:`BesideEach`: each result comes back as soon as it is made, and this
process re-balances the first while the child makes the second); a cold ``hapc compile``
traces the model in a child forked before torch is imported (:mod:`hapc.frontend.cache.child`) and
exports 3 blocks in another beside the 2-block export (:mod:`hapc.frontend.blocktrace`); and the stage
planner shares its group jobs with a child (:mod:`hapc.process.sharedwork`, which decides with
:func:`spare_core` too). It lives in ``synth``, the lowest layer that forks, so that none of
them imports upwards. A fork shares the parent's memory (the graph, the cached strategies)
without copying or pickling it; only the child's results come back, pickled through a pipe.
Where there is no spare core, no ``fork`` (Windows), or ``HAPC_SERIAL`` is set in the
environment, or the child fails in any way, the functions simply run here: the results are
the same either way, only the wall time differs.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import time
from collections.abc import Callable, Sequence
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


class BesideEach(Generic[T]):
    """``jobs`` run one after another in one forked child (or, without a spare core, here when
    asked), each result sent back as soon as it is made. :meth:`result` of a job the child
    did not send (it failed, or sent something garbled) computes that job, and the ones
    after it, here."""

    # A result waits in the pipe until the parent reads it. A pipe holds 64 KiB by default and
    # a search's program is ~110 KB pickled: the child would stop until the parent reads.
    PIPE_BYTES = 1 << 20

    def __init__(self, jobs: Sequence[Callable[[], T]]) -> None:
        self._jobs = list(jobs)
        self._results: list[T] = []
        self._pid = 0
        self._read = -1
        if not spare_core():
            return
        read, write = os.pipe()
        _widen(write, self.PIPE_BYTES)
        pid = os.fork()
        if pid == 0:                                     # the child: run each, send each, leave
            os.close(read)
            try:
                for job in self._jobs:
                    payload = pickle.dumps(job(), protocol=pickle.HIGHEST_PROTOCOL)
                    _write_all(write, _FRAME.pack(len(payload)) + payload)
            finally:                    # also after a failed job: the parent runs it and the rest
                os._exit(0)             # no atexit handlers, no flushing the parent's buffers
        os.close(write)
        self._pid, self._read = pid, read

    @property
    def forked(self) -> bool:
        """Whether a child runs the jobs now (else :meth:`result` computes each here)."""
        return self._pid != 0

    def ready(self, index: int) -> bool:
        """Whether :meth:`result` of job ``index`` would return without waiting for the child:
        it was received, it is the next one and its bytes wait in the pipe, or there is no
        child (the job then runs when asked)."""
        if not self._pid or index < len(self._results):
            return True
        if index > len(self._results):
            return False
        readable, _, _ = select.select([self._read], [], [], 0)
        return bool(readable)             # the child writes a result whole, once it is made

    def result(self, index: int) -> T:
        """Job ``index``'s value; the ones before it are received (or computed) first. After
        the last one the child, done, is reaped."""
        while len(self._results) <= index:
            self._results.append(self._next())
        if len(self._results) == len(self._jobs):
            self._reap()
        return self._results[index]

    def _next(self) -> T:
        k = len(self._results)
        if self._pid:
            head = _read_exactly(self._read, _FRAME.size)
            size = _FRAME.unpack(head)[0] if len(head) == _FRAME.size else -1
            payload = _read_exactly(self._read, size) if size > 0 else b""
            if size > 0 and len(payload) == size:
                try:
                    return pickle.loads(payload)
                except Exception:       # noqa: BLE001 - garbled: computed here instead
                    pass
            self._reap()                # the child stopped early: this job and the rest run here
        return self._jobs[k]()

    def cancel(self) -> None:
        """Stop the child (its results are not wanted) and reap it."""
        if self._pid:
            os.kill(self._pid, signal.SIGKILL)
            self._reap()

    def cancel_after(self, grace_seconds: float) -> None:
        """:meth:`cancel`, after up to ``grace_seconds`` in which the child may leave by itself:
        after a Ctrl-C, which reached it too, it unwinds and stops (and reaps) any child of its
        own, where a kill now would leave that one to the init process."""
        deadline = time.monotonic() + grace_seconds
        while self._pid and time.monotonic() < deadline:
            if os.waitpid(self._pid, os.WNOHANG)[0]:      # gone and reaped: never killed or reaped again
                os.close(self._read)
                self._pid, self._read = 0, -1
                return
            time.sleep(0.005)
        self.cancel()

    def _reap(self) -> None:
        if self._pid:
            os.close(self._read)
            os.waitpid(self._pid, 0)
            self._pid, self._read = 0, -1


class Beside(Generic[T]):
    """``job()`` started in a forked child (or deferred, without a spare core); :meth:`result`
    returns its value, computing it here when the child could not (:class:`BesideEach` of
    one job)."""

    def __init__(self, job: Callable[[], T]) -> None:
        self._each = BesideEach([job])

    @property
    def forked(self) -> bool:
        """Whether the job runs in a child now (else :meth:`result` will compute it here)."""
        return self._each.forked

    def ready(self) -> bool:
        """Whether :meth:`result` would return without waiting for the child (true when there
        is none: the job then runs when asked)."""
        return self._each.ready(0)

    def cancel(self) -> None:
        """Stop the child (its result is not wanted) and reap it."""
        self._each.cancel()

    def result(self) -> T:
        return self._each.result(0)


_FRAME = struct.Struct("<Q")        # a result's length in bytes, before its pickle


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, size: int) -> bytes:
    """``size`` bytes from ``fd``, fewer only at its end (a pipe returns what it holds)."""
    parts, left = [], size
    while left > 0:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _widen(fd: int, size: int) -> None:
    """Make pipe ``fd`` hold ``size`` bytes where the system allows it (Linux); else the
    writer waits for the reader, which is slower, never wrong."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except (ImportError, AttributeError, OSError):
        pass
