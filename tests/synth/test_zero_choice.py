"""ZeRO-1/2 as a plan choice (synth/zero.py, issue 22): the optimizer state (and in one stage the
gradients) of replicated parameters sharded by rows over the ranks when that makes a plan fit;
even rows when they fit, else water-filled to each device's headroom; priced in memory and time;
said in the summary; kept by plan.json. ZeRO-3: weights stored sharded are gathered for use,
not kept for backward, and gathered again there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costmodel.memory import optimizer_copies, program_memory, zero_buffer_bytes
from costmodel.simulator import simulate
from hapc import synthesize
from hapc.errors import UserError
from hapc.plan.plan import Plan
from hapc.ir.layout import Shard
from hapc.ir.program import Compute, Redistribute
from synth.zero import fitted_state_shares, with_sharded_storage, with_state_shares

REPO = Path(__file__).resolve().parents[2]
GPT = str(REPO / "configs" / "models" / "gpt.py")
SMALL_GPT = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "dropout": 0.0, "batch": 8}


def _cluster(memory_gb: float) -> dict:
    """Four CPU workers, two twice as fast, on a 10 GB/s link: data parallelism with replicated
    weights is the fastest plan of the small GPT, and needs 2.2 MB per device."""
    return {"name": f"zero-cpu-{memory_gb:g}", "nodes": [{
        "intra_link": {"bandwidth_GBps": 10, "latency_us": 10}, "devices": [
            {"name": "fast", "tflops": 0.2, "memory_GB": memory_gb, "hbm_GBps": 20, "count": 2},
            {"name": "slow", "tflops": 0.1, "memory_GB": memory_gb, "hbm_GBps": 10, "count": 2}]}]}


@pytest.fixture(scope="module")
def roomy() -> Plan:
    return synthesize(GPT, None, _cluster(8), model_kwargs=SMALL_GPT)


@pytest.fixture(scope="module")
def tight() -> Plan:
    return synthesize(GPT, None, _cluster(0.0018), model_kwargs=SMALL_GPT)


# ---- the share rule -----------------------------------------------------------------------------

def test_even_rows_when_they_fit():
    assert fitted_state_shares([1.0, 5.0], [8.0, 8.0], [10.0, 10.0]) == (0.5, 0.5)


def test_uneven_rows_fill_each_device_to_its_headroom_and_no_further():
    base, state, cap = [10.0, 10.0, 10.0], [12.0, 12.0, 12.0], [30.0, 30.0, 12.0]
    shares = fitted_state_shares(base, state, cap)
    assert sum(shares) == pytest.approx(1.0)
    assert all(b + z * s <= c for b, z, s, c in zip(base, shares, state, cap))
    assert shares[0] == pytest.approx(shares[1]) and shares[2] < shares[0]
    # the smallest largest share (the uneven collectives pad to it): the small device is full
    assert base[2] + shares[2] * state[2] == pytest.approx(cap[2], rel=1e-2)


def test_no_rows_when_the_headrooms_do_not_hold_the_state():
    assert fitted_state_shares([10.0, 10.0], [12.0, 12.0], [14.0, 14.0]) is None


# ---- pricing ------------------------------------------------------------------------------------

def test_owned_rows_shrink_gradients_and_moments_by_their_share(roomy):
    program = roomy.program
    assert program.state_shares is None
    before = program_memory(program, roomy.cluster)
    zero = with_state_shares(program, (0.4, 0.4, 0.1, 0.1))
    after = program_memory(zero, roomy.cluster)
    rows = {p: zero.state_rows(p) for p in program.graph.params}
    assert all(n is not None for n in rows.values())       # every weight of the GPT has rows for 4 ranks
    for r in range(4):
        owned = sum(program.graph.values[p].meta.nbytes * n[r] / sum(n) for p, n in rows.items())
        assert after.devices[r].optimizer_bytes == pytest.approx(optimizer_copies("adamw") * owned)
        assert after.devices[r].grads_bytes == pytest.approx(owned + zero_buffer_bytes(zero))
        assert after.devices[r].params_bytes == before.devices[r].params_bytes     # weights stay whole
        assert after.devices[r].activations_bytes == before.devices[r].activations_bytes


def test_gradients_are_reduce_scattered_and_the_rows_all_gathered(roomy):
    zero = simulate(with_state_shares(roomy.program, (0.25,) * 4), roomy.cluster)
    kinds = {e.kind for e in zero.events if e.phase == "grad_sync"}
    assert kinds == {"reduce_scatter+all_gather"}
    assert "reduce-scatter + all-gather (ZeRO)" in zero.table()
    # each rank updates a quarter of the weights
    step = [e.end_seconds - e.start_seconds for e in zero.events if e.phase == "optimizer"]
    whole = [e.end_seconds - e.start_seconds for e in roomy.sim.events if e.phase == "optimizer"]
    assert max(step) < max(whole)


# ---- the choice ---------------------------------------------------------------------------------

def test_zero_is_not_used_when_memory_does_not_bind(roomy):
    assert roomy.program.state_shares is None and "ZeRO" not in roomy.summary()


def test_zero_makes_data_parallelism_fit_where_it_alone_did_not(roomy, tight):
    assert max(roomy.sim.memory.totals) > 0.0018e9                  # replicated states do not fit
    assert tight.program.state_shares == pytest.approx((0.25,) * 4)
    assert tight.sim.fits and tight.pipeline is None
    assert "ZeRO-2: the gradients and optimizer state of 36 replicated parameters sharded by rows " \
        "over 4 ranks (each keeps fast 0.250, slow 0.250)" in tight.summary()


def test_a_plan_with_zero_survives_plan_json(tight, tmp_path):
    tight.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert loaded.program.state_shares == tight.program.state_shares
    assert loaded.cost == pytest.approx(tight.cost, rel=1e-9)
    assert "STATE_ROWS" in Path(loaded.emit(tmp_path / "out")).read_text()


@pytest.mark.parametrize("value, says", [([0.5, 0.5], "one per rank (4), got 2"),
                                         ([0.5, 0.5, 0.5, 0.5], "fractions of the optimizer state")])
def test_bad_state_shares_in_plan_json_are_refused_in_one_line(tight, tmp_path, value, says):
    tight.save(tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    data["state_shares"] = value
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="state_shares") as info:
        Plan.load(tmp_path / "plan.json")
    assert says in str(info.value) and "\n" not in str(info.value)


# ---- ZeRO-3: weights stored sharded, gathered for use and again for backward -----------------------

def test_sharded_storage_gathers_each_weight_once_before_its_first_reader(roomy):
    program = roomy.program
    sharded = with_sharded_storage(program)
    params = [p for p in program.graph.params if program.graph.values[p].requires_grad]
    assert all(isinstance(sharded.source_layouts[p], Shard) for p in params)
    gathers = [s for s in sharded.steps if isinstance(s, Redistribute) and s.src in params]
    assert sorted(s.src for s in gathers) == sorted(params)
    first_read = {}
    for i, step in enumerate(sharded.steps):
        for name in step.inputs if isinstance(step, Compute) else ():
            first_read.setdefault(name, i)
    assert all(sharded.steps.index(s) < first_read[s.out] for s in gathers)
    assert not any(p in s.inputs for s in sharded.steps if isinstance(s, Compute) for p in params)
    # how it computes is unchanged
    assert [s.strategy for s in sharded.steps if isinstance(s, Compute)] == \
        [s.strategy for s in program.steps if isinstance(s, Compute)]


def test_gathered_weights_are_not_kept_and_are_gathered_again_in_backward(roomy):
    sharded = with_sharded_storage(roomy.program)
    sim = simulate(sharded, roomy.cluster)
    gathers = {(e.phase, e.label) for e in sim.events if e.kind == "all_gather"}
    assert {label for phase, label in gathers if phase == "fwd"} == {label for phase, label in gathers if phase == "bwd"}
    whole, mem = roomy.sim.memory.devices[0], sim.memory.devices[0]
    assert mem.params_bytes < whole.params_bytes / 3              # a third of the weights at most on a fast worker
    assert mem.activations_bytes == pytest.approx(whole.activations_bytes)    # no gathered copy is kept
    assert sim.iteration_seconds > roomy.sim.iteration_seconds


def test_accumulation_stores_weights_sharded_when_nothing_else_fits():
    plan = synthesize(GPT, None, _cluster(0.0007), model_kwargs=SMALL_GPT)
    (stage,) = plan.stages
    assert plan.fits and plan.pipeline.microbatches > 1
    assert any(isinstance(stage.program.source_layouts.get(p), Shard) for p in plan.graph.params)


# ---- the ladder (synth/levers.py): the fastest variant that fits -----------------------------------

def test_recomputation_with_zero_wins_where_zero_alone_does_not_fit():
    plan = synthesize(GPT, None, _cluster(0.0015), model_kwargs={**SMALL_GPT, "dropout": 0.1})
    assert plan.program.recompute and plan.program.state_shares is not None and plan.sim.fits
    sharded = with_sharded_storage(plan.program)              # ZeRO-3 fits too, but is slower
    assert simulate(sharded, plan.cluster).iteration_seconds > plan.cost
    assert "recomputes its 2 repeated layers in backward" in plan.summary()


def test_weights_for_bf16_products_are_gathered_in_bf16_and_reduced_in_float32():
    from costmodel.transfers import LocalBytes, backward_move, forward_move, low_precision_gather

    plan = synthesize(GPT, None, _cluster(8), model_kwargs=SMALL_GPT, precision="bf16")
    sharded = with_sharded_storage(plan.program)
    pieces = LocalBytes(sharded)
    gathers = {s.src: s for s in sharded.steps if isinstance(s, Redistribute) and s.src in sharded.graph.params}
    q = gathers["p_blocks_0_attn_q_weight"]
    assert low_precision_gather(sharded, q) == "bfloat16"
    whole = pieces(q.src, q.src_layout)
    assert forward_move(sharded, q, pieces).piece_bytes == pytest.approx([b / 2 for b in whole])
    assert backward_move(sharded, q, pieces).piece_bytes == pytest.approx(whole)       # float32 gradients
    # a norm's weight is read by a float32 op, the tied embedding by a lookup: whole precision
    assert low_precision_gather(sharded, gathers["p_blocks_0_ln1_weight"]) is None
    assert low_precision_gather(sharded, gathers["p_tok_weight"]) is None
    assert low_precision_gather(with_sharded_storage(synthesize(GPT, None, _cluster(8), model_kwargs=SMALL_GPT).program),
                                q) is None
