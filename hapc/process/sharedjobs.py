"""A list of independent jobs shared between this process and a forked child on the spare core.

The stage planner searches and prices a program per device group (eight on HAP's 8 devices),
each independent of the others. The child starts at the front of the list before the one-stage
search and sends each result back as it finishes; once this process is free it works from the
back of the list, and when the two meet the child is stopped. So neither core idles while jobs
are left, whichever finishes its own work first. Results come back pickled into files of a
private temporary folder (a pipe would hold the child at its first result while this process is
busy), each announced through the child's pipe once written. Where this process would wait for
the child's last job, the caller's ``while_waiting`` work runs instead (the stage planner builds
its DP's arcs of the groups come so far); the stopped child is reaped by a thread.

The fork, the pipe, pickling and reaping are :mod:`hapc.process.fork`'s. Where there is no spare
core (:func:`hapc.process.fork.spare_core`: one core, no ``fork``, or ``HAPC_SERIAL`` set), or
the child fails in any way, the jobs simply run here: the results are the same either way, only
the wall time differs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from hapc.process.fork import Child, pickled, send, spare_core, unpickled


class SharedJobs:
    """``jobs`` started in a forked child (front first); :meth:`results` finishes them here from
    the back and returns every result in list order."""

    def __init__(self, jobs: Sequence[Callable[[], Any]]) -> None:
        self._jobs = list(jobs)
        self.from_child = 0                  # results the child sent (for counts and benches)
        self.wait_seconds = 0.0              # time this process waited for them
        self._child: Child | None = None
        self._folder = ""
        if not self._jobs or not spare_core():
            return
        self._folder = tempfile.mkdtemp(prefix="hapc-groups-")
        # Objects alive now stay out of the child's young collections: a collection there
        # would touch (and so copy) the pages of the parent's heap it visits.
        self._child = Child.fork(self._run_all, frozen_heap=True)

    def _run_all(self, fd: int) -> None:
        """In the child: run the jobs front first, each result written to its file and then
        announced by its place in the list; a failed job ends the child (the parent runs what
        is missing)."""
        for at, job in enumerate(self._jobs):
            path = self._path(at)
            with open(path + ".part", "wb") as out:
                out.write(pickled(job()))
            os.replace(path + ".part", path)
            send(fd, at)

    @property
    def forked(self) -> bool:
        """Whether a child took jobs (else :meth:`results` runs them all here)."""
        return self._child is not None

    @property
    def pid(self) -> int:
        """The child's process id while it runs, else 0."""
        return self._child.pid if self._child is not None else 0

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
            if self._child is not None and (next_back == len(done) or self._child.ready()):
                if while_waiting is not None and next_back == len(done) and not self._child.ready():
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

    def _receive(self) -> tuple[Any] | None:
        """The child's next result (waiting for it), or None at its end or on garbage."""
        at = self._child.receive()
        if at is None:
            return None
        try:
            with open(self._path(at), "rb") as result:
                payload = result.read()
        except (OSError, ValueError):         # no such file: a garbled announcement
            return None
        return unpickled(payload)

    def _path(self, at: int) -> str:
        return os.path.join(self._folder, f"{at}.pickle")

    def _stop(self) -> None:
        if self._child is not None:
            self._child.end(kill=True, beside=True)
            self._child = None
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = ""
