"""bf16 mixed precision: the graph as autocast runs it, its prices, what the plan records, the
emitted program's tables, and numerics against one device under the same autocast."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import hapc
from hapc.api import baseline
from hapc.cli import main
from hapc.codegen.executor import run
from hapc.ir.precision import Precision, autocast_graph
from hapc.plan.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "configs" / "models" / "gpt.py"
H100 = str(ROOT / "configs" / "clusters" / "h100x8.yaml")
THREE_UNEVEN = {"name": "three-uneven", "nodes": [{"intra_link": "loopback", "devices": [
    {"name": "big", "tflops": {"fp32": 0.3, "bf16": 0.6}, "memory_GB": 8, "hbm_GBps": 20, "count": 1},
    {"name": "mid", "tflops": {"fp32": 0.2, "bf16": 0.4}, "memory_GB": 8, "hbm_GBps": 15, "count": 1},
    {"name": "small", "tflops": {"fp32": 0.1, "bf16": 0.2}, "memory_GB": 8, "hbm_GBps": 10, "count": 1}]}]}


@pytest.fixture(scope="module")
def gpt():
    """(module, inputs, traced, SMALL kwargs); the trace is shared with test_codegen's cache."""
    from conftest import load_model_file
    from tests.runs import traced_small

    traced, path, small = traced_small("gpt")
    return traced.module, tuple(load_model_file(path).inputs(**small)), traced, small


def test_autocast_graph_has_the_dtypes_autocast_produces(gpt):
    _, _, traced, _ = gpt
    graph = traced.graph
    assert autocast_graph(graph, "fp32") is graph
    mixed = autocast_graph(graph, "bf16")
    dtype = {n.op.split(".")[1]: mixed.meta(n.outputs[0]).dtype for n in mixed.nodes}
    assert dtype["linear"] == dtype["scaled_dot_product_attention"] == dtype["gelu"] == "bfloat16"
    assert dtype["layer_norm"] == dtype["cross_entropy_loss"] == dtype["embedding"] == "float32"
    assert dtype["add"] == "float32"                      # residual: fp32 stream + bf16 branch
    assert all(mixed.meta(p).dtype == "float32" for p in mixed.params)   # master weights
    before, after = graph.total_cost, mixed.total_cost
    assert after.fwd_flops == before.fwd_flops and after.fwd_bytes < before.fwd_bytes
    assert graph.meta(graph.nodes[-1].outputs[0]).dtype == "float32"  # the traced graph is untouched


def test_bf16_plan_is_priced_at_the_bf16_peak_and_records_its_numerics(gpt, tmp_path):
    model, inputs, traced, small = gpt
    fp32 = baseline(traced, None, H100, "dp-even", model_file=str(GPT), model_kwargs=small)
    bf16 = baseline(traced, None, H100, "dp-even", model_file=str(GPT), model_kwargs=small, precision="bf16")
    assert bf16.cost < fp32.cost
    d32, d16 = fp32.sim.memory.devices[0], bf16.sim.memory.devices[0]
    for part in ("params_bytes", "grads_bytes", "optimizer_bytes"):   # fp32 master weights and state
        assert getattr(d16, part) == getattr(d32, part)
    graph = bf16.graph
    cast = {r for n in graph.nodes if n.op == "aten.linear.default" for r in n.input_refs()
            if graph.values[r].kind == "param"}
    copies = sum(2 * graph.meta(r).numel for r in cast)           # autocast's bf16 weight copies
    halved = d32.activations_bytes - d16.activations_bytes + copies
    assert 0 < halved < d32.activations_bytes                     # bf16 activations, fp32 residual stream
    assert bf16.precision == Precision("bf16", True, "fp32")   # h100x8.yaml sets allow_tf32
    assert "bf16 autocast" in bf16.summary() and "TF32 on" in bf16.summary()
    bf16.save(tmp_path / "plan.json")
    again = Plan.load(tmp_path / "plan.json")
    assert again.precision == bf16.precision and again.cost == pytest.approx(bf16.cost)
    program = Path(bf16.emit(tmp_path / "out")).read_text()
    assert "PRECISION = 'bf16'" in program and "ALLOW_TF32 = True" in program
    assert "PRECISION = 'fp32'" in Path(fp32.emit(tmp_path / "out32")).read_text()


def test_bf16_program_on_three_uneven_ranks_matches_one_device_under_autocast(gpt):
    """Tensor parallel (Partial sums, all-gathers in bf16) against the module itself."""
    model, inputs, traced, _ = gpt
    program = baseline(traced, None, THREE_UNEVEN, "megatron-tp", precision="bf16").program
    program = dataclasses.replace(program, shares=(0.5, 0.3, 0.2), _blocks=None)   # uneven pieces
    got = run(program, traced, inputs, autocast=torch.bfloat16)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(*inputs)
    loss.backward()
    fp32 = run(program, traced, inputs)
    names = {traced.graph.values[p].target: p for p in traced.graph.params}
    for target, name in names.items():
        want = model.get_parameter(target).grad
        err = (got.grads[name] - want).abs().max().item()
        # The emitted program's bf16 criterion (atol 1e-4 + rtol 5e-2 of the scale), tighter.
        assert err <= 1e-4 + 2e-2 * want.abs().max().item(), target
        assert got.grads[name].dtype == torch.float32           # master-weight gradients
    assert abs(got.loss.item() - loss.item()) < 1e-2
    assert got.loss.item() != fp32.loss.item()                  # autocast really ran


def test_bad_precision_is_one_line_exit_2(tmp_path, capsys):
    rc = main(["compile", str(GPT), "--cluster", H100, "--precision", "fp8", "-o", str(tmp_path / "o")])
    text = capsys.readouterr().err.strip()
    assert rc == 2 and len(text.splitlines()) == 1 and "fp8" in text and "fp32, bf16" in text
    with pytest.raises(hapc.errors.UserError, match="precision"):
        baseline(None, None, H100, "dp-even", precision="half")   # checked before any tracing


@pytest.mark.slow
@pytest.mark.parametrize("precision, attn_dropout", [("bf16", 0.0), ("fp32", 0.2)])
def test_hf_gpt2_plan_verifies_on_three_uneven_gloo_ranks(tmp_path, precision, attn_dropout):
    """bf16: within the bf16 tolerance; fp32 with attention dropout inside sdpa (and residual
    dropout): exact, every rank drawing its piece of the same masks."""
    import yaml
    from tests.runs import torchrun, verify_line

    cluster = tmp_path / "three.yaml"
    cluster.write_text(yaml.safe_dump(THREE_UNEVEN))
    small = ["layers=2", "hidden=64", "heads=4", "seq=16", "vocab=101", "batch=5", "dropout=0.1",
             f"attn_dropout={attn_dropout}"]
    args = ["compile", str(ROOT / "configs" / "models" / "hf_gpt2.py"), "--cluster", str(cluster),
            "--precision", precision, "-o", str(tmp_path / "out"), "--quiet"]
    assert main(args + [x for kv in small for x in ("--set", kv)]) == 0
    plan = Plan.load(tmp_path / "out" / "plan.json")
    assert plan.precision.name == precision and len(set(plan.ratios)) > 1
    proc = torchrun(tmp_path / "out" / "program.py", 3, "--verify", "--steps", "2", timeout=600)
    assert f"verify tolerance: {precision}" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = verify_line(proc)
    assert line.startswith("verify: ok"), proc.stdout[-2000:] + proc.stderr[-3000:]
    if precision == "fp32":
        assert float(line.split("max_abs_err=")[1]) < 1e-5
