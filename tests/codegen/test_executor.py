"""The in-process N-rank executor reproduces single-device loss and gradients for whole
programs: a hand-built Megatron MLP (column- then row-parallel) on 3 uneven ranks, and a
data-parallel program with an uneven batch split."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hapc
from hapc.codegen.executor import replicated_program, run
from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Strategy
from synth.builder import ProgramBuilder, propagate

SHARES = (0.5, 0.3, 0.2)


class MLP(nn.Module):
    def __init__(self, d_in=10, hidden=17, d_out=6):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(F.gelu(self.fc1(x))), y)


def _traced():
    torch.manual_seed(0)
    model = MLP()
    inputs = (torch.randn(7, 10), torch.randint(0, 6, (7,)))
    return model, inputs, hapc.trace(model, inputs)


def _megatron_mlp(graph):
    """fc1 column-parallel (weight rows sharded), fc2 row-parallel (Partial sum), then all-reduce."""
    fc1, gelu, fc2, loss = graph.nodes
    b = ProgramBuilder(graph, SHARES)
    b.compute(fc1, Strategy((R, Shard(0), Shard(0)), (Shard(1),)))
    b.compute(gelu, Strategy((Shard(1),), (Shard(1),)))
    b.compute(fc2, Strategy((Shard(1), Shard(1), P), (P,)))
    b.compute(loss, Strategy((R, R), (R,)))       # all-reduce of the logits before the loss
    return b.build()


def _reference(model, inputs, dtype):
    model = model.to(dtype)
    x, y = inputs
    loss = model(x.to(dtype), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return loss.detach(), grads


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
def test_megatron_mlp_matches_single_device(dtype, tol):
    model, inputs, traced = _traced()
    program = _megatron_mlp(traced.graph)
    kinds = [(s.src_layout, s.dst_layout) for s in program.steps if hasattr(s, "dst_layout")]
    assert (P, R) in kinds and (R, Shard(0)) in kinds          # one all-reduce, free slices
    out = run(program, traced, inputs, dtype=dtype)
    ref_loss, ref_grads = _reference(model, inputs, dtype)
    assert abs(out.loss - ref_loss).item() < tol
    for name, ref in zip(traced.graph.params, ref_grads):
        assert (out.grads[name] - ref).abs().max().item() < tol, name


def test_megatron_pieces_are_uneven():
    _, _, traced = _traced()
    program = _megatron_mlp(traced.graph)
    w1 = traced.graph.params[0]
    program.source_layouts[w1] = Shard(0)
    program.invalidate()
    assert program.lengths(w1, 0) == [9, 5, 3]        # 17 rows at 0.5 / 0.3 / 0.2


def test_data_parallel_uneven_batch_exact_mean():
    model, inputs, traced = _traced()
    graph = traced.graph
    program = propagate(graph, SHARES, {graph.inputs[0]: Shard(0), graph.inputs[1]: Shard(0)})
    assert not [s for s in program.steps if hasattr(s, "dst_layout")]   # no communication needed
    out = run(program, traced, inputs, dtype=torch.float64)
    ref_loss, ref_grads = _reference(model, inputs, torch.float64)
    assert abs(out.loss - ref_loss).item() < 1e-9
    for name, ref in zip(graph.params, ref_grads):
        assert (out.grads[name] - ref).abs().max().item() < 1e-9


def test_wrong_program_is_caught():
    """A strategy that drops the bias Partial requirement double-counts the bias."""
    model, inputs, traced = _traced()
    fc1, gelu, fc2, loss = traced.graph.nodes
    b = ProgramBuilder(traced.graph, SHARES)
    b.compute(fc1, Strategy((R, Shard(0), Shard(0)), (Shard(1),)))
    b.compute(gelu, Strategy((Shard(1),), (Shard(1),)))
    b.compute(fc2, Strategy((Shard(1), Shard(1), R), (P,)))      # wrong: bias counted 3 times
    b.compute(loss, Strategy((R, R), (R,)))
    out = run(b.build(), traced, inputs, dtype=torch.float64)
    ref_loss, _ = _reference(model, inputs, torch.float64)
    assert abs(out.loss - ref_loss).item() > 1e-6


def test_replicated_program_on_one_rank_is_the_model():
    model, inputs, traced = _traced()
    out = run(replicated_program(traced.graph), traced, inputs, dtype=torch.float64)
    ref_loss, ref_grads = _reference(model, inputs, torch.float64)
    assert abs(out.loss - ref_loss).item() < 1e-12
