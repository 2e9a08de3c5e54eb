"""Model families that trace-as-written gets wrong, end to end on real gloo ranks (slow).

* Hugging Face T5, BART, Whisper, Falcon and Mixtral at tiny configs (hidden 32, one layer):
  ``hapc compile`` (meta trace, synthesized plan) for a cluster of 3 CPU devices of different
  speeds, then ``torchrun --nproc_per_node=3 program.py --verify``. They exercise writes into
  fresh tensors (``shift_tokens_right``), a frozen parameter (Whisper's position table), list
  index constants (Falcon), and a ``transformers::`` custom op (Mixtral).
* Every pattern of tests/e2e/families/patterns.py and the ``torch.library`` custom-op model:
  emitted under an uneven data-parallel plan and verified on 3 ranks.

Run: ``.venv/bin/python -m pytest -q -m slow tests/e2e/test_families_encdec.py -s`` (``-s`` prints
the verify lines quoted in reports).
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

HERE = Path(__file__).resolve().parent
FAMILIES = HERE / "families"
sys.path.insert(0, str(FAMILIES))

from tests.runs import torchrun, verify_line  # noqa: E402

import patterns  # noqa: E402

pytestmark = pytest.mark.slow

UNEVEN = {"name": "cpu3-uneven", "nodes": [{
    "devices": [{"name": f"cpu{i}", "tflops": t, "memory_GB": 8, "hbm_GBps": 20, "count": 1}
                for i, t in enumerate([0.3, 0.2, 0.1])],
    "intra_link": "loopback"}]}


def _verified(proc) -> float:
    line = verify_line(proc)
    assert line.startswith("verify: ok") and proc.returncode == 0, line + proc.stderr[-3000:]
    print(line)
    return float(line.split("max_abs_err=")[1])


@pytest.mark.parametrize("family", ["t5", "bart", "whisper", "falcon", "mixtral"])
def test_hf_family_compiles_and_verifies_on_three_uneven_ranks(family, tmp_path, capsys):
    pytest.importorskip("transformers")
    cluster = tmp_path / "cpu3-uneven.yaml"
    cluster.write_text(yaml.safe_dump(UNEVEN))
    out = tmp_path / "out"
    rc = main(["compile", str(FAMILIES / f"{family}.py"), "--cluster", str(cluster), "-o", str(out), "--quiet"])
    text = capsys.readouterr()
    assert rc == 0, text.out + text.err
    with capsys.disabled():
        assert _verified(torchrun(out / "program.py", 3, "--verify", "--steps", "2", timeout=600)) < 1e-4


@pytest.mark.parametrize("pattern", patterns.PATTERNS)
def test_pattern_program_verifies_on_three_uneven_ranks(pattern, tmp_path):
    torch.manual_seed(0)
    traced = hapc.trace(patterns.model(pattern), patterns.inputs())
    program = baseline_program("dp-flops", traced.graph, load_cluster(UNEVEN))
    path = emit(program, str(FAMILIES / "patterns.py"), str(tmp_path), model_kwargs={"pattern": pattern},
                constants=traced.constants)
    assert _verified(torchrun(Path(path), 3, "--verify", "--steps", "2")) < 1e-5


def test_list_index_traced_on_meta_verifies(tmp_path):
    """Its constants carry no data on meta: left out of constants.pt, re-derived by each rank."""
    with torch.device("meta"):
        model = patterns.model("list_index")
    traced = hapc.trace(model, tuple(t.to("meta") for t in patterns.inputs()))
    assert traced.dataless_constants()
    program = baseline_program("megatron-tp", traced.graph, load_cluster(UNEVEN))
    path = emit(program, str(FAMILIES / "patterns.py"), str(tmp_path), model_kwargs={"pattern": "list_index"},
                constants=traced.constants)
    assert _verified(torchrun(Path(path), 3, "--verify", "--steps", "2")) < 1e-5


def test_custom_op_program_verifies_on_three_uneven_ranks(tmp_path):
    import custom_op

    torch.manual_seed(0)
    traced = hapc.trace(custom_op.model(), custom_op.inputs())
    program = baseline_program("dp-flops", traced.graph, load_cluster(UNEVEN))
    path = emit(program, str(FAMILIES / "custom_op.py"), str(tmp_path), constants=traced.constants)
    assert "torch.ops.hapc_test.scaled_tanh.default(" in Path(path).read_text()
    assert _verified(torchrun(Path(path), 3, "--verify", "--steps", "2")) < 1e-5
