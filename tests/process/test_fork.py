"""Work run in a forked child (hapc/process/fork.py): values come back whole, a child that fails
or is not wanted leaves nothing behind and its jobs run here, and no other module forks."""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import pytest

from hapc.process.fork import Beside, BesideEach, Child, send, unpickled
from tests.process.forking import child_forks  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]


# ---- one job beside (Beside) ------------------------------------------------------------------

@pytest.mark.usefixtures("child_forks")
def test_a_job_beside_runs_in_a_child_and_returns_its_value():
    parent = os.getpid()
    got = Beside(lambda: (os.getpid(), [1.5, {"x": (2, 3)}])).result()
    assert got[0] != parent and got[1] == [1.5, {"x": (2, 3)}]


def test_a_job_beside_runs_here_when_serial_and_its_errors_surface_here(monkeypatch):
    def fails():
        raise ValueError(f"raised in {os.getpid()}")

    with pytest.raises(ValueError, match=f"raised in {os.getpid()}"):     # run again here, the error seen here
        Beside(fails).result()
    monkeypatch.setenv("HAPC_SERIAL", "1")
    assert Beside(os.getpid).result() == os.getpid()


@pytest.mark.usefixtures("child_forks")
def test_a_job_beside_that_is_not_wanted_is_stopped_and_reaped():
    job = Beside(lambda: time.sleep(60))
    pid = job.pid
    started = time.perf_counter()
    job.cancel()
    assert time.perf_counter() - started < 10 and not job.forked and job.pid == 0
    with pytest.raises(ChildProcessError):        # reaped: no zombie left behind
        os.waitpid(pid, 0)


@pytest.mark.usefixtures("child_forks")
def test_a_job_beside_says_when_its_result_is_ready():
    job = Beside(lambda: time.sleep(0.5) or "done")
    assert job.forked and not job.ready()          # the child is still sleeping
    deadline = time.perf_counter() + 30
    while not job.ready() and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert job.ready() and job.result() == "done" and not job.forked


# ---- jobs one after another beside, each result sent when made (BesideEach) -----------------------

@pytest.mark.usefixtures("child_forks")
def test_jobs_beside_come_back_one_by_one_as_each_is_made():
    parent = os.getpid()
    jobs = BesideEach([lambda: (os.getpid(), "x" * 300_000), lambda: time.sleep(0.5) or "second"])
    child, big = jobs.result(0)
    assert child != parent and big == "x" * 300_000    # larger than a default pipe: the child never stalled
    assert jobs.forked and not jobs.ready(1)               # the second is still sleeping
    assert jobs.result(1) == "second" and not jobs.forked  # the child, done, is reaped
    assert jobs.result(0)[1] == big


def test_a_job_that_fails_in_the_child_runs_here_with_the_ones_after_it(monkeypatch):
    parent = os.getpid()

    def fails_in_a_child():
        if os.getpid() != parent:
            raise RuntimeError("child only")
        return "here"

    jobs = BesideEach([os.getpid, fails_in_a_child, os.getpid])
    forked = jobs.forked
    assert (jobs.result(0) != parent) == forked
    assert jobs.result(1) == "here" and jobs.result(2) == parent and not jobs.forked
    monkeypatch.setenv("HAPC_SERIAL", "1")
    ran: list[int] = []
    serial = BesideEach([lambda: ran.append(0) or 0, lambda: ran.append(1) or 1])
    assert not serial.forked and ran == [] and serial.ready(1)      # nothing runs until asked
    assert serial.result(1) == 1 and ran == [0, 1]


@pytest.mark.usefixtures("child_forks")
def test_a_child_that_leaves_by_itself_within_the_grace_is_reaped_not_killed():
    jobs = BesideEach([lambda: os._exit(0)])        # gone without sending anything
    pid = jobs.pid
    jobs.cancel_after(10)
    assert not jobs.forked
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)


# ---- the parts: the child, its pipe, pickling ------------------------------------------------------

def test_a_child_sends_framed_messages_and_leaves_quietly_when_it_raises(capfd):
    def run(fd: int) -> None:
        send(fd, 3, b"abc")
        send(fd, 7)
        send(fd, 10, b"short")                    # a message cut off: the child ends within it
        raise RuntimeError("raised in the child")

    child = Child.fork(run)
    assert child.receive_message() == b"abc"
    assert child.receive() == 7
    assert child.receive_message() is None        # not sent whole: not trusted
    assert child.receive() is None                # the child's end
    deadline = time.monotonic() + 30
    while not child.exited() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(ChildProcessError):        # reaped by exited()
        os.waitpid(child.pid, 0)
    assert "raised in the child" not in capfd.readouterr().err     # os._exit: no traceback


def test_garbled_bytes_unpickle_to_nothing():
    assert unpickled(b"not a pickle") is None
    assert unpickled(b"") is None


# ---- one module forks ----------------------------------------------------------------------------

def forking_lines(source: str) -> list[int]:
    """The lines of Python ``source`` that fork: ``os.fork``/``os.forkpty`` (or ``posix.``), or
    either imported from ``os``/``posix``. Text that only names them (a docstring, a
    ``hasattr(os, "fork")``) does not count."""
    names = ("fork", "forkpty")
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name)
                and node.value.id in ("os", "posix")):
            lines.append(node.lineno)
        elif (isinstance(node, ast.ImportFrom) and node.module in ("os", "posix")
                and any(alias.name in names for alias in node.names)):
            lines.append(node.lineno)
    return lines


def test_the_check_sees_a_fork_and_only_a_fork():
    assert forking_lines("import os\n\ndef f():\n    return os.fork()\n") == [4]
    assert forking_lines("from os import fork as split\nsplit()\n") == [1]
    assert forking_lines("import posix\nposix.forkpty()\n") == [2]
    assert forking_lines('"""Calls os.fork."""\nimport os\nhasattr(os, "fork")\nos.forked = 1\n') == []


def test_only_hapc_process_fork_forks():
    forking = {}
    for folder in ("hapc", "synth", "costmodel", "profiler"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = forking_lines(path.read_text())
            if lines:
                forking[str(path.relative_to(ROOT))] = lines
    assert list(forking) == ["hapc/process/fork.py"], forking
