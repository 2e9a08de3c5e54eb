"""The simulator and the memory model, on hand-built programs with hand-computed answers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.costmodel.cm_programs import chain_graph, custom_cluster, data_parallel, zero3

import hapc
from costmodel import collective_seconds, load_cluster, program_memory, simulate
from costmodel.transfers import backward_move, forward_move
from hapc.errors import UserError
from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute, Strategy

ROOT = Path(__file__).resolve().parents[2]
ALPHA, BW = 10e-6, 10e9
# Two devices of 1 TFLOPS at 50% matmul efficiency (0.5e12 flop/s), 100 GB/s HBM, no launch latency.
TWO = load_cluster(custom_cluster(devices=((1, 10, 100),) * 2, efficiency={"matmul": 0.5}))


def adamw_seconds(nbytes: float, hbm_Bps: float = 100e9) -> float:
    return 7 * nbytes / (hbm_Bps * 0.8)


def test_data_parallel_by_hand():
    g = chain_graph(batch=8, widths=(4, 4), flops_per_layer=1e9)
    res = simulate(data_parallel(g, (0.5, 0.5)), TWO)
    fwd = 0.5e9 / 0.5e12                                   # half the batch each: 1 ms
    bwd = 2 * fwd
    allreduce = 2 * ALPHA + 64 / BW                        # ring over 2 ranks of the 64-byte weight gradient
    assert res.forward_seconds == pytest.approx(fwd)
    assert res.iteration_seconds == pytest.approx(fwd + bwd + allreduce + adamw_seconds(64))
    assert res.comm_seconds == [pytest.approx(allreduce)] * 2
    assert res.idle_seconds == [pytest.approx(0.0, abs=1e-12)] * 2
    assert res.lower_bound_seconds == pytest.approx(3e9 / 1e12)
    assert res.iteration_seconds >= res.lower_bound_seconds


def test_one_device_has_no_communication_and_meets_the_lower_bound():
    one = load_cluster(custom_cluster(devices=((1, 10, 100),), efficiency={"matmul": 0.5}))
    g = chain_graph(batch=8, widths=(4, 4, 4), flops_per_layer=1e9)
    res = simulate(data_parallel(g, (1.0,)), one)
    assert res.comm_seconds == [0.0] and res.idle_seconds == [0.0]
    assert res.grad_sync_seconds == 0.0
    assert res.iteration_seconds == pytest.approx(res.lower_bound_seconds + adamw_seconds(128))


def test_slow_device_makes_the_fast_one_wait_and_flops_shares_fix_it():
    hetero = load_cluster(custom_cluster(devices=((2, 10, 100), (1, 10, 100)), efficiency={"matmul": 0.5}))
    g = chain_graph(batch=30, widths=(4, 4), flops_per_layer=3e9)
    even = simulate(data_parallel(g, (0.5, 0.5)), hetero)
    # Rank 0 does 0.5 * 9e9 flops at 1e12/s, rank 1 the same at 0.5e12/s; rank 0 waits the difference.
    assert even.compute_seconds[0] == pytest.approx(4.5e-3 + adamw_seconds(64))
    assert even.idle_seconds[0] == pytest.approx(4.5e-3)
    assert even.idle_seconds[1] == pytest.approx(0.0, abs=1e-12)
    prop = simulate(data_parallel(g, hetero.flops_shares()), hetero)
    assert prop.iteration_seconds < 0.7 * even.iteration_seconds
    assert prop.idle_seconds[0] == pytest.approx(0.0, abs=1e-9)       # 20 vs 10 rows: balanced exactly
    for res in (even, prop):
        for r in range(2):
            total = res.compute_seconds[r] + res.comm_seconds[r] + res.idle_seconds[r]
            assert total == pytest.approx(res.iteration_seconds)


def test_identical_devices_behave_as_a_homogeneous_cluster():
    g = chain_graph(batch=16, widths=(64, 64, 64), flops_per_layer=1e9)
    named_apart = load_cluster({"nodes": [{"devices": [
        {"name": "a", "tflops": 1, "memory_GB": 10, "hbm_GBps": 100, "count": 1},
        {"name": "b", "tflops": 1, "memory_GB": 10, "hbm_GBps": 100, "count": 1}],
        "intra_link": {"bandwidth_GBps": 10, "latency_us": 10}}], "efficiency": {"matmul": 0.5},
        "launch_latency_us": 0})
    a, b = simulate(data_parallel(g, (0.5, 0.5)), named_apart), simulate(data_parallel(g, (0.5, 0.5)), TWO)
    assert a.iteration_seconds == b.iteration_seconds
    assert a.compute_seconds[0] == a.compute_seconds[1] and a.idle_seconds == [0.0, 0.0]


def test_gradient_all_reduce_overlaps_with_backward():
    g = chain_graph(batch=8, widths=(1000,) * 4, flops_per_layer=1e9)       # three 4 MB weights
    res = simulate(data_parallel(g, (0.5, 0.5)), TWO, bucket_bytes=0)
    layer_fwd, layer_bwd = 1e-3, 2e-3
    allreduce = 2 * ALPHA + 4e6 / BW
    syncs = [e for e in res.events if e.phase == "grad_sync"]
    assert [e.label for e in syncs] == ["w2", "w1", "w0"]
    assert syncs[0].start_seconds == pytest.approx(3 * layer_fwd + layer_bwd)    # right after its backward
    assert res.grad_sync_seconds == pytest.approx(3 * allreduce)
    assert res.exposed_grad_sync_seconds == pytest.approx(allreduce)           # only the last one shows
    assert res.iteration_seconds == pytest.approx(3 * layer_fwd + 3 * layer_bwd + allreduce
                                                  + adamw_seconds(12e6))
    bucketed = simulate(data_parallel(g, (0.5, 0.5)), TWO)                      # 25 MiB: one bucket at the end
    assert len([e for e in bucketed.events if e.phase == "grad_sync"]) == 1
    assert bucketed.iteration_seconds > res.iteration_seconds


def test_gradient_all_reduce_that_compute_cannot_hide_delays_it():
    g = chain_graph(batch=8, widths=(1000,) * 4, flops_per_layer=1e9)
    layer_fwd, layer_bwd = 1e-3, 2e-3
    allreduce = 2 * ALPHA + 4e6 / BW
    for overlap in (0.0, 0.25):
        data = custom_cluster(devices=((1, 10, 100),) * 2, efficiency={"matmul": 0.5})
        data["comm_overlap"] = overlap
        res = simulate(data_parallel(g, (0.5, 0.5)), load_cluster(data), bucket_bytes=0)
        # each of the first two all-reduces takes (1 - overlap) of its time from the backward;
        # the last is exposed whole
        assert res.iteration_seconds == pytest.approx(3 * layer_fwd + 3 * layer_bwd + allreduce
                                                      + 2 * (1 - overlap) * allreduce + adamw_seconds(12e6))
        for r in range(2):
            total = res.compute_seconds[r] + res.comm_seconds[r] + res.idle_seconds[r]
            assert total == pytest.approx(res.iteration_seconds)


def test_zero3_gathers_forward_and_again_in_backward_then_reduce_scatters():
    g = chain_graph(batch=8, widths=(4, 4, 4), flops_per_layer=1e9)
    prog = zero3(g, (0.5, 0.5))
    res = simulate(prog, TWO)
    kinds = [(e.phase, e.kind) for e in res.events if e.kind in ("all_gather", "reduce_scatter", "all_reduce")]
    assert kinds == [("fwd", "all_gather"), ("fwd", "all_gather"), ("bwd", "all_gather"), ("bwd", "reduce_scatter"),
                     ("bwd", "all_gather"), ("bwd", "reduce_scatter")]
    gather = ALPHA + 32 / BW                             # ring of two 32-byte pieces
    assert res.comm_seconds[0] == pytest.approx(6 * gather)
    mem = program_memory(prog, TWO)
    d = mem.devices[0]
    assert (d.params_bytes, d.grads_bytes, d.optimizer_bytes) == (64, 64, 128)
    # inputs 64 + two outputs 64 each + the loss 4; the gathered weights are freed after forward
    # and gathered again in backward (FSDP), so none is kept
    assert d.activations_bytes == 64 + 64 + 64 + 4
    assert d.comm_buffer_bytes == 64


def test_memory_of_data_parallel_and_optimizers():
    g = chain_graph(batch=8, widths=(4, 4, 4), flops_per_layer=1e9)
    prog = data_parallel(g, (0.5, 0.5))
    adamw = program_memory(prog, TWO).devices[1]
    assert (adamw.params_bytes, adamw.grads_bytes, adamw.optimizer_bytes) == (128, 128, 256)
    assert adamw.activations_bytes == 64 + 64 + 64 + 4 and adamw.comm_buffer_bytes == 0
    assert adamw.total_bytes == 128 + 128 + 256 + 196
    assert program_memory(prog, TWO, "sgd").devices[0].optimizer_bytes == 0
    assert program_memory(prog, TWO, "sgd_momentum").devices[0].optimizer_bytes == 128


def test_memory_capacity_is_checked():
    tiny = load_cluster(custom_cluster(devices=((1, 1e-7, 100),) * 2))     # 100 bytes each
    g = chain_graph(batch=8, widths=(4, 4, 4))
    res = simulate(data_parallel(g, (0.5, 0.5)), tiny)
    assert not res.fits and res.memory.missing_bytes()[0] == pytest.approx(res.peak_memory_bytes[0] - 100)
    assert "does not fit" in res.table()


def test_all_to_all_redistribute_and_its_dual():
    g = chain_graph(batch=8, widths=(4, 4), flops_per_layer=1e9)
    prog = DistProgram(g, (0.75, 0.25), {"x": Shard(0), "w0": Shard(1)})
    prog.steps = [Redistribute("x", "x@k", Shard(0), Shard(1)),                  # batch -> feature shards
                  Compute("linear0", Strategy((Shard(1), Shard(1)), (P,)), ("x@k", "w0")),   # row-parallel
                  Redistribute("y0", "y0@r", P, R),
                  Compute("sum", Strategy((R,), (R,)), ("y0@r",))]
    move = forward_move(prog, prog.steps[0])
    # x is 8x4 float32 = 128 bytes; rank 0 holds 6 rows and wants 3 columns of every row.
    assert move.kind == "all_to_all" and move.piece_bytes == (96.0, 32.0)
    assert move.send_matrix == ((0.0, 24.0), (24.0, 0.0))      # 6 rows x 1 column; 2 rows x 3 columns
    assert backward_move(prog, prog.steps[0]) is None                   # x needs no gradient
    assert backward_move(prog, prog.steps[2]).kind == "all_reduce"      # P -> R is its own dual
    res = simulate(prog, TWO)
    a2a = ALPHA + 24 / BW
    allreduce = 2 * ALPHA + 128 / BW                     # y0 is 8x4 float32, full size on both ranks
    assert [e.kind for e in res.events if e.kind in ("all_to_all", "all_reduce")] == \
        ["all_to_all", "all_reduce", "all_reduce"]
    assert res.comm_seconds[0] == pytest.approx(a2a + 2 * allreduce)
    assert res.grad_sync_seconds == 0.0                                 # w0 is sharded: no gradient sync


def test_named_methods_and_mismatched_world():
    g = chain_graph(batch=8, widths=(4, 4), flops_per_layer=1e9)
    prog = zero3(g, (0.5, 0.5))
    prog.steps[0] = Redistribute("w0", "w0@full", Shard(0), R, method="grouped")
    res = simulate(prog, TWO)
    fwd = [e for e in res.events if e.kind == "all_gather"]
    assert fwd[0].variant == "grouped"
    prog.steps[0] = Redistribute("w0", "w0@full", Shard(0), R, method="tree-ish")
    with pytest.raises(ValueError, match="no variant"):
        simulate(prog, TWO)
    with pytest.raises(UserError, match="runs on 1 devices but the cluster .* has 2"):
        simulate(data_parallel(g, (1.0,)), TWO)


def test_traced_model_on_the_example_clusters():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x):
            return self.net(x).sum()

    graph = hapc.trace(Loss(), (torch.randn(64, 256),)).graph
    for name in ("small-mixed", "cpu4"):
        cluster = load_cluster(ROOT / "configs" / "clusters" / f"{name}.yaml")
        even = simulate(data_parallel(graph, [1 / 4] * 4), cluster)
        prop = simulate(data_parallel(graph, cluster.flops_shares()), cluster)
        for res in (even, prop):
            assert res.iteration_seconds >= res.lower_bound_seconds > 0
            assert res.grad_sync_seconds > 0 and res.fits
            for r in range(4):
                total = res.compute_seconds[r] + res.comm_seconds[r] + res.idle_seconds[r]
                assert total == pytest.approx(res.iteration_seconds)
        if cluster.is_homogeneous:
            assert prop.iteration_seconds == pytest.approx(even.iteration_seconds)
        else:
            assert prop.iteration_seconds < even.iteration_seconds
        assert "ms" in repr(even) and "time per iteration" in even.table()


def test_all_reduces_inside_local_ops_are_priced():
    """A mean cross-entropy over batch shares sums the global count (forward only); a
    vocabulary-parallel one sums max and exponentials per row, and the sum again in backward."""
    from costmodel.internal import internal_all_reduces
    from synth.baselines import baseline_program

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(16, 40)

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.head(x), y)

    traced = hapc.trace(Classifier(), (torch.randn(12, 16), torch.randint(0, 40, (12,))))
    graph = traced.graph
    ce = next(n for n in graph.nodes if "cross_entropy" in n.op)
    assert internal_all_reduces("cross_entropy_batch", ce, graph) == ([4.0], [])
    assert internal_all_reduces("vocab_parallel_cross_entropy", ce, graph) == ([48.0, 48.0], [48.0])
    assert internal_all_reduces(None, ce, graph) == ([], [])
    cluster = load_cluster(custom_cluster(devices=((1, 10, 100),) * 2, latency_us=500))
    program = baseline_program("dp-even", graph, cluster)
    inside = [e for e in simulate(program, cluster).events if "inside" in e.label]
    assert [(e.phase, e.kind) for e in inside] == [("fwd", "all_reduce")]
    assert inside[0].end_seconds - inside[0].start_seconds == pytest.approx(
        collective_seconds("all_reduce", [4.0, 4.0], cluster, variant=inside[0].variant))
