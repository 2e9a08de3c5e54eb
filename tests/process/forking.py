"""The fork path of hapc.process, taken whatever this machine's cores: on one core (or with
HAPC_SERIAL) jobs would run in this process and the child's side would go untested."""

from __future__ import annotations

import os

import pytest

from hapc.process import fork, sharedjobs


@pytest.fixture
def child_forks(monkeypatch):
    """Fork as on a machine with a spare core (the child then shares a core: slower, as correct)."""
    if not hasattr(os, "fork"):
        pytest.skip("no os.fork on this platform")
    monkeypatch.delenv("HAPC_SERIAL", raising=False)
    monkeypatch.setattr(fork, "spare_core", lambda: True)
    monkeypatch.setattr(sharedjobs, "spare_core", lambda: True)
