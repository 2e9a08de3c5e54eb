"""Random ops in forward, end to end on 3 uneven gloo ranks (slow).

tests/e2e/families/random_masking.py draws MAE's masking noise (``torch.rand(B, L)`` then
``argsort`` and ``gather``), two drop paths (``torch.rand(B, 1, 1) < keep`` and timm's
``new_empty(...).bernoulli_(keep)``), ``randn_like`` noise and a ``bernoulli`` mask. Compiled
for three CPU devices of different speeds (``hapc compile``, and two baselines whose plans
draw pieces: data parallel shards the batch, Megatron the features) and run with
``--verify``: every draw must equal the one-device reference's. A program whose reference
does not replay the draws must fail, or the check proves nothing.

Run: ``.venv/bin/python -m pytest -q -m slow tests/e2e/test_random_ops.py -s`` (``-s`` prints
the verify lines).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

import hapc
from costmodel.cluster import load_cluster
from hapc.cli import main
from hapc.codegen import emit
from synth.baselines import baseline_program
from tests.runs import torchrun, verify_line

pytestmark = pytest.mark.slow

MODEL = Path(__file__).resolve().parent / "families" / "random_masking.py"
UNEVEN = {"name": "cpu3-uneven", "nodes": [{
    "devices": [{"name": f"cpu{i}", "tflops": t, "memory_GB": 8, "hbm_GBps": 20, "count": 1}
                for i, t in enumerate([0.3, 0.2, 0.1])],
    "intra_link": "loopback"}]}


def _program(how: str, tmp_path: Path) -> Path:
    """program.py for the model: ``hapc compile`` (how == "compile") or a baseline by name."""
    if how == "compile":
        cluster = tmp_path / "cpu3-uneven.yaml"
        cluster.write_text(yaml.safe_dump(UNEVEN))
        assert main(["compile", str(MODEL), "--cluster", str(cluster), "-o", str(tmp_path / "out"), "--quiet"]) == 0
        return tmp_path / "out" / "program.py"
    sys.path.insert(0, str(MODEL.parent))
    import random_masking

    torch.manual_seed(0)
    traced = hapc.trace(random_masking.model(), random_masking.inputs())
    program = baseline_program(how, traced.graph, load_cluster(UNEVEN))
    return Path(emit(program, str(MODEL), str(tmp_path), constants=traced.constants))


@pytest.mark.parametrize("how, sharded", [("compile", None), ("dp-flops", "S(0)"), ("megatron-tp", "S(2)")])
def test_random_draws_verify_on_three_uneven_ranks(how, sharded, tmp_path):
    path = _program(how, tmp_path)
    text = path.read_text()
    assert "R.random_piece(rt.ctx('rand')" in text and "aten.rand.default(" not in text
    if sharded:                       # a random op drawn piece by piece, not whole and sliced
        assert f"# aten.randn_like.default -> {sharded}" in text
    proc = torchrun(path, 3, "--verify", "--steps", "2")
    line = verify_line(proc)
    assert line.startswith("verify: ok") and proc.returncode == 0, line + proc.stderr[-3000:]
    print(how, line)
    assert float(line.split("max_abs_err=")[1]) < 1e-5


def test_a_reference_that_does_not_replay_the_draws_fails_verify(tmp_path):
    path = _program("dp-flops", tmp_path)
    runtime = path.parent / "hapc_random_ops.py"
    text = runtime.read_text()
    off = text.replace("        if self._paused or op not in RANDOM_OPS:\n", "        if True:\n")
    assert off != text
    runtime.write_text(off)
    proc = torchrun(path, 3, "--verify", "--steps", "1")
    assert verify_line(proc).startswith("verify: FAILED") and proc.returncode != 0
