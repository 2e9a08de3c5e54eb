"""Programs with ZeRO's owned rows on four gloo ranks (slow): one-stage ZeRO-2 and accumulating
ZeRO-1 plans verify against one device (with dropout), and a checkpoint saved under ZeRO resumes
under plain data parallelism and back, with the losses of an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from hapc import synthesize
from tests.e2e.test_pipeline_run import _emit, _launch
from tests.synth.test_zero_choice import GPT, SMALL_GPT, _cluster

pytestmark = pytest.mark.slow

TIGHT = 0.0018         # GB per device: data parallelism fits only with its states sharded


def _losses(path: Path, *args: str) -> list[float]:
    from tests.runs import step_losses

    return list(step_losses(_launch(path, [4], *args)[0]).values())


@pytest.mark.parametrize("microbatches", [None, 2])
def test_owned_rows_verify_against_one_device(tmp_path, microbatches):
    plan = synthesize(GPT, None, _cluster(TIGHT), model_kwargs={**SMALL_GPT, "dropout": 0.1},
                      microbatches=microbatches)
    program = plan.program if microbatches is None else plan.pipeline.stages[0].program
    assert program.state_shares is not None
    outs = _launch(_emit(plan, tmp_path), [4], "--steps", "3", "--verify")
    assert "verify: ok" in outs[0] and "step 3 loss" in outs[0], outs[0][-2000:]


def test_checkpoints_resume_exactly_between_zero_and_data_parallelism(tmp_path):
    (tmp_path / "zero").mkdir()
    (tmp_path / "plain").mkdir()
    zero = _emit(synthesize(GPT, None, _cluster(TIGHT), model_kwargs=SMALL_GPT), tmp_path / "zero")
    plain = _emit(synthesize(GPT, None, _cluster(8), model_kwargs=SMALL_GPT), tmp_path / "plain")
    assert "STATE_ROWS" in zero.read_text() and "'p_" not in plain.read_text().split("STATE_ROWS")[1][:40]
    straight = _losses(plain, "--steps", "4")
    for first, then in ((zero, plain), (plain, zero)):
        saved = tmp_path / f"ck-{first.parent.name}"
        assert _losses(first, "--steps", "2", "--save", str(saved)) == straight[:2]
        assert _losses(then, "--steps", "2", "--load", str(saved)) == straight[2:], first.parent.name


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_weights_stored_sharded_are_gathered_again_in_backward_and_verify(tmp_path, precision):
    """ZeRO-3 applied to the data-parallel plan (synth.zero.with_sharded_storage): every weight
    gathered just before use, freed after forward, gathered again in backward (saved-tensor
    hooks): the gradients of one device, with dropout. Under bf16 the weights that only feed
    bf16 products travel in bf16 (LOW_GATHERS)."""
    from costmodel.simulator import simulate
    from hapc.plan.plan import Plan
    from synth.zero import with_sharded_storage

    roomy = synthesize(GPT, None, _cluster(8), model_kwargs={**SMALL_GPT, "dropout": 0.1}, precision=precision)
    program = with_sharded_storage(roomy.program)
    plan = Plan(program, roomy.cluster, simulate(program, roomy.cluster), model=roomy.model, precision=roomy.precision)
    path = _emit(plan, tmp_path)
    low = "'p_blocks_0_attn_q_weight': 'bfloat16'" in path.read_text()
    assert low == (precision == "bf16")
    outs = _launch(path, [4], "--steps", "3", "--verify")
    assert "verify: ok" in outs[0] and "step 3 loss" in outs[0], outs[0][-2000:]


def test_recomputed_layers_with_dropout_verify(tmp_path):
    """Activation recomputation (each layer's forward again in backward, its dropout masks
    drawn again the same) with ZeRO-2: the gradients of one device."""
    plan = synthesize(GPT, None, _cluster(0.0015), model_kwargs={**SMALL_GPT, "dropout": 0.1})
    assert plan.program.recompute
    path = _emit(plan, tmp_path)
    assert "rt.recompute(block_0, " in path.read_text()
    outs = _launch(path, [4], "--steps", "3", "--verify")
    assert "verify: ok" in outs[0] and "step 3 loss" in outs[0], outs[0][-2000:]


def test_recomputed_layers_over_weights_stored_sharded_verify(tmp_path):
    """Recomputation inside ZeRO-3: a recomputed layer gathers its weights again when backward
    reruns it (torch.utils.checkpoint's hooks, not GatheredWeights', hold that layer's tensors)."""
    from costmodel.simulator import simulate
    from hapc.plan.plan import Plan
    from synth.levers import with_recompute
    from synth.zero import with_sharded_storage

    roomy = synthesize(GPT, None, _cluster(8), model_kwargs={**SMALL_GPT, "dropout": 0.1})
    program = with_recompute(with_sharded_storage(roomy.program))
    plan = Plan(program, roomy.cluster, simulate(program, roomy.cluster), model=roomy.model, precision=roomy.precision)
    path = _emit(plan, tmp_path)
    assert "rt.recompute(block_0, " in path.read_text()
    outs = _launch(path, [4], "--steps", "3", "--verify")
    assert "verify: ok" in outs[0] and "step 3 loss" in outs[0], outs[0][-2000:]
