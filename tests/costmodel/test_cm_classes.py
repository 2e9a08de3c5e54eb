"""Growth with the cluster: the cost model works per class of alike ranks, per node and per
class of identical devices, and must give exactly what rank-by-rank work gives."""

from __future__ import annotations

import random

import pytest

import costmodel.memory as memory_module
import costmodel.simulator as simulator_module
from costmodel import load_cluster, simulate
from costmodel.classes import RankClasses, rank_classes
from costmodel.collectives import OverlapSends, collective_seconds
from hapc.ir.layout import R, Shard
from hapc.ir.program import Redistribute
from tests.costmodel.cm_programs import chain_graph, custom_cluster, data_parallel, zero3

# 3 nodes x (2 fast + 1 slow + 1 medium): 12 ranks, three kinds, uneven shares.
MIXED = load_cluster(custom_cluster(devices=((4, 10, 200), (4, 10, 200), (1, 10, 100), (2, 10, 150)), nodes=3,
                                    efficiency={"matmul": 0.5}))
GROWTH256 = load_cluster("configs/clusters/a100x128-v100x128-256gpu.yaml")


def _shares(cluster) -> tuple[float, ...]:
    return tuple(cluster.flops_shares())


def _with_all_to_all(prog):
    """``prog`` plus a Shard(0) -> Shard(1) -> Shard(0) round trip of the first activation."""
    prog.steps[1:1] = [Redistribute("y0", "y0@cols", Shard(0), Shard(1)),
                       Redistribute("y0@cols", "y0@rows", Shard(1), Shard(0))]
    prog.invalidate()
    return prog


def _programs(cluster, batch: int):
    graph = chain_graph(batch=batch, widths=(6, 12, 6))
    return [data_parallel(graph, _shares(cluster)), zero3(graph, _shares(cluster)),
            _with_all_to_all(data_parallel(graph, _shares(cluster)))]


def _one_class_per_rank(program, cluster) -> RankClasses:
    ranks = tuple(range(program.world))
    return RankClasses(ranks, ranks)


@pytest.mark.parametrize("cluster, batch", [(MIXED, 37), (MIXED, 12), (GROWTH256, 512)],
                         ids=["mixed-uneven", "mixed-short", "256"])
def test_simulation_by_class_is_the_simulation_by_rank(cluster, batch, monkeypatch):
    by_class = [simulate(p, cluster) for p in _programs(cluster, batch)]
    monkeypatch.setattr(simulator_module, "rank_classes", _one_class_per_rank)
    monkeypatch.setattr(memory_module, "rank_classes", _one_class_per_rank)
    by_rank = [simulate(p, cluster) for p in _programs(cluster, batch)]
    for a, b in zip(by_class, by_rank):
        assert a.to_dict() == b.to_dict()          # the same floats, not merely close ones
        assert [(e.label, e.start_seconds, e.end_seconds) for e in a.events] == \
            [(e.label, e.start_seconds, e.end_seconds) for e in b.events]


def test_classes_follow_device_kinds_not_devices():
    # Two kinds of device, equal shares within a kind: a handful of classes for 256 ranks
    # (integer batch pieces differ by one sample inside a kind, and rank 0 is its own).
    for prog in _programs(GROWTH256, 512):
        classes = rank_classes(prog, GROWTH256)
        assert classes.world == 256 and classes.count <= 8
        assert classes.expand(classes.pick(list(range(256)))) == [classes.representatives[c]
                                                                  for c in classes.class_of]
    # Uneven pieces split a kind where its pieces differ, and nowhere else.
    prog = _programs(MIXED, 37)[0]
    lengths = prog.lengths("x", 0)
    classes = rank_classes(prog, MIXED)
    for r in range(MIXED.world):
        rep = classes.representatives[classes.class_of[r]]
        assert lengths[r] == lengths[rep] and MIXED.devices[r].type == MIXED.devices[rep].type


def test_overlap_sends_price_as_the_written_out_matrix():
    rng = random.Random(3)
    cluster = load_cluster("configs/clusters/hap-paper-v100x16-p100x48.yaml")
    for trial in range(30):
        p = rng.choice([2, 3, 8, 13, 64])
        before = [rng.choice([0.0, rng.random() * 1e6]) for _ in range(p)]
        weights = [rng.random() for _ in range(p)]
        after = [sum(before) * w / sum(weights) for w in weights]
        ranks = rng.sample(range(64), p) if trial % 2 else None
        sends = OverlapSends(before, after, sum(before))
        written = tuple(sends[r] for r in range(p))
        assert sends == written and sends.transposed() == tuple(zip(*written))
        for variant in ("pairwise", "tree"):
            closed = collective_seconds("all_to_all", before, cluster, ranks, variant, send_matrix=sends)
            summed = collective_seconds("all_to_all", before, cluster, ranks, variant, send_matrix=written)
            assert closed == pytest.approx(summed, rel=1e-12, abs=1e-18)


def test_group_shape_is_made_once_and_matches_the_nodes():
    shape = GROWTH256.group_shape()
    assert GROWTH256.group_shape(range(256)) is shape and len(shape.by_node) == 32
    assert GROWTH256.group_link() is shape.link and shape.link.name == GROWTH256.network.name
    part = GROWTH256.group_shape([3, 9, 8, 130])
    assert part.by_node == ((3,), (8, 9), (130,)) and part.positions == ((0,), (1, 2), (3,))
    assert GROWTH256.ranks_by_node([3, 9, 8, 130]) == [[3], [8, 9], [130]]
    assert GROWTH256.group_link([0, 1]).name == "nvlink3"


def test_memory_without_a_cluster_still_works():
    prog = _programs(MIXED, 37)[1]
    report = memory_module.program_memory(prog)
    assert len(report.devices) == MIXED.world and report.capacity_bytes is None
    assert [d.params_bytes for d in report.devices] == \
        [sum(prog.lengths(w, 0)[r] * prog.shape(w)[1] * 4 for w in ("w0", "w1")) for r in range(MIXED.world)]


def test_without_sharded_dimensions_the_classes_are_device_kinds_and_rank_0():
    # A program with no sharded dimension at all: classes are device kinds and rank 0.
    graph = chain_graph(batch=4, widths=(4, 4))
    prog = data_parallel(graph, _shares(MIXED))
    prog.source_layouts["x"] = R
    prog.steps = []
    prog.invalidate()
    classes = rank_classes(prog, MIXED)
    assert classes.count == 4     # rank 0, then the fast, slow and medium kinds


def test_the_table_of_a_big_cluster_has_one_row_per_run_of_alike_ranks():
    table = simulate(_programs(GROWTH256, 512)[0], GROWTH256).table().splitlines()
    rows = table[3:]
    assert table[2].split()[:3] == ["rank", "node", "device"]
    assert 2 <= len(rows) <= 8                                # not 256
    assert rows[0].split()[0].startswith("0") and rows[0].split()[2] == "A100-80GB"
    assert rows[-1].split()[0].endswith("255") and rows[-1].split()[1].endswith("31")
    assert rows[-1].split()[2] == "V100-32GB"
    small = simulate(_programs(MIXED, 37)[0], MIXED).table().splitlines()
    assert len(small) == 3 + MIXED.world                      # small clusters: every rank
