"""hapc.frontend.torchimport: the command line imports torch for a trace with the collector paused and
then frozen, and leaves a caller's choice to keep the collector off alone. Each case needs a
process that has not imported torch yet."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = ("import gc, sys\n{before}\nfrom hapc.frontend.torchimport import import_for_tracing\n"
         "import_for_tracing()\n"
         "print(gc.isenabled(), gc.get_freeze_count() > 0, 'torch.export._trace' in sys.modules)")


def _probe(before: str) -> str:
    run = subprocess.run([sys.executable, "-c", PROBE.format(before=before)], capture_output=True, text=True,
                         check=True)
    return run.stdout.strip()


@pytest.mark.slow
def test_imports_then_freezes_with_the_collector_back_on():
    assert _probe("") == "True True True"


@pytest.mark.slow
def test_a_collector_turned_off_stays_off_and_nothing_is_frozen():
    assert _probe("gc.disable()") == "False False True"
