"""Model families from Hugging Face ``transformers``, unmodified, at tiny configs
(configs/models/hf.py): each traces, is planned for 3 CPU ranks of uneven speed, and its
emitted program trains one step under torchrun and prints ``verify: ok`` against one device.

Two plans per family: the synthesizer's (what a user gets) and the Megatron tensor-parallel
baseline (which shards attention heads, MLPs and the vocabulary, so the sharded rules run for
real even where the synthesizer prefers data parallelism on so small a model). Both run on the
in-process executor in float64 against one device; under torchrun, every family's synthesized
plan and the tensor-parallel plan of three (Llama: vocabulary-parallel embedding with a padding
row; BERT; BLOOM: ALiBi through baddbmm), to keep CI's time in bounds. The families
owned by the ``correct`` issue (T5, BART, Whisper, Falcon, Mixtral) run here in-process only:
tests/e2e/test_families_encdec.py runs them under torchrun.

Slow (one torchrun per case): ``.venv/bin/python -m pytest -q -m slow tests/e2e/test_families.py``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch


from tests.runs import torchrun, verify_line  # noqa: E402

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HF_FILE = REPO / "configs" / "models" / "hf.py"


@functools.cache
def _modules():
    from conftest import load_model_file

    return load_model_file(HF_FILE), load_model_file(REPO / "configs" / "models" / "coverage.py")


@functools.cache
def _traced(family: str):
    import hapc

    hf, _ = _modules()
    torch.manual_seed(0)
    return hapc.trace(hf.model(family), hf.inputs(family))


TORCHRUN_TENSOR_PARALLEL = ("llama", "bert", "bloom")


def _cases(plans_for) -> list:
    hf, _ = _modules()
    return [pytest.param(family, plan, id=f"{family}-{plan}")
            for family in hf.FAMILIES for plan in plans_for(family)]


def _program(family: str, plan: str):
    _, coverage = _modules()
    return coverage.family_program(_traced(family), plan)


@pytest.mark.parametrize("family, plan", _cases(lambda family: ("synth", "megatron-tp")))
def test_family_plan_matches_one_device_in_process(family, plan):
    hf, coverage = _modules()
    err = coverage.verify_error(_program(family, plan), _traced(family), hf.inputs(family))
    assert err < coverage.VERIFY_TOLERANCE, f"{family} {plan}: max_abs_err={err:.3g}"


def _torchrun_plans(family: str) -> tuple[str, ...]:
    hf, _ = _modules()
    if hf.FAMILIES[family].owner != "coverage":
        return ()           # tests/e2e/test_families_encdec.py runs those under torchrun
    return ("synth", "megatron-tp") if family in TORCHRUN_TENSOR_PARALLEL else ("synth",)


@pytest.mark.parametrize("family, plan", _cases(_torchrun_plans))
def test_family_verifies_on_three_uneven_gloo_ranks(family, plan, tmp_path):
    from costmodel.cluster import load_cluster
    from hapc.codegen import emit

    _, coverage = _modules()
    traced = _traced(family)
    path = Path(emit(_program(family, plan), str(HF_FILE), str(tmp_path), model_kwargs={"family": family},
                     cluster=load_cluster(coverage.UNEVEN3), constants=traced.constants))
    proc = torchrun(path, 3, "--verify", "--steps", "1", timeout=600)
    line = verify_line(proc)
    assert line.startswith("verify: ok") and proc.returncode == 0, line + proc.stderr[-3000:]
    print(f"{family} {plan}: {line}")
