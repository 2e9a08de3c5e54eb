"""The memory model against the emitted program (issue 22): a GPT on 4 CPU gloo ranks, run with
``--measure-memory`` (each rank's peak tensor bytes, hapc/runtime/memory_meter.py), with and
without its layers recomputed, against the plan's predicted peak per device.

Measured on this GPT: recomputed, the prediction is the peak to 0.1%; without recomputation it
is 11% over, because it adds every gradient to every activation, while backward frees a
layer's activations as the gradients of the layers after it arrive (a peak over the step's
timeline would close it). The dangerous direction, a prediction under the peak, is held to 3%."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.simulator import simulate
from hapc import synthesize
from hapc.plan.plan import Plan
from synth.levers import with_recompute

from tests.e2e.test_pipeline_run import _launch

REPO = Path(__file__).resolve().parents[2]
GPT = {"layers": 4, "hidden": 256, "heads": 8, "seq": 128, "batch": 16, "vocab": 1000, "dropout": 0.0}


def _measured(plan: Plan, out: Path) -> list[int]:
    path = Path(plan.emit(out))
    outs = _launch(path, [4], "--steps", "3", "--measure-memory")
    line = next(x for x in outs[0].splitlines() if x.startswith("peak memory bytes per rank: "))
    return [int(b) for b in line.split(": ")[1].split()]


@pytest.mark.slow
def test_the_predicted_peak_holds_against_the_measured_one_with_and_without_recomputation(tmp_path):
    plan = synthesize(str(REPO / "configs" / "models" / "gpt.py"), None, str(REPO / "configs" / "clusters" / "cpu4.yaml"),
                      model_kwargs=GPT)
    assert not plan.program.recompute
    recomputing = with_recompute(plan.program)
    lean = Plan(recomputing, plan.cluster, simulate(recomputing, plan.cluster), model=plan.model,
                precision=plan.precision)
    ratios = {}
    for name, p in (("kept", plan), ("recomputed", lean)):
        measured = _measured(p, tmp_path / name)
        ratios[name] = [m / t for m, t in zip(measured, p.sim.memory.totals)]
    assert all(0.85 <= r <= 1.03 for r in ratios["kept"]), ratios
    assert all(0.97 <= r <= 1.03 for r in ratios["recomputed"]), ratios
