"""Embedding lookups: data-parallel, hidden-sharded, and vocabulary-parallel.

Vocabulary parallelism (Megatron's) shards the table by rows: each rank looks up the ids it
owns and returns zeros for the others, so the output is ``Partial`` and one all-reduce (or a
reduce-scatter into a sequence shard) completes it. The lookup is linear in the table, so a
``Partial`` table gives a ``Partial`` output.

A ``padding_idx`` (Hugging Face's Llama and BERT set one) only changes the backward: that
row's gradient stays zero. The rank owning the row passes it on, shifted to its local index,
so vocabulary parallelism keeps torch's gradient exactly. ``scale_grad_by_freq`` divides each
row's gradient by its count in the whole batch, which neither a shard of the ids nor a shard of
the vocabulary sees; ``sparse`` gives a sparse gradient: with either, only the hidden dimension
is sharded.
"""

from __future__ import annotations

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register
from hapc.rules.samples import Ids, T


def _arg(node: Node, pos: int, name: str, default):
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


def _padded_ids(vocab: int, padding_idx: int, *shape: int):
    """Random ids in which ``padding_idx`` surely occurs (a padded batch)."""
    ids = Ids(vocab, *shape)
    ids.view(-1)[: max(1, ids.numel() // 4)] = padding_idx
    return ids


def _samples() -> list[Sample]:
    # Vocabulary 11 over shares 0.5/0.3/0.2 is cut 6/3/2: rows 0, 7 and 10 fall on ranks 0, 1, 2.
    return [Sample((T(11, 6), Ids(11, 5, 7))), Sample((T(11, 6), Ids(11, 7))),
            Sample((T(11, 6), _padded_ids(11, 0, 5, 7), 0)), Sample((T(11, 6), _padded_ids(11, 7, 5, 7), 7)),
            Sample((T(11, 6), _padded_ids(11, 10, 13), 10)),
            Sample((T(11, 6), Ids(11, 5, 7), -1, True))]


@register("aten.embedding.default", samples=_samples)
def embedding_rule(node: Node, graph: Graph) -> list[Strategy]:
    weight, ids = node.input_refs()[:2]
    vocab, hidden = graph.meta(weight).shape
    id_shape = graph.meta(ids).shape
    out_rank = len(id_shape) + 1
    whole_batch_grad = _arg(node, 3, "scale_grad_by_freq", False) or _arg(node, 4, "sparse", False)
    found = [] if whole_batch_grad else [
        Strategy((R, Shard(d)), (Shard(d),)) for d, n in enumerate(id_shape) if n > 1]
    if hidden > 1:
        found.append(Strategy((Shard(1), R), (Shard(out_rank - 1),)))
    if vocab > 1 and not whole_batch_grad:
        found.append(Strategy((Shard(0), R), (P,), local="vocab_parallel_embedding"))
    found.append(Strategy((P, R), (P,)))
    return found
