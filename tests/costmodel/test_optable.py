"""Per-op times measured on the device: signatures, interpolation, the cost model's use of
them, the cache across runs, and tables that must be ignored (another device or torch)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import hapc
from costmodel.cluster import load_cluster
from costmodel.compute import node_seconds
from costmodel.optable import MeasuredTableIgnored, OpTable, _interpolate, signature, table_path
from hapc.api import baseline
from profiler.ops import profile_ops

ROOT = Path(__file__).resolve().parents[2]
CPU4 = ROOT / "configs" / "clusters" / "cpu4.yaml"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(12, 12), nn.Linear(12, 12), nn.Linear(12, 5)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.c(torch.relu(self.b(torch.relu(self.a(x))))), y)


@pytest.fixture(scope="module")
def traced():
    torch.manual_seed(0)
    return hapc.trace(Net(), (torch.randn(16, 12), torch.randint(0, 5, (16,))))


def test_repeated_layers_share_a_signature_and_shapes_tell_apart(traced):
    from tests.runs import traced_small

    gpt = traced_small("gpt")[0].graph
    blocks = [n for n in gpt.nodes if n.op == "aten.layer_norm.default"]
    assert len({signature(n, gpt) for n in blocks}) == 1       # every block's norms: one timing
    linears = [n for n in traced.graph.nodes if n.op == "aten.linear.default"]
    a, b, c = (signature(n, traced.graph) for n in linears)
    assert a != b          # the first layer's input needs no gradient
    assert b != c          # another output width


def test_interpolation_between_measured_pieces():
    points = [(0.25, 1.0, 2.0), (0.5, 1.5, 3.0), (1.0, 3.0, 6.0)]
    assert _interpolate(points, 1.0) == (3.0, 6.0)
    assert _interpolate(points, 0.75) == pytest.approx((2.25, 4.5))
    assert _interpolate(points, 0.125) == pytest.approx((0.5, 1.0))     # proportional below


def test_profile_writes_a_table_the_cost_model_uses_and_caches(traced, tmp_path):
    cluster_file = tmp_path / "cpu4.yaml"
    shutil.copyfile(CPU4, cluster_file)
    said: list[str] = []
    table = profile_ops(traced.graph, cluster_file, "cpu", torch.device("cpu"), min_seconds=0.0, say=said.append)
    assert table_path(cluster_file).exists() and len(table.entries) >= 5
    assert all(p[1] > 0 for pts in table.entries.values() for p in pts)
    said.clear()
    profile_ops(traced.graph, cluster_file, "cpu", torch.device("cpu"), say=said.append)
    assert "timing 0" in said[0]                                     # nothing re-timed

    cluster = load_cluster(cluster_file)
    assert cluster.op_table is not None
    node = next(n for n in traced.graph.nodes if n.op == "aten.linear.default")
    measured = node_seconds(node, traced.graph, cluster.devices[0], cluster, 0.5)
    want = cluster.op_table.lookup_seconds(node, traced.graph, 0.5)
    assert (measured.fwd_seconds, measured.bwd_seconds) == want
    roofline = node_seconds(node, traced.graph, cluster.devices[0], load_cluster(CPU4), 0.5)
    assert roofline.fwd_seconds != measured.fwd_seconds

    plan = baseline(traced, None, cluster, "dp-even")
    assert "op nodes priced from times measured on cpu" in plan.summary()
    again = hapc.Plan.from_dict(plan.to_dict())                   # the plan carries its table
    assert again.cost == pytest.approx(plan.cost)


def test_a_table_from_another_device_or_torch_is_ignored_with_a_warning(traced, tmp_path):
    cluster_file = tmp_path / "cpu4.yaml"
    shutil.copyfile(CPU4, cluster_file)
    for device, version, why in (("H200", torch.__version__, "not a device of this cluster"),
                                 ("cpu", "1.0.0", "torch 1.0.0")):
        OpTable(device, "x", version, {"k": [(1.0, 1.0, 1.0)]}).save(table_path(cluster_file))
        with pytest.warns(MeasuredTableIgnored, match=why):
            assert load_cluster(cluster_file).op_table is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table_path(cluster_file).unlink()
        assert load_cluster(cluster_file).op_table is None
