"""Jobs shared with a forked child (hapc/process/sharedjobs.py): every result comes back in list
order, whoever ran it, and nothing is left behind."""

from __future__ import annotations

import os
import time

import pytest

from hapc.process.sharedjobs import SharedJobs
from tests.process.forking import child_forks  # noqa: F401 (a fixture)


def _job(i: int, seconds: float = 0.0):
    def run():
        time.sleep(seconds)
        return {"job": i, "pid": os.getpid(), "payload": list(range(20000))}    # bigger than a pipe holds
    return run


@pytest.mark.usefixtures("child_forks")
def test_results_come_back_in_order_from_both_ends():
    jobs = SharedJobs([_job(i, 0.05) for i in range(8)])
    assert jobs.forked
    time.sleep(0.3)                         # this process is busy elsewhere meanwhile
    out = jobs.results()
    assert [r["job"] for r in out] == list(range(8))
    assert all(r["payload"] == list(range(20000)) for r in out)
    assert 1 <= jobs.from_child <= 8
    assert {r["pid"] for r in out[:jobs.from_child]} == {r["pid"] for r in out[:1]} != {os.getpid()}
    assert all(r["pid"] == os.getpid() for r in out[jobs.from_child:])


def test_serial_and_failing_children_give_the_same_results(monkeypatch):
    expected = [r["job"] for r in SharedJobs([_job(i) for i in range(3)]).results()]
    calls = []

    def failing_in_child():
        if os.getpid() != parent:
            raise RuntimeError("only in the child")
        calls.append(1)
        return {"job": 1}

    parent = os.getpid()
    jobs = SharedJobs([_job(0), failing_in_child, _job(2)])
    assert [r["job"] for r in jobs.results()] == expected == [0, 1, 2]
    monkeypatch.setenv("HAPC_SERIAL", "1")
    serial = SharedJobs([_job(i) for i in range(3)])
    assert not serial.forked and [r["job"] for r in serial.results()] == [0, 1, 2]


@pytest.mark.usefixtures("child_forks")
def test_cancel_stops_the_child_and_removes_its_files():
    jobs = SharedJobs([_job(i, 0.5) for i in range(4)])
    folder, pid = jobs._folder, jobs.pid
    assert os.path.isdir(folder)
    jobs.cancel()
    assert not os.path.exists(folder) and not jobs.forked
    # The stopped child is reaped beside this process, not left a zombie.
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.exists(f"/proc/{pid}")


@pytest.mark.usefixtures("child_forks")
def test_work_waiting_for_the_child_gets_each_result_once_by_its_place():
    """``results(while_waiting=...)``: called when this process would wait for the child's
    current job, with the results come since the last call, keyed by their place in the list."""
    parent = os.getpid()

    def slow_in_child(i: int):
        def run():
            time.sleep(0.3 if os.getpid() != parent else 0.0)    # this process meets the child mid-job
            return {"job": i}
        return run

    handed: list[dict] = []
    jobs = SharedJobs([slow_in_child(i) for i in range(5)])
    out = jobs.results(while_waiting=lambda fresh: handed.append(dict(fresh)))
    assert [r["job"] for r in out] == list(range(5))
    assert handed, "this process waited for the child at least once"
    seen = [at for fresh in handed for at in fresh]
    assert len(seen) == len(set(seen)) and all(fresh for fresh in handed)
    assert all(fresh[at] is out[at] for fresh in handed for at in fresh)


@pytest.mark.usefixtures("child_forks")
def test_a_failing_waiting_work_stops_the_child_and_removes_its_files():
    parent = os.getpid()

    def slow_in_child():
        time.sleep(0.3 if os.getpid() != parent else 0.0)
        return 1

    jobs = SharedJobs([slow_in_child for _ in range(4)])
    folder = jobs._folder

    def fail(fresh):
        raise ValueError("while waiting")

    with pytest.raises(ValueError):
        jobs.results(while_waiting=fail)
    assert not jobs.forked and not os.path.exists(folder)
