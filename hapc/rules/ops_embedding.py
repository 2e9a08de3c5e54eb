"""Embedding lookups: data-parallel, hidden-sharded, and vocabulary-parallel.

Vocabulary parallelism (Megatron's) shards the table by rows: each rank looks up the ids it
owns and returns zeros for the others, so the output is ``Partial`` and one all-reduce (or a
reduce-scatter into a sequence shard) completes it. The lookup is linear in the table, so a
``Partial`` table gives a ``Partial`` output.
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


@register("aten.embedding.default",
          samples=lambda: [Sample((T(11, 6), Ids(11, 5, 7))), Sample((T(11, 6), Ids(11, 7)))])
def embedding_rule(node: Node, graph: Graph) -> list[Strategy]:
    weight, ids = node.input_refs()[:2]
    vocab, hidden = graph.meta(weight).shape
    id_shape = graph.meta(ids).shape
    out_rank = len(id_shape) + 1
    found = [Strategy((R, Shard(d)), (Shard(d),)) for d, n in enumerate(id_shape) if n > 1]
    if hidden > 1:
        found.append(Strategy((Shard(1), R), (Shard(out_rank - 1),)))
    padding_idx = _arg(node, 2, "padding_idx", -1)
    if vocab > 1 and padding_idx in (-1, None):
        found.append(Strategy((Shard(0), R), (P,), local="vocab_parallel_embedding"))
    found.append(Strategy((P, R), (P,)))
    return found
