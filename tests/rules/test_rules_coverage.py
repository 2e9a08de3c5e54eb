"""Rules for ops that real model families run and that used to run replicated only: the
vocabulary-parallel embedding with a ``padding_idx``, ``baddbmm`` (BLOOM's ALiBi), mask
building (``&``, ``|``, ``diff``, two-tensor ``min``), casts (``type_as``, ``to(device)``) and
``_weight_norm``. Each rule passes the checker in tests/rules/test_rules_check.py (parametrised over
every registered op); here: the strategies that matter are offered, the checker would catch
the old padding bug, and whole programs using them match one device."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import hapc
from hapc.codegen.executor import run
from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules import has_rule
from hapc.rules.check import check_strategy, sample_graph
from hapc.rules.registry import Sample, strategies
from hapc.rules.samples import Ids, T
from hapc.runtime import local_ops
from synth.builder import propagate

SHARES = (0.5, 0.3, 0.2)
VOCAB_PARALLEL = Strategy((Shard(0), R), (P,), local="vocab_parallel_embedding")


def _offered(op: str, sample: Sample) -> list[Strategy]:
    node, graph, _ = sample_graph(op, sample)
    return strategies(node, graph)


def test_ops_from_model_families_have_rules():
    for op in ["aten.baddbmm.default", "aten.__and__.Tensor", "aten.__or__.Tensor", "aten.diff.default",
               "aten.type_as.default", "aten.to.device", "aten._weight_norm.default", "aten.min.other",
               "aten.floor_divide.default", "aten.slice_scatter.default", "aten.select_scatter.default",
               "aten.fill.Tensor"]:
        assert has_rule(op), op


def test_embedding_with_padding_idx_is_vocabulary_parallel():
    ids = Ids(11, 5, 7)
    assert VOCAB_PARALLEL in _offered("aten.embedding.default", Sample((T(11, 6), ids, 7)))
    # scale_grad_by_freq needs counts over the whole batch: neither ids nor vocabulary sharded.
    offered = _offered("aten.embedding.default", Sample((T(11, 6), ids, -1, True)))
    assert VOCAB_PARALLEL not in offered
    assert all(s.inputs[1] == R for s in offered)


def test_checker_catches_a_vocab_parallel_embedding_that_ignores_padding(monkeypatch):
    """The lookup before padding was handled: the padding row got a gradient on its owner."""
    def ignores_padding(ctx, weight, ids, *rest, **kwargs):
        info = ctx.inputs[0]
        local = ids - info.offset
        mine = (local >= 0) & (local < info.length)
        out = F.embedding(torch.where(mine, local, torch.zeros_like(local)), weight)
        return out * mine.unsqueeze(-1).to(out.dtype)

    ids = Ids(11, 5, 7)
    ids[0] = 7                       # row 7 lives on rank 1 (rows 6..8 of 11 at 0.5/0.3/0.2)
    sample = Sample((T(11, 6), ids, 7))
    assert check_strategy("aten.embedding.default", sample, VOCAB_PARALLEL) is None
    monkeypatch.setitem(local_ops.LOCAL_OPS, "vocab_parallel_embedding", ignores_padding)
    assert "gradient" in check_strategy("aten.embedding.default", sample, VOCAB_PARALLEL)


def test_baddbmm_shards_heads_and_reduces_over_k():
    offered = _offered("aten.baddbmm.default",
                       Sample((T(6, 1, 4), T(6, 7, 10), T(6, 10, 4)), {"alpha": 0.25}))
    assert Strategy((Shard(0), Shard(0), Shard(0)), (Shard(0),)) in offered     # heads (B*H)
    assert Strategy((P, Shard(2), Shard(1)), (P,)) in offered                   # k: bias Partial
    assert Strategy((Shard(2), R, Shard(2)), (Shard(2),)) in offered            # key positions
    # A Partial bias on its own would be added once per rank's product: never offered.
    assert Strategy((P, R, R), (P,)) not in offered


def test_weight_norm_shards_its_kept_dimension():
    offered = _offered("aten._weight_norm.default", Sample((T(6, 5, 7), T(1, 1, 7), 2)))
    assert Strategy((Shard(2), Shard(2)), (Shard(2),)) in offered
    assert Strategy((Shard(0), Shard(0)), (Shard(0),)) not in offered


def test_scatter_shards_all_but_the_written_dimension():
    sample = Sample((T(5, 7), T(5, 6), 1, 1))              # x[:, 1:] = src, as T5's shift writes
    offered = _offered("aten.slice_scatter.default", sample)
    assert Strategy((Shard(0), Shard(0)), (Shard(0),)) in offered
    assert Strategy((Shard(1), Shard(1)), (Shard(1),)) not in offered


def test_casts_keep_partial_sums_only_between_floats():
    assert Strategy((P, R), (P,)) in _offered("aten.type_as.default",
                                               Sample((T(5, 7), T(3, dtype=torch.float32))))
    assert Strategy((P, R), (P,)) not in _offered("aten.type_as.default", Sample((T(5, 7), Ids(3, 2))))


class PaddedLM(nn.Module):
    """Token embedding with a padding row, an ALiBi-style baddbmm score, a mask built with ``&``
    and a weight-normed projection: the patterns above, in one model."""

    def __init__(self, vocab: int = 11, hidden: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, padding_idx=7)
        self.proj = nn.utils.parametrizations.weight_norm(nn.Linear(hidden, hidden), dim=0)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)                                   # (B, S, H)
        bias = torch.arange(ids.shape[1], dtype=x.dtype).view(1, 1, -1).expand(ids.shape[0], 1, -1)
        scores = torch.baddbmm(bias, x, x.transpose(1, 2), alpha=0.5)
        pos = torch.arange(ids.shape[1])
        keep = (pos.view(-1, 1) >= pos.view(1, -1)) & (ids != 7).unsqueeze(1)
        scores = scores.masked_fill(~keep, -1e4).softmax(-1)
        y = self.proj(scores @ x).type_as(x)
        return F.cross_entropy(self.head(y).flatten(0, 1), labels.flatten())


def test_vocab_parallel_padded_embedding_program_matches_one_device():
    torch.manual_seed(0)
    model = PaddedLM().double()
    ids = Ids(11, 5, 6)
    ids[:, -2:] = 7                                           # padded rows
    inputs = (ids, Ids(11, 5, 6))
    traced = hapc.trace(model, inputs)
    graph = traced.graph
    weight = next(p for p in graph.params if graph.values[p].target == "embed.weight")
    program = propagate(graph, SHARES, {weight: Shard(0)})
    assert any(getattr(s, "strategy", None) == VOCAB_PARALLEL for s in program.steps)
    out = run(program, traced, inputs, dtype=torch.float64)

    loss = model(*inputs)
    want = dict(zip([n for n, _ in model.named_parameters()],
                    torch.autograd.grad(loss, list(model.parameters()))))
    assert abs(out.loss - loss).item() < 1e-9
    assert want["embed.weight"][7].abs().max() == 0
    for name in graph.params:
        target = graph.values[name].target
        assert (out.grads[name] - want[target]).abs().max().item() < 1e-9, target
