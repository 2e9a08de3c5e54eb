"""Gradient accumulation in one-stage plans (issue 22): the batch runs as ``m`` equal
micro-batches over all devices, gradients summed and synchronised once. Forced with
``--microbatches``, chosen by the planner when memory binds the one-stage plan, said in the
reports, kept by plan.json, and (slow) verified against one device on gloo ranks, including a
loss whose micro-batches weigh by their counted targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from hapc import synthesize
from hapc.cli import main
from hapc.plan.plan import Plan
from synth.loads import MemoryInfeasible

from tests.e2e.test_pipeline_run import _launch

REPO = Path(__file__).resolve().parents[2]
LOSSES = str(REPO / "tests" / "e2e" / "families" / "losses.py")
GPT = str(REPO / "configs" / "models" / "gpt.py")
SMALL_MIXED = str(REPO / "configs" / "clusters" / "small-mixed.yaml")


def _cluster(memory_kb: float) -> dict:
    """small-mixed with ``memory_kb`` per device: the tiny loss models need some tens of kB."""
    gb = memory_kb * 1e3 / 1e9
    return {"name": f"small-mixed-{memory_kb:g}kB", "nodes": [{"intra_link": "loopback", "devices": [
        {"name": "fast", "tflops": 0.2, "memory_GB": gb, "hbm_GBps": 20, "count": 2},
        {"name": "slow", "tflops": 0.1, "memory_GB": gb, "hbm_GBps": 10, "count": 2}]}]}


def _plan(cluster, **kw) -> Plan:
    return synthesize(LOSSES, None, cluster, model_kwargs={"loss": kw.pop("loss", "masked_mean"), "batch": 16}, **kw)


def _peak(plan: Plan) -> float:
    return max(max(mem) for mem in plan.pipeline.cost.stage_memory_bytes)


def test_forced_micro_batches_on_one_stage_accumulate_over_all_devices():
    one = _plan(SMALL_MIXED)
    plan = _plan(SMALL_MIXED, microbatches=4)
    assert one.pipeline is None
    (stage,) = plan.pipeline.stages
    assert plan.pipeline.microbatches == 4 and tuple(stage.ranks) == (0, 1, 2, 3)
    assert (stage.first_node, stage.stop_node) == (0, len(plan.graph.nodes))
    assert _peak(plan) < max(one.sim.memory.totals)          # a quarter of the activations held
    assert plan.cost > one.cost                              # four steps' overheads for it
    assert "gradient accumulation: 4 micro-batches of 4 samples" in plan.summary()
    assert "4 micro-batches accumulated" in repr(plan)


def test_accumulation_is_chosen_when_memory_binds_the_one_stage_plan():
    one = _plan(SMALL_MIXED)
    room = 0.75 * max(one.sim.memory.totals) / 1e3     # below what any shares of the data-parallel plan need
    plan = _plan(_cluster(room))
    assert plan.pipeline is not None and len(plan.pipeline.stages) == 1 and plan.pipeline.microbatches > 1
    assert _peak(plan) <= room * 1e3
    # The one-stage plan that fits stores parameters sharded (ZeRO-3), gathering them each step:
    # slower than accumulating over replicated ones.
    assert plan.sim.fits and plan.cost < plan.sim.iteration_seconds


def test_accumulation_is_not_chosen_when_memory_does_not_bind():
    assert _plan(SMALL_MIXED).pipeline is None


def test_when_nothing_fits_the_error_names_the_levers_tried():
    with pytest.raises(MemoryInfeasible) as info:
        _plan(_cluster(5))
    message = str(info.value)
    assert "\n" not in message and "missing on fast#0" in message
    assert "tried: sharding, uneven shares, ZeRO-1/2/3, activation recomputation, gradient accumulation up to 4 " \
        "micro-batches" in message


def test_out_of_reach_is_found_from_the_leanest_variant_alone(monkeypatch):
    """When even the leanest variant (layers recomputed, weights stored sharded) at the most
    micro-batches needs more than the devices have, nothing else is priced: on a 70B model
    that is minutes of fitting ZeRO's rows and the share LP to variants that cannot fit."""
    from costmodel.cluster import load_cluster
    from hapc.api import _trace_file
    from synth import accumulation as A
    from synth.stages import StagePlanner

    with _trace_file(LOSSES, {"loss": "masked_mean", "batch": 16}, SMALL_MIXED, True, None) as f:
        graph = f.traced.graph
    priced = []
    real = A._Prices.one_stage
    monkeypatch.setattr(A._Prices, "one_stage", lambda self, program, m, require_fit=True:
                        priced.append(m) or real(self, program, m, require_fit))
    roomy = A.accumulation(StagePlanner(graph, load_cluster(_cluster(1000))))
    assert roomy is not None and len(priced) > 4
    priced.clear()
    assert A.accumulation(StagePlanner(graph, load_cluster(_cluster(1)))) is None
    assert 0 < len(priced) <= 2 and len(set(priced)) == 1     # the leanest variant(s), at the most micro-batches


def test_a_model_whose_samples_are_coupled_is_not_accumulated_and_the_error_says_so():
    with pytest.raises(MemoryInfeasible, match=r"no gradient accumulation \(the model's samples are coupled\)"):
        _plan(_cluster(5), loss="contrastive")


def test_an_accumulating_plan_survives_plan_json(tmp_path):
    plan = _plan(SMALL_MIXED, microbatches=2)
    plan.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert loaded.pipeline.microbatches == 2 and len(loaded.pipeline.stages) == 1
    assert loaded.cost == pytest.approx(plan.cost, rel=1e-9)


@pytest.mark.parametrize("flag, says", [("3", "does not divide the batch of 16 samples"),
                                        ("32", "is more than the batch of 16 samples")])
def test_micro_batches_that_do_not_split_the_batch_fail_in_one_line(tmp_path, capsys, flag, says):
    code = main(["compile", LOSSES, "--set", "loss=masked_mean", "--set", "batch=16", "--cluster", SMALL_MIXED,
                 "--microbatches", flag, "-o", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err


@pytest.mark.slow
@pytest.mark.parametrize("model, overrides, m", [
    (LOSSES, {"loss": "masked_mean", "batch": 16}, 4),     # micro-batches weigh by their counted labels
    (GPT, {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "dropout": 0.1, "batch": 8}, 2),
])
def test_accumulated_steps_verify_against_one_device(tmp_path, model, overrides, m):
    plan = synthesize(model, None, SMALL_MIXED, model_kwargs=overrides, microbatches=m)
    plan.save(tmp_path / "plan.json")
    path = Path(Plan.load(tmp_path / "plan.json").emit(tmp_path))
    outs = _launch(path, [4], "--steps", "2", "--verify")
    assert "verify: ok" in outs[0] and "step 2 loss" in outs[0], outs[0][-2000:]


@pytest.mark.slow
def test_accumulated_checkpoints_resume_exactly_under_a_one_stage_plan_and_back(tmp_path):
    """--save under gradient accumulation, --load under the one-stage plan of the same model, and
    the other way round: the losses of an uninterrupted run."""
    from tests.runs import step_losses

    cfg = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "dropout": 0.0, "batch": 8}
    acc = Path(synthesize(GPT, None, SMALL_MIXED, model_kwargs=cfg, microbatches=2).emit(tmp_path / "acc"))
    one = Path(synthesize(GPT, None, SMALL_MIXED, model_kwargs=cfg).emit(tmp_path / "one"))

    def losses(path: Path, *args: str) -> list[float]:
        return list(step_losses(_launch(path, [4], *args)[0]).values())

    # Two plans sum in other orders: their losses agree to float32 rounding, not to the last digit.
    straight = {path: losses(path, "--steps", "4") for path in (acc, one)}
    for first, then in ((acc, one), (one, acc)):
        saved = tmp_path / f"ck-{first.parent.name}"
        assert losses(first, "--steps", "2", "--save", str(saved)) == straight[first][:2]
        assert losses(then, "--steps", "2", "--load", str(saved)) == pytest.approx(straight[then][2:], rel=1e-6), \
            first.parent.name
