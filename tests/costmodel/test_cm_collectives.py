"""Collective costs against hand-computed alpha-beta numbers and their limiting cases."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.costmodel.cm_programs import custom_cluster

from costmodel import best_variant, collective_seconds, load_cluster
from costmodel.collectives import AUTO_VARIANTS, VARIANTS
from hapc.ir.shards import largest_remainder

A = 10e-6          # latency of the test link, seconds
BW = 10e9          # its bandwidth, bytes/s
FOUR = load_cluster(custom_cluster(devices=((1, 10, 100),) * 4, bandwidth_GBps=10, latency_us=10))


def test_ring_and_tree_all_reduce_by_hand():
    n = 1e9
    assert collective_seconds("all_reduce", [n] * 4, FOUR, variant="ring") == pytest.approx(6 * A + 1.5 * n / BW)
    assert collective_seconds("all_reduce", [n] * 4, FOUR, variant="tree") == pytest.approx(4 * A + 2 * n / BW)
    assert best_variant("all_reduce", [n] * 4, FOUR)[0] == "ring"
    assert best_variant("all_reduce", [8] * 4, FOUR)[0] == "tree"        # tiny message: latency wins


def test_gathers_broadcast_and_all_to_all_by_hand():
    pieces = [4e8, 3e8, 2e8, 1e8]
    assert collective_seconds("all_gather", pieces, FOUR, variant="ring") == pytest.approx(3 * A + 3 * 4e8 / BW)
    assert collective_seconds("reduce_scatter", pieces, FOUR, variant="padded") == pytest.approx(3 * A + 3 * 4e8 / BW)
    assert collective_seconds("all_gather", pieces, FOUR, variant="grouped") == pytest.approx(4 * 3 * A + 1e9 / BW)
    # all_to_all form of all_gather: rank 0 sends its piece three times, 1.2 GB.
    assert collective_seconds("all_gather", pieces, FOUR, variant="all_to_all") == pytest.approx(3 * A + 1.2e9 / BW)
    assert collective_seconds("broadcast", [1e9] * 4, FOUR, variant="ring") == pytest.approx(3 * A + 1e9 / BW)
    assert collective_seconds("reduce", [1e9] * 4, FOUR, variant="tree") == pytest.approx(2 * (A + 1e9 / BW))
    # Even all_to_all: each rank sends 3/4 of its 1 GB.
    assert collective_seconds("all_to_all", [1e9] * 4, FOUR) == pytest.approx(3 * A + 0.75e9 / BW)
    matrix = [[0, 5e8, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1e8, 0, 0, 0]]
    assert collective_seconds("all_to_all", [5e8, 0, 0, 1e8], FOUR, send_matrix=matrix) == \
        pytest.approx(3 * A + 5e8 / BW)


def test_one_device_has_no_communication():
    one = load_cluster(custom_cluster(devices=((1, 10, 100),)))
    for kind, variants in VARIANTS.items():
        for v in variants:
            assert collective_seconds(kind, [1e9], one, variant=v) == 0.0
    assert collective_seconds("all_reduce", [1e9], FOUR, ranks=[2]) == 0.0


def test_nothing_to_send_costs_nothing():
    assert collective_seconds("all_gather", [0, 0, 0, 0], FOUR) == 0.0


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_doubling_bandwidth_halves_the_beta_term(kind):
    slow = load_cluster(custom_cluster(devices=((1, 10, 100),) * 4, nodes=2, bandwidth_GBps=10, network_GBps=1))
    fast = load_cluster(custom_cluster(devices=((1, 10, 100),) * 4, nodes=2, bandwidth_GBps=20, network_GBps=2))
    pieces = [3e7, 1e7, 2e7, 2e7, 1e7, 1e7, 3e7, 1e7]
    for v in VARIANTS[kind]:
        def beta(cluster, v=v):     # alpha terms do not depend on size: t(2x) - t(x) is the beta term of x
            return (collective_seconds(kind, [2 * x for x in pieces], cluster, variant=v)
                    - collective_seconds(kind, pieces, cluster, variant=v))
        assert beta(fast) == pytest.approx(beta(slow) / 2), (kind, v)
        assert beta(slow) > 0


def test_padding_cost_grows_with_the_skew_of_the_shares():
    total = 10**8
    costs, best = [], []
    for big in (0.25, 0.4, 0.55, 0.7, 0.85):
        shares = [big] + [(1 - big) / 3] * 3
        pieces = largest_remainder(total, shares)
        costs.append(collective_seconds("all_gather", pieces, FOUR, variant="padded"))
        best.append(best_variant("all_gather", pieces, FOUR))
    assert costs == sorted(costs) and costs[-1] > 3 * costs[0]
    assert best[0][0] == "ring"                    # even pieces: padding costs nothing
    assert best[-1][0] == "grouped"                # one rank holds most: broadcasting pieces wins
    assert all(t <= c for (_, t), c in zip(best, costs))


def test_group_spanning_nodes_runs_at_the_slowest_link():
    two = load_cluster(custom_cluster(devices=((1, 10, 100),) * 2, nodes=2, bandwidth_GBps=10, latency_us=10,
                                      network_GBps=1, network_latency_us=50))
    inside = collective_seconds("all_reduce", [1e9, 1e9], two, ranks=[0, 1], variant="ring")
    across = collective_seconds("all_reduce", [1e9, 1e9], two, ranks=[1, 2], variant="ring")
    assert inside == pytest.approx(2 * 10e-6 + 1e9 / 10e9)
    assert across == pytest.approx(2 * 50e-6 + 1e9 / 1e9)


def test_hierarchical_beats_flat_across_a_slow_network_for_large_messages():
    c = load_cluster(Path(__file__).resolve().parents[2] / "configs/clusters/v100x16-2nodes-25gbps.yaml")
    for kind, n in (("all_reduce", [1e9] * 16), ("all_gather", [1e8] * 16), ("reduce_scatter", [1e8] * 16)):
        hier = collective_seconds(kind, n, c, variant="hierarchical")
        flat = min(collective_seconds(kind, n, c, variant=v) for v in AUTO_VARIANTS[kind] if v != "hierarchical")
        assert hier < 0.7 * flat, kind
        assert best_variant(kind, n, c)[0] == "hierarchical"
    # By hand: 2 nodes of 8, NVLink2 inside (150 GB/s, 3 us), 25 Gb/s between (30 us).
    nv_a, nv_b, net_a, net_b = 3e-6, 150e9, 30e-6, 25e9 / 8
    expect = 2 * (7 * nv_a + 7 / 8 * 1e9 / nv_b) + 2 * net_a + 1e9 / net_b
    assert collective_seconds("all_reduce", [1e9] * 16, c, variant="hierarchical") == pytest.approx(expect)


def test_hierarchical_within_one_node_is_the_ring_and_is_not_offered():
    assert collective_seconds("all_reduce", [1e9] * 4, FOUR, variant="hierarchical") == \
        pytest.approx(collective_seconds("all_reduce", [1e9] * 4, FOUR, variant="ring"))
    assert best_variant("all_reduce", [1e9] * 4, FOUR, variants=["hierarchical", "ring"])[0] == "ring"


def test_identical_devices_behave_as_a_homogeneous_cluster():
    named_apart = load_cluster({"nodes": [{"devices": [
        {"name": "a", "tflops": 1, "memory_GB": 10, "hbm_GBps": 100, "count": 2},
        {"name": "b", "tflops": 1, "memory_GB": 10, "hbm_GBps": 100, "count": 2}],
        "intra_link": {"bandwidth_GBps": 10, "latency_us": 10}}]})
    assert named_apart.is_homogeneous
    for kind in VARIANTS:
        for v in VARIANTS[kind]:
            assert collective_seconds(kind, [1e8] * 4, named_apart, variant=v) == \
                collective_seconds(kind, [1e8] * 4, FOUR, variant=v)


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="no variant"):
        collective_seconds("all_reduce", [1] * 4, FOUR, variant="grouped")
    with pytest.raises(ValueError, match="unknown collective"):
        collective_seconds("gather_all", [1] * 4, FOUR)
    with pytest.raises(ValueError, match="piece sizes"):
        collective_seconds("all_reduce", [1] * 3, FOUR, ranks=[0, 1])


def test_per_collective_link_numbers_price_each_kind_and_the_calls_variants_are_made_of():
    data = custom_cluster(devices=((1, 10, 100),) * 4, bandwidth_GBps=10, latency_us=10)
    data["nodes"][0]["intra_link"]["collectives"] = {
        "reduce_scatter": {"bandwidth_GBps": 2.5, "latency_us": 40},
        "broadcast": {"bandwidth_GBps": 20},
        "all_to_all": {"latency_us": 1}}
    cluster = load_cluster(data)
    pieces = [4e8, 3e8, 2e8, 1e8]
    # all-gather ring has no numbers of its own: the link's; reduce-scatter ring: its own
    assert collective_seconds("all_gather", pieces, cluster, variant="ring") == pytest.approx(3 * A + 3 * 4e8 / BW)
    assert collective_seconds("reduce_scatter", pieces, cluster, variant="ring") == \
        pytest.approx(3 * 40e-6 + 3 * 4e8 / 2.5e9)
    # a grouped all-gather is broadcasts, an all_to_all form is all_to_all_single
    assert collective_seconds("all_gather", pieces, cluster, variant="grouped") == \
        pytest.approx(4 * 3 * A + 1e9 / 20e9)
    assert collective_seconds("reduce_scatter", pieces, cluster, variant="all_to_all") == \
        pytest.approx(3 * 1e-6 + 1.2e9 / BW)
    # the slow reduce-scatter makes its all_to_all form the cheapest, as best_variant sees it
    assert best_variant("reduce_scatter", [1e8] * 4, cluster)[0] == "all_to_all"
    assert best_variant("reduce_scatter", [1e8] * 4, FOUR)[0] == "ring"
