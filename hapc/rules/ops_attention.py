"""Scaled dot-product attention: batch, head and query-sequence parallelism.

``q, k, v`` are ``[batch, heads, seq, head_dim]``. Batch and heads are independent, so
sharding either shards everything alike (head parallelism is Megatron's attention split).
Sharding the *query* sequence keeps keys and values whole on every rank; with a causal mask
each rank must shift the mask by its first query position, which
:func:`hapc.runtime.local_ops.sdpa_query_shard` does. The output is linear in ``v``.

With attention dropout (``dropout_p > 0``) every strategy runs
:func:`hapc.runtime.random_ops.sdpa_dropout`: attention written out with a mask drawn for the
rank's piece of the global attention weights from a seed all ranks share, so sharded attention
drops exactly the weights one device would (and ``--verify`` replays them).
"""

from __future__ import annotations

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import Layout, P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register
from hapc.rules.samples import B, T


def _arg(node: Node, pos: int, name: str, default):
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


def _mask_layout(mask_shape: tuple[int, ...], dim: int, size: int) -> Layout:
    """The mask broadcasts against ``[B, H, Sq, Sk]``: shard its aligned dim unless it is 1."""
    k = dim - (4 - len(mask_shape))
    return Shard(k) if k >= 0 and mask_shape[k] == size and size > 1 else R


@register("aten.scaled_dot_product_attention.default", samples=lambda: [
    Sample((T(5, 4, 7, 3), T(5, 4, 7, 3), T(5, 4, 7, 3))),
    Sample((T(5, 4, 7, 3), T(5, 4, 7, 3), T(5, 4, 7, 3)), {"is_causal": True}),
    Sample((T(5, 4, 7, 3), T(5, 4, 6, 3), T(5, 4, 6, 3), B(5, 1, 7, 6))),
    Sample((T(5, 4, 7, 3), T(5, 4, 6, 3), T(5, 4, 6, 3), T(7, 6))),
    Sample((T(5, 4, 7, 3), T(5, 4, 7, 3), T(5, 4, 7, 3)), {"dropout_p": 0.3, "is_causal": True}),
    Sample((T(5, 4, 7, 3), T(5, 4, 6, 3), T(5, 4, 6, 3), B(5, 1, 7, 6), 0.2)),
])
def sdpa_rule(node: Node, graph: Graph) -> list[Strategy]:
    refs = node.input_refs()
    q, k = graph.meta(refs[0]).shape, graph.meta(refs[1]).shape
    if len(q) != 4 or len(k) != 4:
        return []
    has_mask = len(refs) == 4
    mask_shape = graph.meta(refs[3]).shape if has_mask else ()
    causal = bool(_arg(node, 5, "is_causal", False))
    gqa = bool(_arg(node, 7, "enable_gqa", False)) and q[1] != k[1]
    found = []
    for dim in (0, 1):
        if q[dim] <= 1 or (dim == 1 and gqa):
            continue
        ins: tuple[Layout, ...] = (Shard(dim),) * 3
        if has_mask:
            ins += (_mask_layout(mask_shape, dim, q[dim]),)
        found.append(Strategy(ins, (Shard(dim),)))
    if q[2] > 1:
        ins = (Shard(2), R, R) + ((_mask_layout(mask_shape, 2, q[2]),) if has_mask else ())
        found.append(Strategy(ins, (Shard(2),), local="sdpa_query_shard" if causal else None))
    found.append(Strategy((R, R, P) + ((R,) if has_mask else ()), (P,)))
    if _arg(node, 4, "dropout_p", 0.0):    # every layout, replicated too, draws the shared mask
        found = [Strategy((R,) * len(refs), (R,))] + found
        found = [Strategy(s.inputs, s.outputs, local="sdpa_dropout") for s in found]
    return found
