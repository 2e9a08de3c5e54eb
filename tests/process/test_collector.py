"""The cyclic garbage collector paused and frozen (hapc/process/collector.py): each helper leaves
the collector as it found it, or as it promises, also on error. Cases that freeze run in a fresh
interpreter, so that this process's heap is left alone."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hapc.process.collector import gc_paused

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> list[str]:
    """The lines ``code`` prints in a fresh interpreter that can import hapc."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_gc_paused_restores_the_previous_state_also_on_error():
    was = gc.isenabled()
    try:
        gc.enable()
        with pytest.raises(ValueError), gc_paused():
            assert not gc.isenabled()
            with gc_paused():
                pass
            assert not gc.isenabled()          # an inner pause does not end the outer one
            raise ValueError
        assert gc.isenabled()
        gc.disable()
        with gc_paused():
            pass
        assert not gc.isenabled()              # off before, off after
    finally:
        (gc.enable if was else gc.disable)()


def test_gc_paused_then_frozen_freezes_only_where_the_collector_was_on():
    code = ("import gc\nfrom hapc.process.collector import gc_paused\n"
            "with gc_paused(freeze_after=True):\n    made = [[] for _ in range(100)]\n"
            "print(gc.isenabled(), gc.get_freeze_count() >= 100)\n"
            "gc.unfreeze(); gc.disable()\n"
            "with gc_paused(freeze_after=True):\n    made = [[] for _ in range(100)]\n"
            "print(gc.isenabled(), gc.get_freeze_count())\n")
    assert _run(code) == ["True", "True", "False", "0"]


def test_gc_frozen_freezes_inside_and_leaves_an_earlier_freeze_alone():
    code = ("import gc\nfrom hapc.process.collector import gc_frozen\n"
            "with gc_frozen():\n    print(gc.get_freeze_count() > 0)\n"
            "print(gc.get_freeze_count())\n"
            "gc.freeze(); before = gc.get_freeze_count()\n"
            "with gc_frozen():\n    made = [[] for _ in range(100)]\n    print(gc.get_freeze_count() == before)\n"
            "print(gc.get_freeze_count() == before)\n")
    assert _run(code) == ["True", "0", "True", "True"]


def test_gc_frozen_for_fork_freezes_inside_and_nothing_after():
    code = ("import gc\nfrom hapc.process.collector import gc_frozen_for_fork\n"
            "gc.freeze()\n"
            "with gc_frozen_for_fork():\n    print(gc.get_freeze_count() > 0)\n"
            "print(gc.get_freeze_count())\n")
    assert _run(code) == ["True", "0"]


AT_EXIT = """\
import atexit, gc
from hapc.process.collector import freeze_at_exit
atexit.register(lambda: print(gc.get_freeze_count() > 0))   # the last to run: after those registered later
{calls}
"""


def test_freeze_at_exit_freezes_the_heap_at_exit():
    assert _run(AT_EXIT.format(calls="freeze_at_exit()")) == ["True"]
    assert _run(AT_EXIT.format(calls="")) == ["False"]


def test_freeze_at_exit_is_registered_once_however_often_called():
    """An unfreeze registered between two calls: at exit the one freeze (moved to the front by
    the second call) runs, then the unfreeze, and the heap is not frozen; a second registration
    (the control: ``gc.freeze`` registered again by hand) would freeze it again after that."""
    twice = "freeze_at_exit()\natexit.register(gc.unfreeze)\n{second}"
    assert _run(AT_EXIT.format(calls=twice.format(second="freeze_at_exit()"))) == ["False"]
    assert _run(AT_EXIT.format(calls=twice.format(second="atexit.register(gc.freeze)"))) == ["True"]
