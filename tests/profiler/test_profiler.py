"""The profiler and calibration: fits on synthetic data, cluster files that load, merges that
keep topology, and (slow) a real profile of two ranks on this machine."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from costmodel.cluster import load_cluster
from costmodel.cluster_file import parse_cluster, read_cluster_file
from costmodel.compute import roofline_seconds
from profiler.calibrate import (
    apply_knobs,
    fit,
    fit_scales,
    fitted_cluster_data,
    median_relative_error,
    ordered_pairs,
    parse_knobs,
    rank_correlation,
    write_fitted,
)
from hapc.errors import UserError
from profiler.clusterfile import build_cluster, group_ranks, merge_cluster, write_cluster_file
from profiler.comm import CommSample
from profiler.fit import coefficients, fit_link, predicted_seconds
from profiler.launch import RunResult, parse_steps, torchrun_command
from profiler.opclass_bench import OpCost, solve_efficiency
from profiler.pin import parse_affinity
from profiler.profile import read_affinity

REPO = Path(__file__).resolve().parents[2]
CLUSTERS = REPO / "configs" / "clusters"


# ---- synthetic measurements ---------------------------------------------------------------------

def _device(gflops: float, hbm_GBps: float = 10.0, launch_us: float = 8.0, name: str = "cpu") -> dict:
    return {"name": name, "peak_flops": {"fp32": gflops * 1e9, "bf16": gflops * 1e7, "fp16": gflops * 1e7},
            "memory_bytes": 8 * 10**9, "hbm_bandwidth_Bps": hbm_GBps * 1e9, "launch_seconds": launch_us * 1e-6,
            "skipped": {"tf32": "TF32 exists only on GPUs"}}


def _raw(devices: list[dict], nodes: list[list[int]] | None = None, classes: dict | None = None) -> dict:
    ranks = [{"rank": i, "host": "h", "device": d, "op_classes": classes or {}} for i, d in enumerate(devices)]
    return {"world": len(devices), "device_type": "cpu", "threads": 1, "affinity": None,
            "nodes": nodes or [list(range(len(devices)))], "ranks": ranks, "collectives": [],
            "skipped_collectives": {}, "torch": "x", "quick": True}


def _samples(alpha: float, bandwidth: float, ranks: int = 2, link: str = "intra") -> list[CommSample]:
    out = []
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        for nbytes in (4096, 65536, 1 << 20, 1 << 23):
            s = CommSample(link, kind, ranks, float(nbytes), 0.0)
            out.append(CommSample(link, kind, ranks, float(nbytes), predicted_seconds(s, alpha, bandwidth)))
    return out


# ---- alpha-beta fit -----------------------------------------------------------------------------

def test_coefficients_follow_the_cost_model_formulas():
    # ring all-reduce over p ranks: 2(p-1) steps and 2(p-1)/p of the tensor through each link
    assert coefficients("all_reduce", 2, 1000.0) == pytest.approx((2.0, 1000.0), rel=1e-9)
    assert coefficients("all_reduce", 4, 1000.0) == pytest.approx((6.0, 1500.0), rel=1e-9)
    # ring all-gather of pieces m: (p-1) steps, (p-1) m bytes
    assert coefficients("all_gather", 3, 100.0) == pytest.approx((2.0, 200.0), rel=1e-9)
    assert coefficients("broadcast", 3, 100.0) == pytest.approx((2.0, 100.0), rel=1e-9)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_fit_link_recovers_known_alpha_and_beta(ranks):
    alpha, bandwidth = 45e-6, 2.5e9
    fitted = fit_link(_samples(alpha, bandwidth, ranks))
    assert fitted.latency_seconds == pytest.approx(alpha, rel=1e-6)
    assert fitted.bandwidth_Bps == pytest.approx(bandwidth, rel=1e-6)
    assert fitted.median_rel_error < 1e-6


def test_fit_link_with_noise_stays_close():
    import random

    rng = random.Random(0)
    alpha, bandwidth = 120e-6, 0.8e9
    noisy = [CommSample(s.link, s.kind, s.ranks, s.piece_bytes, s.seconds * (1 + rng.uniform(-0.1, 0.1)))
             for s in _samples(alpha, bandwidth, 3)]
    fitted = fit_link(noisy)
    assert fitted.latency_seconds == pytest.approx(alpha, rel=0.15)
    assert fitted.bandwidth_Bps == pytest.approx(bandwidth, rel=0.15)
    assert fitted.median_rel_error < 0.1


def test_fit_link_fits_each_collective_on_its_own():
    own = {"all_reduce": (300e-6, 1.0e9), "all_gather": (80e-6, 0.6e9), "reduce_scatter": (900e-6, 0.3e9),
           "all_to_all": (50e-6, 0.7e9), "broadcast": (30e-6, 2.6e9)}
    samples = [CommSample(s.link, s.kind, s.ranks, s.piece_bytes, predicted_seconds(s, *own[s.kind]))
               for s in _samples(1e-5, 1e9)]
    fitted = fit_link(samples)
    for kind, (alpha, bandwidth) in own.items():
        assert fitted.per_kind[kind][0] == pytest.approx(alpha, rel=1e-6)
        assert fitted.per_kind[kind][1] == pytest.approx(bandwidth, rel=1e-6)
    assert fitted.median_rel_error < 1e-6 < 0.1 < fitted.joint_rel_error      # one alpha-beta cannot fit all
    link = fitted.as_link("gloo")
    assert link.for_kind("reduce_scatter").bandwidth_Bps == pytest.approx(0.3e9, rel=1e-6)
    data = build_cluster(_raw([_device(50.0)] * 2), fitted, None, "two")
    entry = data["nodes"][0]["intra_link"]["collectives"]
    assert entry["reduce_scatter"] == {"bandwidth_GBps": pytest.approx(0.3, rel=1e-3),
                                       "latency_us": pytest.approx(900, rel=1e-3)}
    cluster = parse_cluster(data)
    assert cluster.nodes[0].intra_link.for_kind("broadcast").bandwidth_Bps == pytest.approx(2.6e9, rel=1e-3)


def test_fit_link_needs_two_timings():
    with pytest.raises(ValueError):
        fit_link(_samples(1e-5, 1e9)[:1])


# ---- efficiency from a timed op -----------------------------------------------------------------

def test_solve_efficiency_inverts_the_roofline():
    cost = OpCost(4e8, 8e8, 2e6, 4e6)
    peak, hbm, launch = 50e9, 10e9, 5e-6
    for eff in (0.9, 0.3, 0.01):
        seconds = (roofline_seconds(cost.fwd_flops, cost.fwd_bytes, peak, eff, hbm, 1.0, launch)
                   + roofline_seconds(cost.bwd_flops, cost.bwd_bytes, peak, eff, hbm, 1.0, launch))
        assert solve_efficiency(cost, seconds, peak, hbm, launch) == pytest.approx(eff, rel=1e-6)


def test_solve_efficiency_of_an_op_faster_than_its_memory_roofline_is_one():
    memory_bound = OpCost(1e3, 2e3, 8e6, 16e6)           # 2.4 ms of memory traffic at 10 GB/s
    assert solve_efficiency(memory_bound, 1e-3, 50e9, 10e9, 5e-6) == 1.0


# ---- cluster files ------------------------------------------------------------------------------

def test_new_cluster_file_loads_and_round_trips(tmp_path):
    raw = _raw([_device(70), _device(35), _device(34)],
               classes={"matmul": {"efficiency": 0.9}, "norm": {"efficiency": 0.02}})
    intra = fit_link(_samples(60e-6, 1.5e9, 3))
    data = build_cluster(raw, intra, None, "testbed")
    path = tmp_path / "cluster.yaml"
    cluster = write_cluster_file(path, data, ["measured for a test", "# hapc-affinity: 0,1,1"])
    again = read_cluster_file(path)
    assert again == cluster
    assert load_cluster(again.to_dict()) == again
    # one fast device and a group of two slow ones, in rank order
    groups = data["nodes"][0]["devices"]
    assert [g["count"] for g in groups] == [1, 2]
    assert again.devices[0].peak_flops["fp32"] == pytest.approx(70e9, rel=1e-3)
    assert again.devices[1].peak_flops["fp32"] == pytest.approx(34.5e9, rel=1e-3)
    assert again.devices[2].hbm_bandwidth_Bps == pytest.approx(10e9, rel=1e-3)
    assert again.devices[0].peak_flops["tf32"] == again.devices[0].peak_flops["fp32"]   # not measured
    link = again.nodes[0].intra_link
    assert link.bandwidth_Bps == pytest.approx(1.5e9, rel=1e-3)
    assert link.latency_seconds == pytest.approx(60e-6, rel=1e-3)
    assert again.efficiency["matmul"] == pytest.approx(0.9)
    assert again.efficiency["norm"] == pytest.approx(0.02)
    assert again.efficiency["hbm"] == 1.0           # the copy bandwidth was measured
    assert again.launch_latency_seconds == pytest.approx(8e-6)
    assert read_affinity(path) == "0,1,1"


def test_group_ranks_joins_only_similar_neighbours():
    devs = [_device(70), _device(66), _device(30), _device(70)]
    assert group_ranks(devs) == [[0, 1], [2], [3]]


def test_merge_keeps_topology_names_and_counts():
    path = CLUSTERS / "small-mixed.yaml"
    existing = yaml.safe_load(path.read_text())
    before = read_cluster_file(path)
    raw = _raw([_device(80), _device(78), _device(41), _device(40)])
    merged = merge_cluster(existing, raw, fit_link(_samples(30e-6, 3e9, 4)), None, str(path))
    after = parse_cluster(merged)
    assert merged["name"] == existing["name"]
    assert [g["name"] for g in merged["nodes"][0]["devices"]] == ["fast", "slow"]
    assert [g["count"] for g in merged["nodes"][0]["devices"]] == [2, 2]
    assert after.world == before.world and after.describe() == before.describe()
    assert after.devices[0].peak_flops["fp32"] == pytest.approx(79e9, rel=1e-3)
    assert after.devices[3].peak_flops["fp32"] == pytest.approx(40.5e9, rel=1e-3)
    assert after.nodes[0].intra_link.name == "loopback"
    assert after.nodes[0].intra_link.bandwidth_Bps == pytest.approx(3e9, rel=1e-3)


def test_merge_of_a_homogeneous_measurement_into_a_larger_homogeneous_cluster():
    path = CLUSTERS / "a100x8-nvlink.yaml"
    existing = yaml.safe_load(path.read_text())
    before = read_cluster_file(path)
    merged = merge_cluster(existing, _raw([_device(19000, 1500), _device(19100, 1510)]),
                           fit_link(_samples(5e-6, 200e9)), None, str(path))
    after = parse_cluster(merged)
    assert after.world == before.world
    assert after.describe() == before.describe()           # the catalog type (the name) is kept
    assert after.devices[7].peak_flops["fp32"] == pytest.approx(19.05e12, rel=1e-3)
    assert after.nodes[0].intra_link.bandwidth_Bps == pytest.approx(200e9, rel=1e-3)
    assert after.nodes[0].intra_link.name == before.nodes[0].intra_link.name


def test_merge_refuses_a_partial_measurement_of_a_mixed_cluster():
    path = CLUSTERS / "hap-paper-v100x16-p100x48.yaml"
    with pytest.raises(UserError, match="several kinds"):
        merge_cluster(yaml.safe_load(path.read_text()), _raw([_device(15000, 900)] * 2), None, None, str(path))


def test_merge_of_a_multi_node_file_keeps_node_counts_and_network():
    path = CLUSTERS / "v100x16-2nodes-25gbps.yaml"
    existing = yaml.safe_load(path.read_text())
    before = read_cluster_file(path)
    devices = [_device(15000, 880)] * before.world
    merged = merge_cluster(existing, _raw(devices, nodes=[list(range(8)), list(range(8, 16))]),
                           fit_link(_samples(4e-6, 120e9, 8)), fit_link(_samples(30e-6, 2.9e9, 2, "network")),
                           str(path))
    after = parse_cluster(merged)
    assert [n.get("count", 1) for n in merged["nodes"]] == [n.get("count", 1) for n in existing["nodes"]]
    assert len(after.nodes) == len(before.nodes)
    assert after.network.bandwidth_Bps == pytest.approx(2.9e9, rel=1e-3)


# ---- pinning and running ------------------------------------------------------------------------

def test_parse_affinity():
    assert parse_affinity("0,1,1", available={0, 1}) == [{0}, {1}, {1}]
    assert parse_affinity("0-1,0+1", available={0, 1}) == [{0, 1}, {0, 1}]
    assert parse_affinity("") is None
    with pytest.raises(UserError, match="not available"):
        parse_affinity("0,5", available={0, 1})
    with pytest.raises(UserError, match="not a core"):
        parse_affinity("0,x", available={0, 1})


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_pin_launcher_pins_the_local_rank(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nprint(sorted(os.sched_getaffinity(0)), sys.argv[1:])\n")
    core = min(os.sched_getaffinity(0))
    env = dict(os.environ, LOCAL_RANK="1", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "profiler.pin", f"{core},{core}", str(script), "--steps", "2"],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == f"[{core}] ['--steps', '2']"


def test_parse_steps_and_measured_time():
    out = "hello\nstep 1 loss 2.5 time 0.9\nstep 2 loss 2.0 time 0.1\nstep 3 loss 1.5 time 0.3\nstep 4 loss 1 time 0.2\n"
    times, losses = parse_steps(out)
    assert times == [0.9, 0.1, 0.3, 0.2] and losses == [2.5, 2.0, 1.5, 1.0]
    run = RunResult("p", times, losses, 0, 1.0)
    assert run.ok and run.measured_seconds == pytest.approx(0.2)      # the first step is not counted
    assert not RunResult("p", [0.5], [1.0], 0, 1.0).ok


def test_torchrun_command_pins_through_the_launcher():
    cmd = torchrun_command("prog.py", 3, steps=4, affinity="0,1,1", port=1234)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--nproc_per_node=3" in cmd and "--master_port=1234" in cmd
    assert cmd[cmd.index("-m", 3):cmd.index("-m", 3) + 3] == ["-m", "profiler.pin", "0,1,1"]
    assert cmd[-4:] == ["--device", "cpu", "--steps", "4"]


# ---- calibration math ---------------------------------------------------------------------------

def test_rank_correlation_and_median_error():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert math.isnan(rank_correlation([1, 2], [1, 2]))
    assert median_relative_error([1.1, 2.0, 2.4], [1.0, 2.0, 3.0]) == pytest.approx(0.1)


def _synthetic_runs():
    """Runs whose time is compute / scale_compute + overhead * scale_launch + bytes / (bw scale)."""
    compute = [0.20, 0.05, 0.12, 0.30, 0.08, 0.15]
    overhead = [0.01, 0.04, 0.02, 0.01, 0.03, 0.02]
    comm = [0.02, 0.06, 0.01, 0.00, 0.05, 0.03]

    def predict(scales):
        c, lat, b = scales.get("compute", 1.0), scales.get("launch", 1.0), scales.get("comm", 1.0)
        return [x / c + y * lat + z / b for x, y, z in zip(compute, overhead, comm)]

    return predict


def test_ordered_pairs_ignores_plans_that_measure_alike():
    measured = [100.0, 101.0, 150.0, 200.0]
    assert ordered_pairs([1.0, 2.0, 3.0, 4.0], measured) == 1.0
    # swapping the two plans 1% apart costs nothing; swapping 150 and 200 costs 1 of 5 pairs
    assert ordered_pairs([2.0, 1.0, 3.0, 4.0], measured) == 1.0
    assert ordered_pairs([1.0, 2.0, 4.0, 3.0], measured) == pytest.approx(4 / 5)
    assert math.isnan(ordered_pairs([1.0, 2.0], [100.0, 101.0]))


def test_fit_recovers_known_factors_on_synthetic_runs():
    predict = _synthetic_runs()
    truth = {"compute": 0.5, "launch": 3.0, "comm": 2.0}
    measured = predict(truth)
    scales = fit_scales(predict, measured, ("compute", "launch", "comm"), prior_weight=1e-6)
    for k, v in truth.items():
        assert scales[k] == pytest.approx(v, rel=1e-3)


def test_fit_reports_before_after_and_leave_one_out():
    predict = _synthetic_runs()
    measured = [t * (1 + 0.02 * (-1) ** i) for i, t in enumerate(predict({"compute": 0.7, "launch": 2.0}))]
    result = fit(predict, measured, ("compute", "launch"))
    assert result.error_before > 0.2
    assert result.error_after < 0.03
    assert result.error_leave_one_out < 0.1
    assert result.rho_after >= result.rho_before
    assert len(result.leave_one_out) == len(measured)


def test_parse_knobs():
    assert parse_knobs("compute, matmul") == ("compute", "matmul")
    with pytest.raises(UserError):
        parse_knobs("speed")


def test_apply_knobs_scales_the_right_numbers():
    cluster = load_cluster(CLUSTERS / "small-mixed.yaml")
    tuned = apply_knobs(cluster, {"compute": 2.0, "matmul": 1.5, "memory": 0.5, "launch": 3.0, "comm": 4.0,
                                  "latency": 0.1})
    assert tuned.efficiency["matmul"] == pytest.approx(cluster.efficiency["matmul"] * 3.0)
    assert tuned.efficiency["norm"] == pytest.approx(cluster.efficiency["norm"] * 2.0)
    assert tuned.efficiency["hbm"] == pytest.approx(cluster.efficiency["hbm"] * 0.5)
    assert tuned.launch_latency_seconds == pytest.approx(cluster.launch_latency_seconds * 3.0)
    assert tuned.nodes[0].intra_link.bandwidth_Bps == pytest.approx(cluster.nodes[0].intra_link.bandwidth_Bps * 4)
    assert tuned.nodes[0].intra_link.latency_seconds == pytest.approx(cluster.nodes[0].intra_link.latency_seconds / 10)
    per_kind = {**yaml.safe_load((CLUSTERS / "small-mixed.yaml").read_text())}
    per_kind["nodes"][0]["intra_link"] = {"bandwidth_GBps": 2, "latency_us": 100,
                                          "collectives": {"all_gather": {"bandwidth_GBps": 1, "latency_us": 50}}}
    tuned = apply_knobs(parse_cluster(per_kind), {"comm": 4.0, "latency": 0.1})
    assert tuned.nodes[0].intra_link.for_kind("all_gather").bandwidth_Bps == pytest.approx(4e9)
    assert tuned.nodes[0].intra_link.for_kind("all_gather").latency_seconds == pytest.approx(5e-6)
    assert cluster.efficiency["matmul"] == load_cluster(CLUSTERS / "small-mixed.yaml").efficiency["matmul"]


def test_fitted_numbers_written_back_give_the_fitted_cluster(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# profiled\n# hapc-affinity: 0,1\n" + (CLUSTERS / "small-mixed.yaml").read_text())
    before = read_cluster_file(path)
    scales = {"compute": 2.0, "memory": 0.6, "launch": 4.0, "comm": 0.5, "latency": 3.0}
    write_fitted(path, scales, note="test")
    after = read_cluster_file(path)
    want = apply_knobs(before, scales)
    for r in range(before.world):       # an efficiency past 1 moved into the peak: same effective FLOPS
        for cls in ("matmul", "norm", "elementwise"):
            assert after.effective_flops(r, cls) == pytest.approx(want.effective_flops(r, cls), rel=1e-3)
        assert (after.devices[r].hbm_bandwidth_Bps * after.efficiency["hbm"] ==
                pytest.approx(want.devices[r].hbm_bandwidth_Bps * want.efficiency["hbm"], rel=1e-3))
    assert max(after.efficiency.values()) <= 1.0
    assert after.launch_latency_seconds == pytest.approx(want.launch_latency_seconds, rel=1e-3)
    assert after.nodes[0].intra_link.bandwidth_Bps == pytest.approx(want.nodes[0].intra_link.bandwidth_Bps, rel=1e-3)
    assert after.nodes[0].intra_link.name == "loopback"
    assert read_affinity(path) == "0,1"          # the header survives
    assert "hapc calibrate" in path.read_text()


def test_fitted_cluster_data_rejects_nothing_valid():
    data = yaml.safe_load((CLUSTERS / "v100x16-2nodes-25gbps.yaml").read_text())
    cluster = parse_cluster(data)
    out = fitted_cluster_data(data, cluster, {"comm": 2.0})
    assert parse_cluster(out).network.bandwidth_Bps == pytest.approx(cluster.network.bandwidth_Bps * 2, rel=1e-3)


def test_calibration_through_the_simulator_recovers_a_slower_machine(load_model):
    """Measurements made up by the simulator on a cluster with known factors are fitted back."""
    from profiler.calibrate import simulator_predictor
    from hapc.frontend.tracer import trace
    from synth.baselines import baseline_program

    mlp = load_model("mlp")
    cfg = dict(mlp.SMALL, batch=256, hidden=512)      # big enough that bandwidth, not latency, dominates
    traced = trace(mlp.model(**cfg), mlp.inputs(**cfg))
    cluster = load_cluster(CLUSTERS / "small-mixed.yaml")
    programs = [baseline_program(n, traced.graph, cluster) for n in ("dp-even", "dp-flops", "megatron-tp", "zero3")]
    predict = simulator_predictor(programs, cluster)
    truth = {"launch": 5.0, "comm": 0.25}
    measured = predict(truth)
    result = fit(predict, measured, ("launch", "comm"), leave_one_out=False)
    assert result.error_before > 0.1
    assert result.error_after < 0.02


# ---- a real measurement (slow: starts processes) ------------------------------------------------

@pytest.mark.slow
def test_quick_profile_of_two_ranks_writes_a_loadable_file(tmp_path):
    from profiler.profile import profile

    out = tmp_path / "cpu2.yaml"
    result = profile(out, nproc=2, quick=True, op_classes=False)
    cluster = read_cluster_file(out)
    assert cluster.world == 2
    assert all(d.peak_flops["fp32"] > 1e8 for d in cluster.devices)      # more than 0.1 GFLOPS
    assert all(d.hbm_bandwidth_Bps > 1e8 for d in cluster.devices)
    link = cluster.nodes[0].intra_link
    assert link.bandwidth_Bps > 1e6 and link.latency_seconds >= 0
    measured = {s["kind"] for s in result.raw["collectives"]}
    assert {k for k, _, _ in link.per_kind} == measured                      # each kind fitted on its own
    assert 0.0 <= cluster.comm_overlap <= 1.0 and "comm_overlap" in out.read_text()
    kinds = {s["kind"] for s in result.raw["collectives"]} | {k.split()[-1] for k in result.raw["skipped_collectives"]}
    assert kinds == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}
    assert out.with_suffix(".profile.json").is_file()
    # merging the measurement into the file it wrote keeps it loadable and the same shape
    merged = tmp_path / "merged.yaml"
    profile(merged, nproc=2, quick=True, op_classes=False, merge=out)
    assert read_cluster_file(merged).describe() == cluster.describe()


@pytest.mark.slow
def test_op_costs_are_counted_as_the_tracer_counts():
    """Efficiencies are solved against these costs, so they must be the IR's own."""
    import torch

    from hapc.frontend.tracer import trace
    from profiler.opclass_bench import BENCHES, op_cost

    class One(torch.nn.Module):
        def __init__(self, fn, inputs):
            super().__init__()
            self.fn = fn
            self.weights = torch.nn.ParameterList([torch.nn.Parameter(t.detach()) for t in inputs if t.requires_grad])
            self.plain = [not t.requires_grad for t in inputs]

        def forward(self, *plain):
            it_w, it_p = iter(self.weights), iter(plain)
            args = [next(it_p) if p else next(it_w) for p in self.plain]
            return self.fn(*args).float().sum()

    for bench in BENCHES:
        fn, inputs = bench.make(torch.device("cpu"), True)
        traced = trace(One(fn, inputs), tuple(t for t in inputs if not t.requires_grad))
        node = next(n for n in traced.graph.nodes if not n.op.startswith("aten.sum.default"))
        want = node.cost
        got = op_cost(fn, inputs)
        assert (got.fwd_flops, got.bwd_flops, got.fwd_bytes, got.bwd_bytes) == \
            (want.fwd_flops, want.bwd_flops, want.fwd_bytes, want.bwd_bytes), bench.label


def test_keep_freed_memory_can_be_turned_off(monkeypatch):
    from hapc.runtime.collectives import keep_freed_memory

    monkeypatch.setenv("HAPC_SYSTEM_MALLOC", "1")
    assert keep_freed_memory() is False
    monkeypatch.delenv("HAPC_SYSTEM_MALLOC")
    import platform

    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")


def test_profile_splits_devices_only_on_differences_beyond_their_spread():
    from profiler.clusterfile import group_ranks
    from profiler.timing import relative_spread

    def core(gflops: float, spread: float) -> dict:
        return {"name": "cpu", "peak_flops": {"fp32": gflops * 1e9}, "hbm_bandwidth_Bps": 10e9, "flops_spread": spread}

    assert relative_spread([1.0, 1.2, 1.4]) == pytest.approx(0.2 / 1.2)
    # The two identical cores, measured 31.7 and 46.6 GFLOPS with +-20% window spreads: one kind.
    assert group_ranks([core(31.7, 0.2), core(46.6, 0.2)]) == [[0, 1]]
    # The same figures measured steadily (+-1%): told apart.
    assert group_ranks([core(31.7, 0.01), core(46.6, 0.01)]) == [[0], [1]]
    # Old profiles without a spread keep the 15% rule.
    plain = [{k: v for k, v in core(g, 0).items() if k != "flops_spread"} for g in (40.0, 44.0, 60.0)]
    assert group_ranks(plain) == [[0, 1], [2]]
