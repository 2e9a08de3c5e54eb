"""A list of independent jobs shared between this process and a forked child on the spare core.

The stage planner searches and prices a program per device group (eight on HAP's 8 devices),
each independent of the others. The child starts at the front of the list before the one-stage
search and sends each result back as it finishes; once this process is free it works from the
back of the list, and when the two meet the child is stopped. So neither core idles while jobs
are left, whichever finishes its own work first. A fork shares the parent's memory without
copying or pickling it; only results come back, pickled through a pipe.

Where there is no spare core (:func:`hapc.forked.spare_core`: one core, no ``fork``, or
``HAPC_SERIAL`` set), or the child fails in any way, the jobs simply run here: the results are
the same either way, only the wall time differs.
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

_LENGTH = struct.Struct("<Q")


class SharedJobs:
    """``jobs`` started in a forked child (front first); :meth:`results` finishes them here from
    the back and returns every result in list order."""

    def __init__(self, jobs: Sequence[Callable[[], Any]]) -> None:
        from hapc.forked import spare_core      # a stdlib-only helper; no layer above synth

        self._jobs = list(jobs)
        self.from_child = 0                  # results the child sent (for counts and benches)
        self.wait_seconds = 0.0              # time this process waited for them
        self._pid = 0
        self._read = -1
        if not self._jobs or not spare_core():
            return
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
                    for job in self._jobs:
                        payload = pickle.dumps(job(), protocol=pickle.HIGHEST_PROTOCOL)
                        pipe.write(_LENGTH.pack(len(payload)) + payload)
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

    def results(self) -> list[Any]:
        """Every job's result, in list order: the child's as they arrive, the rest run here from
        the back of the list while none is waiting."""
        done: list[Any] = []
        back: list[Any] = []                  # run here, last job first
        while len(done) + len(back) < len(self._jobs):
            next_back = len(self._jobs) - 1 - len(back)
            # The child runs job len(done) now: wait for it rather than start it again here.
            if self._pid and (next_back == len(done) or self._ready()):
                started = time.perf_counter()
                got = self._receive()
                self.wait_seconds += time.perf_counter() - started
                if got is not None:
                    done.append(got[0])
                    self.from_child += 1
                    continue
                self._stop()                  # the child ended early: the rest run here
            back.append(self._jobs[next_back]())
        self._stop()
        return done + back[::-1]

    def cancel(self) -> None:
        """Stop the child (its results are not wanted)."""
        self._stop()

    def _ready(self) -> bool:
        readable, _, _ = select.select([self._read], [], [], 0)
        return bool(readable)

    def _receive(self) -> tuple[Any] | None:
        """One result from the child (waiting for all of it), or None at its end or on garbage."""
        head = self._read_exactly(_LENGTH.size)
        if head is None:
            return None
        payload = self._read_exactly(_LENGTH.unpack(head)[0])
        if payload is None:
            return None
        try:
            return (pickle.loads(payload),)
        except Exception:       # noqa: BLE001 - a garbled result: run it here instead
            return None

    def _read_exactly(self, size: int) -> bytes | None:
        parts, left = [], size
        while left:
            chunk = os.read(self._read, min(left, 1 << 20))
            if not chunk:
                return None
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def _stop(self) -> None:
        if self._pid:
            os.kill(self._pid, signal.SIGKILL)
            os.close(self._read)
            os.waitpid(self._pid, 0)
            self._pid = 0
