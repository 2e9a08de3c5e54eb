"""Roofline compute cost: limits, dtype peaks, shard fractions, and the lower bound."""

from __future__ import annotations

import pytest
from tests.costmodel.cm_programs import chain_graph, custom_cluster

from costmodel import load_cluster, lower_bound_seconds, node_seconds, op_class
from costmodel.compute import graph_seconds, peak_dtype
from hapc.ir.graph import Cost, Graph, Node, Ref, TensorMeta, Value


def one_node_graph(op: str, cost: Cost, dtype: str = "float32") -> Graph:
    values = {"a": Value("a", TensorMeta((4, 4), dtype), "input"),
              "b": Value("b", TensorMeta((4, 4), dtype), "activation", requires_grad=True)}
    node = Node("n", op, (Ref("a"),), {}, ("b",), cost)
    return Graph(values, [node], ["a"], [], [], "b")


# 100 TFLOPS, 1000 GB/s; matmul at 50%, memory at 80%; no launch latency unless asked.
CLUSTER = load_cluster(custom_cluster(devices=((100.0, 16.0, 1000.0),), efficiency={"matmul": 0.5, "hbm": 0.8}))


def test_op_classes():
    assert op_class("aten.linear.default") == "matmul"
    assert op_class("aten.scaled_dot_product_attention.default") == "attention"
    assert op_class("aten.native_layer_norm.default") == "norm"
    assert op_class("aten.view.default") == "view"
    assert op_class("aten.gelu.default") == "elementwise"
    assert op_class("aten.embedding.default") == "embedding"
    assert op_class("my_custom_op") == "elementwise"


def test_compute_bound_limit():
    g = one_node_graph("aten.mm.default", Cost(1e12, 2e12, 1e6, 2e6))
    t = node_seconds(g.nodes[0], g, CLUSTER.devices[0], CLUSTER)
    assert t.fwd_seconds == pytest.approx(1e12 / (100e12 * 0.5))     # 0.02 s: FLOPs dominate
    assert t.bwd_seconds == pytest.approx(2e12 / (100e12 * 0.5))


def test_memory_bound_limit():
    g = one_node_graph("aten.add.Tensor", Cost(1e6, 2e6, 1e9, 3e9))
    t = node_seconds(g.nodes[0], g, CLUSTER.devices[0], CLUSTER)
    assert t.fwd_seconds == pytest.approx(1e9 / (1000e9 * 0.8))      # 1.25 ms: bytes dominate
    assert t.bwd_seconds == pytest.approx(3e9 / (1000e9 * 0.8))


def test_fraction_scales_work_and_launch_latency_is_added_once():
    cluster = load_cluster(custom_cluster(devices=((100.0, 16.0, 1000.0),), efficiency={"matmul": 0.5},
                                          launch_latency_us=10))
    g = one_node_graph("aten.mm.default", Cost(1e12, 0.0, 0.0, 0.0))
    half = node_seconds(g.nodes[0], g, cluster.devices[0], cluster, fraction=0.5)
    assert half.fwd_seconds == pytest.approx(0.01 + 10e-6)
    assert half.bwd_seconds == 0.0                                     # no backward work, no kernel
    assert node_seconds(g.nodes[0], g, cluster.devices[0], cluster, fraction=0.0).total_seconds == 0.0


def test_views_are_free():
    g = one_node_graph("aten.view.default", Cost(1e9, 1e9, 1e9, 1e9))
    assert node_seconds(g.nodes[0], g, CLUSTER.devices[0], CLUSTER).total_seconds == 0.0


def test_dtype_selects_the_peak_and_tf32_needs_permission():
    a100 = load_cluster({"nodes": [{"devices": [{"type": "A100-80GB", "count": 1}]}]})
    tf32 = load_cluster({"nodes": [{"devices": [{"type": "A100-80GB", "count": 1}]}], "allow_tf32": True})
    mm = one_node_graph("aten.mm.default", Cost(1e12, 0, 0, 0))
    add = one_node_graph("aten.add.Tensor", Cost(1e12, 0, 0, 0))
    assert peak_dtype(mm.nodes[0], mm, a100.allow_tf32) == "fp32"
    assert peak_dtype(mm.nodes[0], mm, tf32.allow_tf32) == "tf32"
    assert peak_dtype(add.nodes[0], add, tf32.allow_tf32) == "fp32"       # no TF32 outside matrix units
    bf16 = one_node_graph("aten.mm.default", Cost(1e12, 0, 0, 0), dtype="bfloat16")
    assert peak_dtype(bf16.nodes[0], bf16) == "bf16"
    launch = a100.launch_latency_seconds
    t32 = node_seconds(mm.nodes[0], mm, a100.devices[0], a100).fwd_seconds - launch
    t16 = node_seconds(bf16.nodes[0], bf16, a100.devices[0], a100).fwd_seconds - launch
    assert t32 / t16 == pytest.approx(312 / 19.5, rel=1e-3)


def test_backward_uses_the_ops_own_cost_not_a_blanket_2x():
    g = one_node_graph("aten.mm.default", Cost(1e12, 1e12, 0, 0))       # e.g. only the weight gradient
    t = node_seconds(g.nodes[0], g, CLUSTER.devices[0], CLUSTER)
    assert t.bwd_seconds == pytest.approx(t.fwd_seconds)


def test_lower_bound_is_total_flops_over_cluster_flops():
    g = chain_graph(widths=(4, 4, 4), flops_per_layer=1e12)             # 2 layers x (1 + 2) TFLOP
    cluster = load_cluster(custom_cluster(devices=((100.0, 16, 1000), (50.0, 16, 1000)),
                                          efficiency={"matmul": 0.5}))
    assert lower_bound_seconds(g, cluster) == pytest.approx(6e12 / (150e12 * 0.5))
    single = graph_seconds(g, cluster, rank=0)
    assert single.total_seconds == pytest.approx(6e12 / (100e12 * 0.5))
