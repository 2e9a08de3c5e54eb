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
from synth.accumulation import _one_stage
from synth.levers import with_recompute
from synth.stages import StagePlanner
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
    planner = StagePlanner(roomy.graph, roomy.cluster)
    for prog in (roomy.program, program):
        stage = _one_stage(planner, prog, 1, require_fit=False).cost.stage_memory_bytes[0]
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
