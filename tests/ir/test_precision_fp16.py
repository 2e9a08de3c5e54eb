"""fp16 mixed precision: the graph as fp16 autocast runs it, priced at each device's fp16 peak,
what the plan records (auto's choice, loss scaling), the emitted tables, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from hapc.api import baseline
from hapc.cli import main
from hapc.ir.precision import LOSS_SCALING, Precision, autocast_graph
from hapc.plan.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "configs" / "models" / "gpt.py"
V100 = str(ROOT / "configs" / "clusters" / "v100x16-2nodes-25gbps.yaml")
T4_A100 = str(ROOT / "configs" / "clusters" / "t4x4-a100x1.yaml")


@pytest.fixture(scope="module")
def gpt():
    from tests.runs import traced_small

    traced, path, small = traced_small("gpt")
    return traced, small


def test_fp16_graph_has_bf16s_dtypes_in_float16(gpt):
    traced, _ = gpt
    bf16, fp16 = autocast_graph(traced.graph, "bf16"), autocast_graph(traced.graph, "fp16")
    low = {"bfloat16": "float16"}
    for a, b in zip(bf16.nodes, fp16.nodes):          # the same op classes in low precision
        for x, y in zip(a.outputs, b.outputs):
            assert low.get(bf16.meta(x).dtype, bf16.meta(x).dtype) == fp16.meta(y).dtype
    assert any(fp16.meta(n.outputs[0]).dtype == "float16" for n in fp16.nodes)
    assert all(fp16.meta(p).dtype == "float32" for p in fp16.params)        # master weights
    assert fp16.total_cost.fwd_bytes == bf16.total_cost.fwd_bytes
    with pytest.raises(ValueError, match="auto"):
        autocast_graph(traced.graph, "auto")


def test_v100_plan_is_priced_at_the_fp16_peak():
    """V100: 15.7 TFLOPS fp32, no bf16 units (bf16 runs at the fp32 rate), 125 fp16. A GPT
    large enough for its products, not kernel launches, to set the compute time."""
    size = {"layers": 2, "hidden": 1024, "heads": 16, "seq": 256, "vocab": 1000, "batch": 32}
    plans = {p: baseline(str(GPT), None, V100, "dp-even", model_kwargs=size, precision=p) for p in ("fp32", "bf16", "fp16")}
    compute = {p: max(plan.sim.compute_seconds) for p, plan in plans.items()}
    assert compute["fp16"] < 0.4 * compute["fp32"]
    assert compute["fp16"] < 0.4 * compute["bf16"]           # bf16 gains only its halved bytes there
    assert plans["fp16"].cost < plans["bf16"].cost < plans["fp32"].cost
    d32, d16 = plans["fp32"].sim.memory.devices[0], plans["fp16"].sim.memory.devices[0]
    for part in ("params_bytes", "grads_bytes", "optimizer_bytes"):          # fp32 master weights and state
        assert getattr(d16, part) == getattr(d32, part)
    assert plans["fp16"].precision == Precision("fp16", False, "fp32")


def test_fp16_plan_records_loss_scaling_and_emits_it(gpt, tmp_path):
    traced, small = gpt
    plan = baseline(traced, None, V100, "dp-even", model_file=str(GPT), model_kwargs=small, precision="fp16")
    assert "fp16 autocast" in plan.summary() and "dynamic loss scaling" in plan.summary()
    plan.save(tmp_path / "plan.json")
    assert '"loss_scaling"' in (tmp_path / "plan.json").read_text()
    again = Plan.load(tmp_path / "plan.json")
    assert again.precision == plan.precision and again.precision.loss_scaling == LOSS_SCALING
    out = tmp_path / "out"
    program = Path(plan.emit(out)).read_text()
    assert "PRECISION = 'fp16'" in program and "LOSS_SCALING = {'init_scale': 65536.0" in program
    assert (out / "hapc_loss_scale.py").is_file()
    bf16 = Path(baseline(traced, None, V100, "dp-even", model_file=str(GPT), model_kwargs=small,
                         precision="bf16").emit(tmp_path / "bf")).read_text()
    assert "LOSS_SCALING = None" in bf16


def test_auto_records_its_choice(gpt, tmp_path):
    traced, small = gpt
    plan = baseline(traced, None, T4_A100, "dp-even", model_file=str(GPT), model_kwargs=small, precision="auto")
    assert plan.precision.name == "fp16" and "faster than fp32" in plan.precision.auto
    assert "auto chose fp16" in plan.summary()
    plan.save(tmp_path / "plan.json")
    assert Plan.load(tmp_path / "plan.json").precision.auto == plan.precision.auto


def test_fp16_on_a_cluster_without_fp16_rates_is_one_line_exit_2(tmp_path, capsys):
    cluster = tmp_path / "old.yaml"
    cluster.write_text("nodes:\n  - devices: [{name: oldcard, tflops: {fp32: 5, bf16: 5}, memory_GB: 8, "
                       "hbm_GBps: 100, count: 2}]\n    intra_link: pcie3\n")
    rc = main(["compile", str(GPT), "--cluster", str(cluster), "--precision", "fp16", "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "oldcard (rank 0) has no fp16 rate" in err
    assert not (tmp_path / "o").exists()                   # refused before any tracing or writing
