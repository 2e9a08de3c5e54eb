"""Running work in a forked child on a spare core while this process does other work: the one
module in hapc that calls ``os.fork``.

A fork shares the parent's memory (the graph, the cached strategies) without copying or
pickling it; only the child's results come back, pickled. Its users:

* :class:`BesideEach`: ``hapc replan`` searches the new cluster under two overlap assumptions
  in one child, each result sent back as soon as it is made (:mod:`hapc.elastic.replan`); a cold
  ``hapc compile`` traces the model in a child forked before torch is imported
  (:mod:`hapc.frontend.cache.child`);
* :class:`Beside`: one job, such as the export of 3 blocks beside the 2-block export
  (:mod:`hapc.frontend.blocktrace`) or writing a trace-cache entry while the compile plans
  (:mod:`hapc.frontend.cache.cached_trace`);
* :class:`hapc.process.sharedjobs.SharedJobs`: a list of jobs worked from both ends, by the
  child and by this process (the stage planner's device groups), built on this module's parts.

Those parts are one routine each: whether to fork (:func:`spare_core`,
:func:`single_threaded`), forking a child that runs a function and leaves with ``os._exit``
(:meth:`Child.fork`), the pipe's framing (:func:`send`, :meth:`Child.receive`,
:meth:`Child.receive_message`), pickling (:func:`pickled`, :func:`unpickled`) and reaping
(:meth:`Child.end`). Where there is no spare core, no ``fork`` (Windows), or ``HAPC_SERIAL`` is
set in the environment, or the child fails in any way, the jobs simply run here: the results
are the same either way, only the wall time differs.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from hapc.process.collector import gc_frozen_for_fork

T = TypeVar("T")

_FRAME = struct.Struct("<Q")        # the number before each message: a payload's length, or a job's place


def spare_core() -> bool:
    """Whether a child process could run beside this one on a core of its own."""
    if os.environ.get("HAPC_SERIAL") or not hasattr(os, "fork"):
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        cores = os.cpu_count() or 1
    return cores >= 2


def single_threaded() -> bool:
    """Whether this process runs no Python thread but this one. A forked child gets only the
    thread that forked, so a lock another thread held at the fork (a notebook's threads, a
    logging handler's) would never be released in it: fork only when this holds."""
    return threading.active_count() == 1


# ---- the parts every runner shares ----------------------------------------------------------------

def send(fd: int, number: int, payload: bytes = b"") -> None:
    """Write ``number`` (a payload's length, or a job's place) and then ``payload`` to pipe
    ``fd``, whole, in one piece: the reader sees either none of it or its start."""
    _write_all(fd, _FRAME.pack(number) + payload)


def pickled(value: Any) -> bytes:
    """``value`` as the bytes a child sends back."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def unpickled(payload: bytes) -> tuple[Any] | None:
    """``(value,)`` from :func:`pickled` bytes, or None where they are garbled (the job then
    runs here)."""
    try:
        return (pickle.loads(payload),)
    except Exception:       # noqa: BLE001 - any failure means: not trusted
        return None


class Child:
    """A forked child as its parent sees it: its process id and the read end of the pipe it
    writes to. :meth:`end` closes the pipe and reaps the child; nothing else does."""

    def __init__(self, pid: int, read: int) -> None:
        self.pid = pid
        self._read = read

    @classmethod
    def fork(cls, run: Callable[[int], object], *, pipe_bytes: int = 0, frozen_heap: bool = False) -> Child:
        """Fork a child that calls ``run(fd)`` with the write end of a new pipe and then leaves
        with ``os._exit(0)``, also when ``run`` raises: no atexit handlers, no flushing of the
        buffers it shares with this process, no traceback (the parent runs whatever the child
        did not send). ``pipe_bytes`` widens the pipe so that the child need not wait for the
        parent to read (:func:`_widen`); ``frozen_heap`` keeps the collector's young
        generations in both processes clear of the objects alive at the fork
        (:func:`hapc.process.collector.gc_frozen_for_fork`)."""
        read, write = os.pipe()
        if pipe_bytes:
            _widen(write, pipe_bytes)
        if frozen_heap:
            with gc_frozen_for_fork():
                pid = os.fork()
        else:
            pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                run(write)
            finally:
                os._exit(0)
        os.close(write)
        return cls(pid, read)

    def ready(self) -> bool:
        """Whether the child's next message (or its end) can be read without waiting."""
        readable, _, _ = select.select([self._read], [], [], 0)
        return bool(readable)

    def receive(self) -> int | None:
        """The next number the child sent (waiting for it), or None where it ended first."""
        head = _read_exactly(self._read, _FRAME.size)
        return _FRAME.unpack(head)[0] if len(head) == _FRAME.size else None

    def receive_message(self) -> bytes | None:
        """The next payload the child sent after its length (waiting for it), or None where it
        ended before sending one whole."""
        size = self.receive()
        if not size:
            return None
        payload = _read_exactly(self._read, size)
        return payload if len(payload) == size else None

    def exited(self) -> bool:
        """Whether the child has ended by itself; if so it is reaped and its pipe closed now."""
        if not os.waitpid(self.pid, os.WNOHANG)[0]:
            return False
        os.close(self._read)
        return True

    def end(self, *, kill: bool = False, beside: bool = False) -> None:
        """Close the pipe and reap the child (killing it first with ``kill``). With ``beside``
        the reaping is left to a thread: tearing down a forked copy of a large heap takes the
        kernel a while, which this process need not wait for."""
        if kill:
            os.kill(self.pid, signal.SIGKILL)
        os.close(self._read)
        if beside:
            threading.Thread(target=_reap, args=(self.pid,), name="hapc-reap", daemon=True).start()
        else:
            _reap(self.pid)


def _reap(pid: int) -> None:
    """Wait for a child to end (quietly, should something else have reaped it)."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


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


# ---- results sent through the pipe ------------------------------------------------------------------

class BesideEach(Generic[T]):
    """``jobs`` run one after another in one forked child (or, without a spare core, here when
    asked), each result sent back as soon as it is made. :meth:`result` of a job the child
    did not send (it failed, or sent something garbled) computes that job, and the ones
    after it, here."""

    # A result waits in the pipe until the parent reads it. A pipe holds 64 KiB by default, less
    # than a search's pickled program: the child would stop until the parent reads.
    PIPE_BYTES = 1 << 20

    def __init__(self, jobs: Sequence[Callable[[], T]]) -> None:
        self._jobs = list(jobs)
        self._results: list[T] = []
        self._child: Child | None = None
        if spare_core():
            self._child = Child.fork(self._run_all, pipe_bytes=self.PIPE_BYTES)

    def _run_all(self, fd: int) -> None:
        """In the child: run each job and send its result; a failed job ends the child (the
        parent then runs it and the rest)."""
        for job in self._jobs:
            payload = pickled(job())
            send(fd, len(payload), payload)

    @property
    def forked(self) -> bool:
        """Whether a child runs the jobs now (else :meth:`result` computes each here)."""
        return self._child is not None

    @property
    def pid(self) -> int:
        """The child's process id while it runs, else 0."""
        return self._child.pid if self._child is not None else 0

    def ready(self, index: int) -> bool:
        """Whether :meth:`result` of job ``index`` would return without waiting for the child:
        it was received, it is the next one and its bytes wait in the pipe, or there is no
        child (the job then runs when asked)."""
        if self._child is None or index < len(self._results):
            return True
        if index > len(self._results):
            return False
        return self._child.ready()          # the child writes a result whole, once it is made

    def result(self, index: int) -> T:
        """Job ``index``'s value; the ones before it are received (or computed) first. After
        the last one the child, done, is reaped."""
        while len(self._results) <= index:
            self._results.append(self._next())
        if len(self._results) == len(self._jobs):
            self._end()
        return self._results[index]

    def _next(self) -> T:
        k = len(self._results)
        if self._child is not None:
            payload = self._child.receive_message()
            got = unpickled(payload) if payload is not None else None
            if got is not None:
                return got[0]
            self._end()                 # the child stopped early: this job and the rest run here
        return self._jobs[k]()

    def cancel(self) -> None:
        """Stop the child (its results are not wanted) and reap it."""
        self._end(kill=True)

    def cancel_after(self, grace_seconds: float) -> None:
        """:meth:`cancel`, after up to ``grace_seconds`` in which the child may leave by itself:
        after a Ctrl-C, which reached it too, it unwinds and stops (and reaps) any child of its
        own, where a kill now would leave that one to the init process."""
        deadline = time.monotonic() + grace_seconds
        while self._child is not None and time.monotonic() < deadline:
            if self._child.exited():             # gone and reaped: never killed or reaped again
                self._child = None
                return
            time.sleep(0.005)
        self.cancel()

    def _end(self, *, kill: bool = False) -> None:
        if self._child is not None:
            self._child.end(kill=kill)
            self._child = None


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

    @property
    def pid(self) -> int:
        """The child's process id while it runs, else 0."""
        return self._each.pid

    def ready(self) -> bool:
        """Whether :meth:`result` would return without waiting for the child (true when there
        is none: the job then runs when asked)."""
        return self._each.ready(0)

    def cancel(self) -> None:
        """Stop the child (its result is not wanted) and reap it."""
        self._each.cancel()

    def result(self) -> T:
        return self._each.result(0)
