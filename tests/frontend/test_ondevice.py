"""Tracing for the cluster's device type (issue 24): model code that branches on the device
keeps, in the plan, the branch of the device its program runs on, and a plan stays
memory-light (fakes built from a meta model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hapc
from hapc.errors import UserError
from hapc.frontend.cache.keys import TraceKey
from hapc.frontend.modelfile import load_and_trace
from hapc.frontend.ondevice import on_device

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(__file__).resolve().parent / "models"
BRANCH = MODELS / "device_branch.py"
CPU_CLUSTER = REPO / "configs" / "clusters" / "cpu-3nodes-1-2-3.yaml"
GPU_CLUSTER = REPO / "configs" / "clusters" / "a100x8-nvlink.yaml"


def _ops(graph) -> set[str]:
    return {n.op for n in graph.nodes}


@pytest.mark.parametrize("device, branch, other", [("cpu", "aten.add.Tensor", "aten.mul.Tensor"),
                                                   ("cuda", "aten.mul.Tensor", "aten.add.Tensor")])
def test_trace_takes_the_branch_of_its_device(device, branch, other):
    traced = load_and_trace(str(BRANCH), {}, device=device, quiet_imports=False)
    assert branch in _ops(traced.graph) and other not in _ops(traced.graph)
    # Every parameter still trains (fakes on cuda without CUDA carry no requires_grad).
    assert all(traced.graph.values[p].requires_grad for p in traced.graph.params)


def test_plans_hold_the_branch_of_their_cluster():
    cpu = hapc.synthesize(str(BRANCH), None, str(CPU_CLUSTER), trace_cache=False)
    gpu = hapc.synthesize(str(BRANCH), None, str(GPU_CLUSTER), trace_cache=False)
    assert "aten.add.Tensor" in _ops(cpu.graph) and "aten.mul.Tensor" not in _ops(cpu.graph)
    assert "aten.mul.Tensor" in _ops(gpu.graph) and "aten.add.Tensor" not in _ops(gpu.graph)


def test_program_names_the_device_it_was_traced_for(tmp_path):
    plan = hapc.synthesize(str(BRANCH), None, str(GPU_CLUSTER), trace_cache=False)
    text = Path(plan.emit(str(tmp_path))).read_text()
    assert "TRACED_FOR = 'cuda'" in text


def test_trace_cache_key_holds_the_device():
    cpu = TraceKey.for_model_file(BRANCH, {}, device="cpu")
    cuda = TraceKey.for_model_file(BRANCH, {}, device="cuda")
    assert cpu.digest != cuda.digest and '"device":"cuda"' in cuda.material


def test_fakes_keep_ties_and_allocate_nothing():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Embedding(50_000, 4096), torch.nn.Linear(4096, 50_000, bias=False))
    model[1].weight = model[0].weight                      # tied, as language models tie them
    fake = on_device(model, (torch.zeros(2, 3, dtype=torch.long),), "cpu")
    assert fake.model[0].weight is fake.model[1].weight
    assert fake.model[0].weight.device.type == "cpu" and fake.inputs[0].device.type == "cpu"
    assert fake.trainable == {"0.weight": True, "1.weight": True}


def test_untraceable_device_branch_is_one_line_naming_the_line():
    with pytest.raises(UserError) as err:
        load_and_trace(str(MODELS / "device_branch_untraceable.py"), {}, device="cpu", quiet_imports=False)
    message = str(err.value)
    assert "\n" not in message and "device_branch_untraceable.py:15" in message, message


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match="one of cpu, cuda"):
        with torch.device("meta"):
            on_device(torch.nn.Linear(2, 2), (), "mps")
