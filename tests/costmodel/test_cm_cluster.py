"""Cluster files: the examples load, catalogs resolve, and every bad file gives one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from costmodel import load_cluster
from costmodel.cluster import Link
from costmodel.catalog import device_names, device_spec, link_spec
from hapc.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "configs" / "clusters").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_cluster_loads_and_round_trips(path):
    cluster = load_cluster(path)
    assert cluster.world >= 1
    assert [d.index for d in cluster.devices] == list(range(cluster.world))
    assert load_cluster(cluster.to_dict()) == cluster
    assert load_cluster(cluster) is cluster
    assert cluster.name in repr(cluster)


def test_example_set_is_complete():
    by_name = {p.stem: load_cluster(p) for p in EXAMPLES}
    assert len(by_name) >= 8
    hap = next(c for n, c in by_name.items() if "hap-paper" in n)
    assert hap.world == 64 and len(hap.nodes) == 8
    assert hap.network.bandwidth_Bps == pytest.approx(10e9 / 8)
    mixed = next(c for n, c in by_name.items() if "mixed" in n)
    assert mixed.world == 4 and not mixed.is_homogeneous
    assert any(c.world == 4 and c.devices[0].type == "cpu" for c in by_name.values())


def test_device_order_is_node_by_node_then_group_by_group():
    c = load_cluster({"nodes": [
        {"count": 2, "devices": [{"type": "V100", "count": 2}, {"type": "T4", "count": 1}], "intra_link": "pcie3"},
        {"devices": [{"type": "A100-80GB", "count": 1}]}], "network": "ethernet25g"})
    assert [(d.node, d.type) for d in c.devices] == [
        (0, "V100-32GB"), (0, "V100-32GB"), (0, "T4"), (1, "V100-32GB"), (1, "V100-32GB"), (1, "T4"),
        (2, "A100-80GB")]
    assert c.nodes[2].intra_link is None
    assert c.describe() == "2x(2x V100-32GB + 1x T4) + 1x A100-80GB"


def test_catalog_lookup_is_tolerant_and_in_base_units():
    assert device_spec("a100_80gb") is device_spec("A100-80GB") is device_spec("a100 80GB")
    assert device_spec("v100").name == "V100-32GB"
    assert device_spec("rtx-4090").name == "RTX4090"
    for name in ("V100-16GB", "V100-32GB", "P100-16GB", "T4", "A10", "L4", "A100-40GB", "A100-80GB",
                 "H100", "RTX3090", "RTX4090", "MI250", "cpu"):
        spec = device_spec(name)
        assert spec is not None and set(spec.tflops) == {"fp32", "tf32", "bf16", "fp16"}, name
    for name in ("nvlink1", "NVLink-3", "nvlink4", "pcie3", "PCIe_4", "pcie5", "ethernet10g", "ethernet25g",
                 "ethernet100g", "infiniband-hdr", "InfiniBand NDR"):
        assert link_spec(name) is not None, name
    c = load_cluster({"nodes": [{"devices": [{"type": "A100-40GB", "count": 1}]}]})
    d = c.devices[0]
    assert d.peak_flops["bf16"] == 312e12 and d.peak_flops["fp32"] == 19.5e12
    assert d.memory_bytes == 40_000_000_000 and d.hbm_bandwidth_Bps == 1555e9


def test_custom_devices_links_and_overrides():
    c = load_cluster({
        "name": "custom",
        "nodes": [{"devices": [{"name": "fast", "tflops": {"fp32": 2, "bf16": 8}, "memory_GB": 4, "hbm_GBps": 50,
                                "count": 2},
                               {"type": "T4", "memory_GB": 8, "count": 1}],
                   "intra_link": {"bandwidth_Gbps": 80, "latency_us": 2}}],
        "efficiency": {"matmul": 0.9}, "allow_tf32": True, "launch_latency_us": 7})
    fast, t4 = c.devices[0], c.devices[2]
    assert fast.type == "fast" and fast.peak_flops == {"fp32": 2e12, "tf32": 2e12, "bf16": 8e12, "fp16": 2e12}
    assert t4.memory_bytes == 8e9 and t4.peak_flops["fp16"] == 65e12
    assert c.nodes[0].intra_link.bandwidth_Bps == 10e9 and c.nodes[0].intra_link.latency_seconds == 2e-6
    assert c.efficiency["matmul"] == 0.9 and c.efficiency["elementwise"] == 0.5
    assert c.allow_tf32 and c.launch_latency_seconds == pytest.approx(7e-6)
    assert load_cluster(c.to_dict()) == c


def test_group_link_is_the_slowest_and_homogeneity():
    c = load_cluster({"nodes": [{"count": 2, "devices": [{"type": "V100", "count": 4}], "intra_link": "nvlink2"}],
                      "network": {"bandwidth_GBps": 1, "latency_us": 40}})
    assert c.group_link([0, 1]).name == "nvlink2"
    assert c.group_link([0, 4]).bandwidth_Bps == 1e9
    assert c.group_link([0]) is None
    assert c.link(0, 5) is c.network and c.link(1, 2) is c.nodes[0].intra_link
    assert c.is_homogeneous and c.flops_shares() == (1 / 8,) * 8


# ---- bad files: one line naming the file, the field and what was expected ----------------------

BAD = {
    "unknown_type": ("nodes:\n  - devices: [{type: NoSuchGPU, count: 2}]\n    intra_link: pcie3\n",
                     "nodes[0].devices[0].type", "unknown device type"),
    "missing_count": ("nodes:\n  - devices: [{type: V100, count: 2}, {type: T4}]\n    intra_link: pcie3\n",
                      "nodes[0].devices[1].count", "missing"),
    "bandwidth_without_unit": ("nodes:\n  - devices: [{type: V100, count: 2}]\n    intra_link: {bandwidth: 25}\n",
                               "nodes[0].intra_link.bandwidth", "bandwidth_Gbps"),
    "network_bare_number": ("nodes:\n  - count: 2\n    devices: [{type: T4, count: 1}]\nnetwork: 25\n",
                            "network", "bandwidth_GBps"),
    "negative_count": ("nodes:\n  - devices: [{type: V100, count: -2}]\n", "nodes[0].devices[0].count", "positive"),
    "negative_bandwidth": ("nodes:\n  - devices: [{type: V100, count: 2}]\n    intra_link: {bandwidth_GBps: -5}\n",
                           "nodes[0].intra_link.bandwidth_GBps", "positive"),
    "negative_tflops": ("nodes:\n  - devices: [{name: x, tflops: -1, memory_GB: 3, hbm_GBps: 4, count: 1}]\n",
                        "nodes[0].devices[0].tflops", "positive"),
    "empty_cluster": ("name: nothing here\nnodes: []\n", "nodes", "empty cluster"),
    "empty_file": ("", "nodes", "empty cluster"),
    "broken_yaml": ("nodes: [\n  {devices: \n", "not valid YAML", "line"),
    "missing_network": ("nodes:\n  - count: 2\n    devices: [{type: T4, count: 1}]\n", "network", "missing"),
    "missing_intra_link": ("nodes:\n  - devices: [{type: T4, count: 2}]\n", "nodes[0].intra_link", "missing"),
    "custom_without_memory": ("nodes:\n  - devices: [{name: x, tflops: 1, hbm_GBps: 4, count: 1}]\n",
                              "nodes[0].devices[0].memory_GB", "missing"),
    "typo_field": ("nodes:\n  - devices: [{type: T4, cuont: 1}]\n", "nodes[0].devices[0].cuont", "unknown field"),
    "unknown_link": ("nodes:\n  - devices: [{type: T4, count: 2}]\n    intra_link: nvlink9\n",
                     "nodes[0].intra_link", "unknown link"),
    "unknown_collective": ("nodes:\n  - devices: [{type: T4, count: 2}]\n    intra_link: {bandwidth_GBps: 5, "
                           "collectives: {allreduce: {latency_us: 3}}}\n",
                           "nodes[0].intra_link.collectives.allreduce", "unknown collective"),
    "collective_bare_number": ("nodes:\n  - devices: [{type: T4, count: 2}]\n    intra_link: {bandwidth_GBps: 5, "
                               "collectives: {broadcast: 3}}\n",
                               "nodes[0].intra_link.collectives.broadcast", "bandwidth_GBps"),
    "overlap_above_one": ("nodes:\n  - devices: [{type: T4, count: 1}]\ncomm_overlap: 1.5\n",
                          "comm_overlap", "[0, 1]"),
    "bad_efficiency": ("nodes:\n  - devices: [{type: T4, count: 1}]\nefficiency: {matmul: 1.5}\n",
                       "efficiency.matmul", "(0, 1]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_cluster_file_gives_one_line(tmp_path, case):
    text, field, expected = BAD[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_cluster(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path) + ": ")
    assert field in message and expected in message, message


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(UserError, match=r"nope\.yaml: no such cluster file"):
        load_cluster(tmp_path / "nope.yaml")


def test_unknown_type_lists_known_names(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(BAD["unknown_type"][0])
    with pytest.raises(UserError) as info:
        load_cluster(path)
    assert device_names()[0] in str(info.value) and "tflops" in str(info.value)


def test_dict_errors_name_a_placeholder_file():
    with pytest.raises(UserError, match=r"^<cluster dict>: nodes\[0\]\.devices\[0\]\.count"):
        load_cluster({"nodes": [{"devices": [{"type": "T4", "count": 0}]}]})



def test_per_collective_link_numbers_load_default_and_round_trip():
    text = ("nodes:\n  - devices: [{type: T4, count: 2}]\n    intra_link: {name: gloo, bandwidth_GBps: 2, "
            "latency_us: 100, collectives: {reduce_scatter: {bandwidth_GBps: 0.5, latency_us: 900}, "
            "broadcast: {latency_us: 40}}}\n")
    cluster = load_cluster(yaml.safe_load(text))
    link = cluster.nodes[0].intra_link
    assert link.for_kind("reduce_scatter").bandwidth_Bps == pytest.approx(0.5e9)
    assert link.for_kind("reduce_scatter").latency_seconds == pytest.approx(900e-6)
    assert link.for_kind("broadcast").bandwidth_Bps == pytest.approx(2e9)      # the link's own bandwidth
    assert link.for_kind("broadcast").latency_seconds == pytest.approx(40e-6)
    assert link.for_kind("all_reduce") == Link("gloo", link.bandwidth_Bps, link.latency_seconds)
    assert load_cluster(cluster.to_dict()) == cluster
    scaled = link.scaled(bandwidth=2.0, latency=0.5)
    assert scaled.for_kind("reduce_scatter").bandwidth_Bps == pytest.approx(1e9)
    assert scaled.for_kind("reduce_scatter").latency_seconds == pytest.approx(450e-6)
    view = cluster.for_collective("reduce_scatter")
    assert view.nodes[0].intra_link.bandwidth_Bps == pytest.approx(0.5e9) and not view.nodes[0].intra_link.per_kind
    assert cluster.for_collective("reduce_scatter") is view                      # built once
    plain = load_cluster(ROOT / "configs" / "clusters" / "small-mixed.yaml")
    assert plain.for_collective("all_gather") is plain


@pytest.mark.parametrize("node_count, per_node, field", [(10**9, 8, r"nodes\[1\]\.count"), (1, 10**9, r"nodes\[1\]\.devices")])
def test_a_cluster_too_large_to_plan_is_refused_before_any_device_is_built(node_count, per_node, field):
    """A typo in a count must not allocate a billion devices before the error (the check runs
    on the counts alone)."""
    import tracemalloc

    from costmodel.cluster_file import MAX_DEVICES

    spec = {"nodes": [{"devices": [{"type": "V100-32GB", "count": 2}], "intra_link": "nvlink2"},
                      {"count": node_count, "devices": [{"type": "A100-80GB", "count": per_node}],
                       "intra_link": "nvlink3"}],
            "network": {"bandwidth_Gbps": 100, "latency_us": 5}}
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match=rf"{field}: .* {2 + node_count * per_node} devices; hapc plans clusters "
                                            rf"of at most {MAX_DEVICES}"):
            load_cluster(spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10**7


def test_a_short_name_with_two_memory_sizes_is_noted_once():
    spec = {"nodes": [{"devices": [{"type": "A100", "count": 2}, {"type": "a100", "count": 1},
                                   {"type": "V100", "count": 1, "memory_GB": 16}], "intra_link": "nvlink3"}]}
    cluster = load_cluster(spec)
    assert cluster.notes == ["<cluster dict>: nodes[0].devices[0].type A100 is read as A100-40GB (40 GB); "
                             "say A100-80GB if yours has 80 GB"]
    assert load_cluster({"nodes": [{"devices": [{"type": "A100-80GB", "count": 1}]}]}).notes == []
