"""Sufficient factor broadcasting: a data-parallel linear whose weight gradient is rebuilt
from gathered factors instead of all-reduced."""

from __future__ import annotations

import torch
import torch.nn as nn

import hapc
from costmodel import load_cluster, simulate
from costmodel.simulator import factor_synced_params
from hapc.executor import replicated_program, run
from hapc.ir.layout import R, Shard
from hapc.rules import strategies
from synth.builder import ProgramBuilder

CLUSTER = "configs/clusters/v100x16-2nodes-25gbps.yaml"


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2048, 2048)

    def forward(self, x):
        return self.fc(x).square().mean()


def _programs(sfb: bool):
    torch.manual_seed(0)
    model, x = Wide(), torch.randn(16, 2048)
    traced = hapc.trace(model, (x,))
    fc = traced.graph.nodes[0]
    options = [s for s in strategies(fc, traced.graph)
               if s.inputs == (Shard(0), R, R) and s.outputs == (Shard(0),)]
    chosen = next(s for s in options if (s.local == "linear_sfb") == sfb)
    b = ProgramBuilder(traced.graph, [1 / 16] * 16)
    b.compute(fc, chosen)
    for node in traced.graph.nodes[1:]:
        b.compute(node, next(s for s in strategies(node, traced.graph)
                             if s.inputs and s.inputs[0] == Shard(0) and not s.is_replicated))
    return traced, x, b.build()


def test_rule_offers_sufficient_factor_strategy():
    traced, _, program = _programs(sfb=True)
    assert factor_synced_params(program) == set(traced.graph.params)


def test_sufficient_factor_program_is_exact():
    traced, x, program = _programs(sfb=True)
    got = run(program, traced, (x,), dtype=torch.float64)
    ref = run(replicated_program(traced.graph), traced, (x,), dtype=torch.float64)
    assert abs(got.loss - ref.loss).item() < 1e-9
    assert all((got.grads[p] - ref.grads[p]).abs().max().item() < 1e-9 for p in ref.grads)


def test_factors_beat_the_all_reduce_for_a_small_batch():
    cluster = load_cluster(CLUSTER)
    _, _, dp = _programs(sfb=False)
    _, _, sfb = _programs(sfb=True)
    t_dp, t_sfb = simulate(dp, cluster), simulate(sfb, cluster)
    assert t_sfb.grad_sync_seconds == 0 < t_dp.grad_sync_seconds
    assert t_sfb.iteration_seconds < t_dp.iteration_seconds
