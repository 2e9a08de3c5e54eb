"""The fork path of hapc.process, taken whatever this machine's cores: on one core (or with
HAPC_SERIAL) jobs would run in this process and the child's side would go untested."""

from __future__ import annotations

import os

import pytest

from hapc.process import fork, sharedjobs


@pytest.fixture
def child_forks(monkeypatch):
    """Fork as on a machine with a spare core (the child then shares a core: slower, as correct);
    a test that sets ``HAPC_SERIAL`` still gets the serial path."""
    if not hasattr(os, "fork"):
        pytest.skip("no os.fork on this platform")
    monkeypatch.delenv("HAPC_SERIAL", raising=False)

    def spare_core() -> bool:
        return not os.environ.get("HAPC_SERIAL")

    monkeypatch.setattr(fork, "spare_core", spare_core)
    monkeypatch.setattr(sharedjobs, "spare_core", spare_core)
