"""A list of independent jobs shared between this process and a forked child on the spare core.

The stage planner searches and prices a program per device group (eight on HAP's 8 devices),
each independent of the others. The child starts at the front of the list before the one-stage
search and sends each result back as it finishes; once this process is free it works from the
back of the list, and when the two meet the child is stopped. So neither core idles while jobs
are left, whichever finishes its own work first. A fork shares the parent's memory without
copying or pickling it; only results come back, pickled into files of a private temporary
folder (a pipe would hold the child at its first result while this process is busy), each
announced through a pipe once written. Where this process would wait for the child's last job,
the caller's ``while_waiting`` work runs instead (the stage planner builds its DP's arcs of the
groups come so far); the stopped child is reaped by a thread, since tearing down the copy of a
large heap takes the kernel ~10 ms.

Where there is no spare core (:func:`hapc.process.forked.spare_core`: one core, no ``fork``, or
``HAPC_SERIAL`` set), or the child fails in any way, the jobs simply run here: the results are
the same either way, only the wall time differs.
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import shutil
import signal
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from hapc.process.forked import spare_core

_LENGTH = struct.Struct("<Q")


class SharedJobs:
    """``jobs`` started in a forked child (front first); :meth:`results` finishes them here from
    the back and returns every result in list order."""

    def __init__(self, jobs: Sequence[Callable[[], Any]]) -> None:

        self._jobs = list(jobs)
        self.from_child = 0                  # results the child sent (for counts and benches)
        self.wait_seconds = 0.0              # time this process waited for them
        self._pid = 0
        self._read = -1
        self._folder = ""
        if not self._jobs or not spare_core():
            return
        self._folder = tempfile.mkdtemp(prefix="hapc-groups-")
        read, write = os.pipe()
        # Objects alive now stay out of the child's garbage collections: a collection there
        # would touch (and so copy) every page of the parent's heap.
        gc.freeze()
        try:
            pid = os.fork()
        finally:
            gc.unfreeze()
        if pid == 0:                                     # the child: run, send each, leave at once
            os.close(read)
            try:
                with os.fdopen(write, "wb") as pipe:
                    for at, job in enumerate(self._jobs):
                        path = self._path(at)
                        with open(path + ".part", "wb") as out:
                            pickle.dump(job(), out, protocol=pickle.HIGHEST_PROTOCOL)
                        os.replace(path + ".part", path)
                        pipe.write(_LENGTH.pack(at))
                        pipe.flush()
            except BaseException:                       # noqa: BLE001 - the parent runs what is missing
                pass
            os._exit(0)                                 # no atexit handlers, no flushing the parent's buffers
        os.close(write)
        self._pid, self._read = pid, read

    @property
    def forked(self) -> bool:
        """Whether a child took jobs (else :meth:`results` runs them all here)."""
        return self._pid != 0

    def results(self, while_waiting: Callable[[dict[int, Any]], None] | None = None) -> list[Any]:
        """Every job's result, in list order: the child's as they arrive, the rest run here from
        the back of the list while none is waiting.

        ``while_waiting``, when given, is called instead of idling each time this process would
        wait for the child's current job, with the results come since the last call (by their
        place in the list): work that needs them can start there."""
        try:
            return self._results(while_waiting)
        finally:
            self._stop()                      # also when a job or while_waiting raised

    def _results(self, while_waiting: Callable[[dict[int, Any]], None] | None) -> list[Any]:
        done: list[Any] = []
        back: list[Any] = []                  # run here, last job first
        handed = [0, 0]                       # results of each end given to while_waiting so far
        while len(done) + len(back) < len(self._jobs):
            next_back = len(self._jobs) - 1 - len(back)
            # The child runs job len(done) now: wait for it rather than start it again here.
            if self._pid and (next_back == len(done) or self._ready()):
                if while_waiting is not None and next_back == len(done) and not self._ready():
                    fresh = {at: done[at] for at in range(handed[0], len(done))}
                    fresh.update({len(self._jobs) - 1 - k: back[k] for k in range(handed[1], len(back))})
                    handed = [len(done), len(back)]
                    if fresh:
                        while_waiting(fresh)
                started = time.perf_counter()
                got = self._receive()
                self.wait_seconds += time.perf_counter() - started
                if got is not None:
                    done.append(got[0])
                    self.from_child += 1
                    continue
                self._stop()                  # the child ended early: the rest run here
            back.append(self._jobs[next_back]())
        return done + back[::-1]

    def cancel(self) -> None:
        """Stop the child (its results are not wanted)."""
        self._stop()

    def _ready(self) -> bool:
        readable, _, _ = select.select([self._read], [], [], 0)
        return bool(readable)

    def _receive(self) -> tuple[Any] | None:
        """The child's next result (waiting for it), or None at its end or on garbage."""
        head = b""
        while len(head) < _LENGTH.size:
            chunk = os.read(self._read, _LENGTH.size - len(head))
            if not chunk:
                return None
            head += chunk
        try:
            with open(self._path(_LENGTH.unpack(head)[0]), "rb") as result:
                return (pickle.load(result),)
        except Exception:       # noqa: BLE001 - a garbled result: run it here instead
            return None

    def _path(self, at: int) -> str:
        return os.path.join(self._folder, f"{at}.pickle")

    def _stop(self) -> None:
        if self._pid:
            os.kill(self._pid, signal.SIGKILL)
            os.close(self._read)
            # Reaped beside: the kernel takes ~10 ms to tear down a forked copy of a large heap,
            # which this process need not wait for.
            threading.Thread(target=_reap, args=(self._pid,), name="hapc-reap", daemon=True).start()
            self._pid = 0
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = ""


def _reap(pid: int) -> None:
    """Wait for a stopped child to end (quietly, should something else have reaped it)."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
