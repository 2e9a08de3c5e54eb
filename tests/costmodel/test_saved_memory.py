"""What autograd saves (hapc.frontend.saved) and the activation memory priced from it
(costmodel.memory.saved_values), checked against ground truth: each rule against autograd's own
saved-tensor hooks on small tensors, and whole models' predicted activation bytes against
what eager PyTorch saves on the CPU (issue 22: within 15%; the older rule, every output that
needs a gradient, was 1.8x over on a Llama slice)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from costmodel.cluster import load_cluster
from costmodel.memory import program_memory, saved_values
from hapc.frontend.modelfile import load_model_file
from hapc.frontend.saved import record_saved
from hapc.frontend.tracer import trace
from hapc.ir.graph import Graph, Node, Ref, TensorMeta, Value
from hapc.ir.precision import autocast_graph
from synth.baselines import baseline_program

ROOT = Path(__file__).resolve().parents[2]
ONE_DEVICE = {"name": "one", "nodes": [{"intra_link": "loopback", "devices": [
    {"name": "cpu", "tflops": 1, "memory_GB": 100, "hbm_GBps": 10, "count": 1}]}]}


def _one_node(op: str, shapes: list[tuple[int, ...]], *others, grad: bool = True, dtype: str = "float32") -> Graph:
    values = {f"x{i}": Value(f"x{i}", TensorMeta(s, dtype), "activation", requires_grad=grad)
              for i, s in enumerate(shapes)}
    values["y"] = Value("y", TensorMeta(shapes[0], dtype), "activation", requires_grad=grad)
    node = Node("n", op, tuple(Ref(f"x{i}") for i in range(len(shapes))) + others, {}, ("y",))
    return Graph(values, [node], list(values)[:-1], [], [], "y")


@pytest.mark.parametrize("op, shapes, others, saved", [
    ("aten.add.Tensor", [(4, 8), (4, 8)], (), ((), (), 0)),                  # a sum keeps nothing
    ("aten.mul.Tensor", [(4, 8), (4, 8)], (), ((0, 1), (), 0)),              # each factor for the other's gradient
    ("aten._softmax.default", [(4, 8)], (-1, False), ((), (0,), 0)),         # its own output
    ("aten.gelu.default", [(4, 8)], (), ((0,), (), 0)),
    ("aten.rsqrt.default", [(4, 8)], (), ((), (0,), 0)),
    ("aten.mean.dim", [(4, 8)], ([-1], True), ((), (), 0)),
    ("aten.view.default", [(4, 8)], ([32],), ((), (), 0)),
    ("aten.dropout.default", [(4, 8)], (0.1, True), ((), (), 4 * 8 * 4)),    # the mask, its own
])
def test_each_op_saves_what_autograd_saves(op, shapes, others, saved):
    assert record_saved(_one_node(op, shapes, *others)) == {"n": saved}


def test_fused_attention_saves_its_inputs_output_and_a_row_statistic_not_the_scores():
    graph = _one_node("aten.scaled_dot_product_attention.default", [(2, 4, 16, 8)] * 3)
    assert record_saved(graph) == {"n": ((0, 1, 2), (0,), 4 * 2 * 4 * 16)}


def test_an_op_meta_cannot_run_has_no_record_and_keeps_the_older_rule():
    graph = _one_node("aten.no_such_op.default", [(4, 8)])
    assert record_saved(graph) == {}


def test_a_value_saved_by_several_readers_counts_once_and_a_saved_view_keeps_its_base():
    mf = load_model_file(str(ROOT / "configs" / "models" / "gpt.py"), {"layers": 1, "dropout": 0.0})
    graph = trace(mf.build_model(), mf.build_inputs()).graph
    saved = saved_values(graph)
    producer = {o: n for n in graph.nodes for o in n.outputs}
    assert not any(producer[v].op in ("aten.view.default", "aten.reshape.default", "aten.t.default")
                   for v in saved.whole if v in producer)


def _saved_bytes(module: torch.nn.Module, inputs, precision: str) -> int:
    """What eager autograd saves for ``module(*inputs)``: each storage once, parameters not."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            storages[st.data_ptr()] = st.nbytes()
        return t

    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast:
        module(*inputs)
    return sum(storages.values())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("model, overrides", [
    ("gpt.py", {"layers": 2, "hidden": 128, "heads": 4, "seq": 64, "batch": 4, "vocab": 500, "dropout": 0.0}),
    ("hf_llama.py", {"layers": 2, "hidden": 256, "heads": 4, "mlp": 688, "seq": 256, "batch": 2, "vocab": 500}),
])
def test_predicted_activation_bytes_are_within_15_percent_of_what_autograd_saves(model, overrides, precision):
    mf = load_model_file(str(ROOT / "configs" / "models" / model), overrides)
    torch.manual_seed(0)
    module, inputs = mf.build_model(), mf.build_inputs()
    measured = _saved_bytes(module, inputs, precision)
    graph = autocast_graph(trace(module, inputs).graph, precision)
    cluster = load_cluster(ONE_DEVICE)
    predicted = program_memory(baseline_program("dp-even", graph, cluster), cluster).devices[0].activations_bytes
    assert predicted == pytest.approx(measured, rel=0.15)
