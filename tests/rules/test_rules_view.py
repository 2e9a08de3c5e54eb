"""Rules for views, shape and indexing ops (hapc/rules/ops_view.py, ops_index.py).

The checker proves that every offered strategy is right; the targeted tests below prove
that the strategies plans depend on are *offered* (head split, batch merge, transposes,
batch-sharded masks, ...), so a regression that silently drops one fails here.
"""

from __future__ import annotations

import pytest
import torch

from hapc.codegen.executor import replicated_program, run
from hapc.ir.layout import P, R, Replicate, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute, Strategy
from hapc.rules.check import check_all, check_strategy, sample_graph
from hapc.rules.ops_view import view_dim_map, view_groups
from hapc.rules.registry import Sample, rules, strategies
from hapc.rules.samples import Ids, T
from hapc.frontend.tracer import trace

MODULES = ("hapc.rules.ops_view", "hapc.rules.ops_index")
OURS = sorted(op for op, r in rules().items() if r.fn.__module__ in MODULES)

REQUIRED = [
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default",
    "aten.transpose.int", "aten.permute.default", "aten.t.default", "aten.unsqueeze.default",
    "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.flatten.using_ints",
    "aten.unflatten.int", "aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default",
    "aten.unbind.int", "aten.cat.default", "aten.stack.default", "aten.slice.Tensor", "aten.select.int",
    "aten.narrow.default", "aten.index_select.default", "aten.gather.default", "aten.index.Tensor",
    "aten.alias.default", "aten.detach.default", "aten.movedim.int", "aten.repeat.default",
    "aten.tril.default", "aten.triu.default", "aten.view_as.default", "aten.expand_as.default",
]


def test_required_ops_have_rules():
    have = set(rules())
    assert [op for op in REQUIRED if op not in have] == []


@pytest.mark.parametrize("op", OURS)
def test_checker_passes(op):
    report = check_all([op])
    assert report.rules == 1 and report.no_samples == []
    assert [str(f) for f in report.wrong] == []
    # Every op offers more than the all-Replicate fallback on its samples.
    assert report.strategies > report.samples


def _strategies(op, *args):
    node, graph, _ = sample_graph(op, Sample(tuple(args)))
    return {(s.inputs, s.outputs) for s in strategies(node, graph)}, {s.local for s in strategies(node, graph)}


# --- view groups ---------------------------------------------------------------------------------

def test_view_groups_split_merge_and_ones():
    assert view_groups((4, 5, 768), (4, 5, 12, 64)) == [([0], [0]), ([1], [1]), ([2], [2, 3])]
    assert view_groups((4, 5, 7), (20, 7)) == [([0, 1], [0]), ([2], [1])]
    assert view_groups((2, 1, 12), (2, 3, 4)) == [([0], [0]), ([2], [1, 2])]
    assert view_groups((6, 10), (4, 15)) == [([0, 1], [0, 1])]
    assert view_groups((3, 4), (5, 2)) == []


def test_view_dim_map_needs_a_common_block():
    assert view_dim_map((6, 10), (4, 15)) == [(0, 0)]      # gcd(6, 4) = 2 blocks of 30 elements
    assert view_dim_map((5, 6), (6, 5)) == []              # gcd 1: no real shard


# --- the strategies plans rely on ----------------------------------------------------------------

def test_head_split_view_maps_hidden_to_heads():
    found, locals_ = _strategies("aten.view.default", T(2, 3, 768), [2, 3, 12, 64])
    assert ((Shard(2),), (Shard(2),)) in found            # head parallel
    assert ((Shard(0),), (Shard(0),)) in found            # data parallel
    assert ((Shard(1),), (Shard(1),)) in found            # sequence parallel
    assert ((P,), (P,)) in found
    assert not any(o == (Shard(3),) for _, o in found)     # the inner head_dim is never sharded
    assert "view_local" in locals_


def test_head_merge_view_maps_heads_to_hidden():
    found, _ = _strategies("aten._unsafe_view.default", T(2, 3, 12, 64), [2, 3, 768])
    assert ((Shard(2),), (Shard(2),)) in found
    assert ((Shard(3),), (Shard(2),)) not in found


def test_batch_merge_and_unmerge_views():
    found, _ = _strategies("aten.view.default", T(4, 5, 7), [20, 7])
    assert ((Shard(0),), (Shard(0),)) in found and ((Shard(2),), (Shard(1),)) in found
    assert not any(i == (Shard(1),) for i, _ in found)     # sequence inside a merged dim: no
    found, _ = _strategies("aten.reshape.default", T(20, 7), [4, 5, 7])
    assert ((Shard(0),), (Shard(0),)) in found and ((Shard(1),), (Shard(2),)) in found


def test_transpose_permute_and_t():
    found, _ = _strategies("aten.transpose.int", T(2, 5, 4, 3), 1, 2)
    assert {((Shard(1),), (Shard(2),)), ((Shard(2),), (Shard(1),)), ((Shard(0),), (Shard(0),))} <= found
    found, _ = _strategies("aten.permute.default", T(2, 5, 4, 3), [0, 2, 1, 3])
    assert ((Shard(1),), (Shard(2),)) in found and ((Shard(3),), (Shard(3),)) in found
    found, _ = _strategies("aten.t.default", T(4, 7))
    assert ((Shard(0),), (Shard(1),)) in found and ((Shard(1),), (Shard(0),)) in found


def test_expand_of_a_mask_shards_the_broadcast_batch():
    found, _ = _strategies("aten.expand.default", T(1, 1, 5, 5), [4, -1, 5, 5])
    assert ((R,), (Shard(0),)) in found and ((Shard(2),), (Shard(2),)) in found
    assert ((Shard(1),), (Shard(1),)) not in found


def test_squeeze_unsqueeze_flatten_keep_shards():
    found, _ = _strategies("aten.unsqueeze.default", T(4, 7), 1)
    assert ((Shard(1),), (Shard(2),)) in found
    found, _ = _strategies("aten.squeeze.dim", T(4, 1, 7), 1)
    assert ((Shard(2),), (Shard(1),)) in found
    found, _ = _strategies("aten.flatten.using_ints", T(2, 7, 3, 5), 1, 2)
    assert ((Shard(1),), (Shard(1),)) in found and ((Shard(3),), (Shard(2),)) in found
    assert ((Shard(2),), (Shard(1),)) not in found


def test_split_cat_stack_shard_other_dims():
    found, _ = _strategies("aten.split.Tensor", T(2, 5, 9), 3, 2)
    assert ((Shard(0),), (Shard(0),) * 3) in found and ((P,), (P,) * 3) in found
    assert not any(i == (Shard(2),) for i, _ in found)
    found, _ = _strategies("aten.cat.default", [T(2, 1, 6), T(2, 4, 6)], 1)   # ViT's class token
    assert ((Shard(0), Shard(0)), (Shard(0),)) in found and ((Shard(2), Shard(2)), (Shard(2),)) in found
    found, _ = _strategies("aten.stack.default", [T(4, 7), T(4, 7)], 1)
    assert ((Shard(1), Shard(1)), (Shard(2),)) in found


def test_cat_skips_an_empty_kv_cache():
    """Hugging Face GPT-2 concatenates an empty (0,) cache with keys of rank 4."""
    found, _ = _strategies("aten.cat.default", [T(0), T(2, 3, 5, 4)], -2)
    assert ((R, Shard(0)), (Shard(0),)) in found and ((R, Shard(1)), (Shard(1),)) in found


def test_slices_and_selects():
    found, _ = _strategies("aten.slice.Tensor", T(2, 17), 1, 1, 2**63 - 1)     # label shift
    assert ((Shard(0),), (Shard(0),)) in found and ((Shard(1),), (Shard(1),)) not in found
    found, _ = _strategies("aten.slice.Tensor", T(2, 17), 1, 0, 2**63 - 1)     # x[:, :]
    assert ((Shard(1),), (Shard(1),)) in found
    found, _ = _strategies("aten.select.int", T(2, 17, 6), 1, 0)               # ViT's CLS token
    assert ((Shard(0),), (Shard(0),)) in found and ((Shard(2),), (Shard(1),)) in found


def test_indexing_shards_the_index():
    found, _ = _strategies("aten.index_select.default", T(11, 7), 0, Ids(11, 8))
    assert ((R, Shard(0)), (Shard(0),)) in found and ((Shard(1), R), (Shard(1),)) in found
    found, _ = _strategies("aten.index.Tensor", T(11, 7), [Ids(11, 4, 5)])
    assert ((R, Shard(0)), (Shard(0),)) in found and ((R, Shard(1)), (Shard(1),)) in found
    assert ((Shard(1), R), (Shard(2),)) in found
    found, _ = _strategies("aten.gather.default", T(4, 11), 1, Ids(11, 4, 6))
    assert ((Shard(0), Shard(0)), (Shard(0),)) in found and ((R, Shard(1)), (Shard(1),)) in found


def test_causal_mask_rows_and_columns():
    found, locals_ = _strategies("aten.tril.default", T(2, 7, 7))
    assert {((Shard(0),), (Shard(0),)), ((Shard(1),), (Shard(1),)), ((Shard(2),), (Shard(2),))} <= found
    assert "tril_local" in locals_


# --- the checker really looks --------------------------------------------------------------------

def test_checker_rejects_a_shard_inside_a_merged_dim():
    """Sharding the sequence of [B, S, H] -> [B*S, H] is not a contiguous piece: wrong."""
    err = check_strategy("aten.view.default", Sample((T(4, 5, 7), [20, 7])),
                         Strategy((Shard(1),), (Shard(0),), "view_local"))
    assert err is not None


def test_head_view_cuts_whole_heads():
    _, graph, _ = sample_graph("aten.view.default", Sample((T(2, 3, 768), [2, 3, 12, 64])))
    prog = DistProgram(graph, (0.5, 0.3, 0.2), {"in0": Replicate()})
    prog.steps = [Redistribute("in0", "in0@0", R, Shard(2)),
                  Compute("n", Strategy((Shard(2),), (Shard(2),), "view_local"), ("in0@0",))]
    assert prog.lengths("out0", 2) == [6, 4, 2]
    assert prog.lengths("in0@0", 2) == [384, 256, 128]


# --- end to end: a head-parallel block on three uneven ranks --------------------------------------

class _Heads(torch.nn.Module):
    """Separate q, k, v projections, heads split by view + transpose and merged back."""

    def __init__(self, hidden: int = 30, heads: int = 6):
        super().__init__()
        self.q = torch.nn.Linear(hidden, hidden)
        self.k = torch.nn.Linear(hidden, hidden)
        self.v = torch.nn.Linear(hidden, hidden)
        self.heads = heads

    def forward(self, x):
        b, s, h = x.shape
        q = self.q(x).view(b, s, self.heads, h // self.heads).transpose(1, 2)
        k = self.k(x).view(b, s, self.heads, h // self.heads).transpose(1, 2)
        y = (q * k).transpose(1, 2).reshape(b, s, h) * self.v(x)
        return y.flatten(0, 1).unsqueeze(0).pow(2).sum()


def _greedy(graph, shares, source_layouts):
    """Each node takes a rule strategy that accepts its inputs' current layouts; otherwise the
    inputs are gathered and it runs replicated."""
    prog = DistProgram(graph, shares, dict(source_layouts))
    layout = dict(source_layouts)
    for node in graph.nodes:
        refs = node.input_refs()
        now = tuple(layout[r] for r in refs)
        found = [s for s in strategies(node, graph) if s.inputs == now]
        strat = found[0] if found else next(s for s in strategies(node, graph) if s.is_replicated)
        read = []
        for i, (ref, want) in enumerate(zip(refs, strat.inputs)):
            if layout[ref] == want:
                read.append(ref)
            else:
                read.append(f"{ref}@{node.name}{i}")
                prog.steps.append(Redistribute(ref, read[-1], layout[ref], want))
        prog.steps.append(Compute(node.name, strat, tuple(read)))
        layout.update(zip(node.outputs, strat.outputs))
    return prog, layout


def test_head_parallel_block_matches_single_device():
    torch.manual_seed(0)
    model = _Heads().double()
    x = torch.randn(4, 5, 30, dtype=torch.float64)
    traced = trace(model, (x,))
    graph = traced.graph
    sources = {n: R for n in graph.inputs}
    sources.update({p: Shard(0) for p in graph.params})      # column-parallel q, k, v
    prog, layout = _greedy(graph, (0.5, 0.3, 0.2), sources)
    ops = {n.op: layout[n.outputs[0]] for n in graph.nodes}
    assert ops["aten.view.default"] == Shard(2)               # the chain stayed head-sharded
    assert ops["aten.transpose.int"] == Shard(2)              # ... through both transposes
    assert ops["aten.reshape.default"] == Shard(2)
    assert ops["aten.flatten.using_ints"] == Shard(1)
    assert ops["aten.unsqueeze.default"] == Shard(2)
    want = run(replicated_program(graph), traced, (x,))
    got = run(prog, traced, (x,))
    assert torch.allclose(got.loss, want.loss, atol=1e-9, rtol=0)
    for name in graph.params:
        assert torch.allclose(got.grads[name], want.grads[name], atol=1e-9, rtol=0), name
    # Every rank holds whole heads: the weight rows come in blocks of head_dim (5).
    assert all(n % 5 == 0 for n in prog.lengths(graph.params[0], 0))


class _Shapes(torch.nn.Module):
    """The Python spellings of view, shape and indexing ops, as a user writes them."""

    def forward(self, x, idx, idx2):
        y = x.view(4, 6, 5).reshape(24, 5).t().transpose(0, 1).permute(1, 0)
        y = y.flatten().unflatten(0, (4, 6, 5)).unsqueeze(0).squeeze(0).unsqueeze(2).squeeze()
        y = y.unsqueeze(0).squeeze((0,)).detach() + y
        a, b = y.split(2, dim=2)[:2]
        z = torch.cat([a, b, y.chunk(5, dim=2)[0]], dim=2) + torch.stack([a, b]).sum(0).repeat(1, 1, 3)[..., :5]
        s = z[:, 1:5][:, 2] + z.narrow(1, 0, 1).squeeze(1) + y.unbind(1)[0]
        g = torch.index_select(s, 1, idx) + torch.gather(s, 1, idx2)
        h = x[idx].sum() + x[:, idx].sum() + s.expand(2, 4, 5).sum() + y.movedim(0, 1).sum()
        return g.sum() + h + torch.tril(y).sum() + x.view_as(x).sum() + x.expand_as(x).sum()


def test_traced_spellings_all_have_rules():
    """The overload names torch.export emits are the ones registered."""
    x = torch.randn(24, 5)
    traced = trace(_Shapes(), (x, torch.tensor([0, 2, 1]), torch.randint(0, 5, (4, 3))))
    ours = {op for op in traced.graph.ops() if not op.startswith(("aten.add", "aten.sum"))}
    assert {"aten.view.default", "aten.split.Tensor", "aten.index.Tensor", "aten.gather.default"} <= ours
    assert sorted(ours - set(OURS)) == []
