"""The strategies that matter most for real plans exist (a regression that silently drops
them would otherwise only show as slower plans)."""

from __future__ import annotations

import torch

from hapc.ir.layout import P, R, Shard
from hapc.rules import strategies
from hapc.rules.check import sample_graph
from hapc.rules.registry import Sample
from hapc.rules.samples import Ids, T


def _strats(op, *args, **kwargs):
    node, graph, _ = sample_graph(op, Sample(args, kwargs))
    return {(s.inputs, s.outputs): s for s in strategies(node, graph)}


def test_linear_column_row_and_data_parallel():
    s = _strats("aten.linear.default", T(4, 6, 10), T(8, 10), T(8))
    assert ((Shard(0), R, R), (Shard(0),)) in s            # data parallel
    assert ((R, Shard(0), Shard(0)), (Shard(2),)) in s      # column parallel
    assert ((Shard(2), Shard(1), P), (P,)) in s             # row parallel, bias added once
    assert ((Shard(2), Shard(1), R), (P,)) not in s


def test_embedding_vocab_parallel_and_loss_batch_mean():
    s = _strats("aten.embedding.default", T(11, 6), Ids(11, 4, 5))
    assert s[((Shard(0), R), (P,))].local == "vocab_parallel_embedding"
    ce = _strats("aten.cross_entropy_loss.default", T(7, 11), Ids(11, 7))
    assert ce[((Shard(0), Shard(0)), (P,))].local == "cross_entropy_batch"
    assert ce[((Shard(1), R), (P,))].local == "vocab_parallel_cross_entropy"


def test_attention_head_batch_and_sequence():
    q = T(2, 4, 7, 3)
    s = _strats("aten.scaled_dot_product_attention.default", q, q, q, is_causal=True)
    assert ((Shard(1),) * 3, (Shard(1),)) in s
    assert ((Shard(0),) * 3, (Shard(0),)) in s
    assert s[((Shard(2), R, R), (Shard(2),))].local == "sdpa_query_shard"


def test_mean_over_sharded_dim_is_rescaled_partial():
    s = _strats("aten.mean.dim", T(5, 7), [0])
    assert s[((Shard(0),), (P,))].rescale == (0, 0)
    assert ((Shard(1),), (Shard(0),)) in s


def test_op_without_rule_is_replicated_only():
    node, graph, _ = sample_graph("aten.cummax.default", Sample((T(5, 7), 1)))
    (only,) = strategies(node, graph)
    assert only.is_replicated
    assert torch.ops.aten.cummax.default is not None
