"""Sufficient factor broadcasting: a data-parallel linear whose weight gradient is rebuilt
from gathered factors instead of all-reduced."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hapc
from costmodel import load_cluster, simulate
from costmodel.simulator import factor_synced_params
from hapc.codegen.executor import replicated_program, run
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


@pytest.mark.slow
def test_emitted_sufficient_factor_program_verifies_on_gloo(tmp_path):
    """The real backward: gathered factors on 4 gloo ranks, and no gradient all-reduce."""
    import os
    import subprocess
    import sys

    from hapc.codegen import emit
    from hapc.frontend.modelfile import load_model_file
    from synth.builder import propagate, redistribution_penalty

    size = {"layers": 3, "features": 20, "hidden": 64, "classes": 7, "batch": 8}
    mf = load_model_file("configs/models/mlp.py", size)
    torch.manual_seed(0)
    traced = hapc.trace(mf.build_model(), mf.build_inputs())

    def prefer_factors(node, s, b):
        cost = sum(redistribution_penalty(b.layouts_of(v), lay) for v, lay in zip(node.input_refs(), s.inputs))
        return cost - (0.2 if s.local == "linear_sfb" else 0.0) - (0.05 if s.outputs and s.outputs[0] != R else 0)

    program = propagate(traced.graph, (0.4, 0.3, 0.2, 0.1), {n: Shard(0) for n in traced.graph.inputs},
                        score=prefer_factors)
    assert factor_synced_params(program)
    out = emit(program, "configs/models/mlp.py", str(tmp_path), model_kwargs=size)
    assert "GRAD_SYNC_ORDER: tuple[str, ...] = ()" in open(out).read()
    run_ = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", out, "--device", "cpu",
                           "--verify", "--steps", "2"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert "verify: ok" in run_.stdout, run_.stdout[-2000:] + run_.stderr[-2000:]
