"""Activation recomputation (costmodel/recompute.py, issue 22): a program that recomputes its
layers keeps each call's inputs and, while backward reruns one call, that call's activations;
backward runs each call's forward again first. The one-stage memory model, the pipeline pricer
(one stage, one micro-batch) and the simulator agree on it; plan.json keeps the choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costmodel.memory import program_memory
from costmodel.recompute import call_of_steps, recomputed_calls, saved_inputs
from costmodel.simulator import simulate
from hapc.errors import UserError
from hapc.plan.plan import Plan
from synth.levers import with_recompute
from synth.stages import price_stages
from costmodel.transfers import LocalBytes
from hapc import synthesize
from tests.synth.test_zero_choice import GPT, SMALL_GPT, _cluster, roomy  # noqa: F401  (the fixture)


def test_only_programs_that_ask_recompute_and_every_layer_is_a_call(roomy):  # noqa: F811
    assert recomputed_calls(roomy.program) == []
    program = with_recompute(roomy.program)
    calls = recomputed_calls(program)
    assert len(calls) == 2 and calls[0].stop <= calls[1].start           # the small GPT's two layers
    assert with_recompute(program) is None                                 # once is enough
    assert saved_inputs(program, calls[1]) == [calls[0].outputs[0]]        # the residual stream


def test_a_recomputed_layer_keeps_its_input_and_one_layer_at_a_time(roomy):  # noqa: F811
    """Two more layers cost two layers' activations when kept, two residual streams when
    recomputed (each call keeps its input; one call's activations live at a time)."""
    deeper = synthesize(GPT, None, _cluster(8), model_kwargs={**SMALL_GPT, "layers": 4})

    def activations(plan, recompute: bool) -> float:
        program = with_recompute(plan.program) if recompute else plan.program
        return program_memory(program, plan.cluster).devices[0].activations_bytes

    program = with_recompute(roomy.program)
    stream = recomputed_calls(program)[0].outputs[0]
    stream_bytes = LocalBytes(program)(stream, program.layouts()[stream])[0]
    assert activations(deeper, True) - activations(roomy, True) == pytest.approx(2 * stream_bytes)
    assert activations(deeper, False) - activations(roomy, False) > 5 * 2 * stream_bytes
    assert activations(roomy, True) < activations(roomy, False)


def test_backward_runs_each_recomputed_step_forward_again(roomy):  # noqa: F811
    program = with_recompute(roomy.program)
    before, after = simulate(roomy.program, roomy.cluster), simulate(program, roomy.cluster)
    again = [e for e in after.events if e.phase == "bwd" and e.label.endswith("(recomputed)")]
    inside = [i for i in call_of_steps(program) if hasattr(program.steps[i], "strategy")]
    assert len(again) == len(inside)
    extra = sum(e.end_seconds - e.start_seconds for e in again)
    assert after.backward_seconds == pytest.approx(before.backward_seconds + extra, rel=0.05)
    assert after.forward_seconds == pytest.approx(before.forward_seconds)


def test_the_pipeline_pricer_agrees_with_the_one_stage_model(roomy):  # noqa: F811
    program = with_recompute(roomy.program)
    n = len(roomy.graph.nodes)
    for prog in (roomy.program, program):
        stage = price_stages(roomy.graph, roomy.cluster, [(0, n, range(4), prog)], 1, "1f1b").cost.stage_memory_bytes[0]
        whole = program_memory(prog, roomy.cluster).totals
        assert max(stage) == pytest.approx(max(whole), rel=0.1), prog.recompute


def test_plan_json_keeps_recompute_and_refuses_a_bad_value(roomy, tmp_path):  # noqa: F811
    program = with_recompute(roomy.program)
    plan = Plan(program, roomy.cluster, simulate(program, roomy.cluster), model=roomy.model, precision=roomy.precision)
    plan.save(tmp_path / "plan.json")
    assert Plan.load(tmp_path / "plan.json").program.recompute
    assert "rt.recompute(block_0, " in Path(Plan.load(tmp_path / "plan.json").emit(tmp_path / "out")).read_text()
    data = json.loads((tmp_path / "plan.json").read_text())
    data["recompute"] = "yes"
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="recompute: expected true or false"):
        Plan.load(tmp_path / "plan.json")


def test_a_pipeline_stage_holds_its_largest_recomputed_layer_once_whatever_is_in_flight(roomy):  # noqa: F811
    """Each micro-batch in flight keeps its layers' inputs; the one layer backward reruns at a
    time holds its activations once (issue 22: pipelines that recompute)."""
    from costmodel.pipeline import profile_program

    from costmodel.groups import sub_cluster
    from synth.baselines import baseline_program

    graph, n = roomy.graph, len(roomy.graph.nodes)
    kept = [baseline_program("dp-even", graph, sub_cluster(roomy.cluster, g)) for g in ((0, 1), (2, 3))]
    recomputing = [with_recompute(p) for p in kept]
    calls = recomputed_calls(recomputing[0])
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    cut = index[next(s.node for s in recomputing[0].steps[calls[1].start:] if hasattr(s, "node"))]   # layer 1 on

    def stages(programs, schedule):
        return price_stages(graph, roomy.cluster, [(0, cut, (0, 1), programs[0]), (cut, n, (2, 3), programs[1])],
                            4, schedule)

    held = profile_program(recomputing[0], sub_cluster(roomy.cluster, (0, 1)), 4).call_bytes
    assert held.shape == (2, 2) and (held > 0).all()
    for k in (0, 1):
        plain, lean = stages(kept, "1f1b").stages[k].cost, stages(recomputing, "1f1b").stages[k].cost
        assert max(lean.activation_bytes) < max(plain.activation_bytes)
        assert max(lean.static_bytes) > max(plain.static_bytes)          # one layer's activations, once
    gpipe, one_f_one_b = stages(recomputing, "gpipe"), stages(recomputing, "1f1b")    # stage 0 holds 4, 2
    extra = [a - b for a, b in zip(gpipe.cost.stage_memory_bytes[0], one_f_one_b.cost.stage_memory_bytes[0])]
    assert extra == pytest.approx([2 * a for a in one_f_one_b.stages[0].cost.activation_bytes])
