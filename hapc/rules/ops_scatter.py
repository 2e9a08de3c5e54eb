"""Writes of one tensor into a slice of another (and fills), as the tracer's functionalization emits them
for in-place writes (``shifted[:, 1:] = labels[:, :-1]`` becomes ``slice_scatter``; a write
into ``x[:, 0]`` becomes ``select_scatter``).

Any dimension but the written one may be sharded, alike in the base, the source and the
result. The result is linear in (base, source) jointly: ``Partial`` in, ``Partial`` out.
"""

from __future__ import annotations

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import P, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register
from hapc.rules.samples import Ids, T
from hapc.rules.spec import normalize_dim, pointwise_strategies


def _arg(node: Node, pos: int, name: str, default):
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


def _scatter_strategies(node: Node, graph: Graph, dim: int, src_drops_dim: bool) -> list[Strategy]:
    base, src = node.input_refs()[:2]
    shape, src_shape = graph.meta(base).shape, graph.meta(src).shape
    found = []
    for d, size in enumerate(shape):
        if d == dim or size <= 1:
            continue
        s = d - 1 if src_drops_dim and d > dim else d
        if src_shape[s] != size:
            continue
        found.append(Strategy((Shard(d), Shard(s)), (Shard(d),)))
    if graph.meta(base).dtype.startswith(("float", "bfloat")):
        found.append(Strategy((P, P), (P,)))
    return found


@register("aten.slice_scatter.default", samples=lambda: [
    Sample((T(5, 7), T(5, 6), 1, 1)), Sample((T(5, 7, 4), T(2, 7, 4), 0, 3, 5)),
    Sample((Ids(9, 5, 7), Ids(9, 5, 3), 1, 0, 6, 2))])
def slice_scatter_rule(node: Node, graph: Graph) -> list[Strategy]:
    rank = len(graph.meta(node.input_refs()[0]).shape)
    dim = normalize_dim(_arg(node, 2, "dim", 0), rank)
    return _scatter_strategies(node, graph, dim, src_drops_dim=False)


@register("aten.select_scatter.default", samples=lambda: [
    Sample((T(5, 7), T(5), 1, 0)), Sample((T(5, 7, 4), T(5, 4), 1, -1)), Sample((Ids(9, 5, 7), Ids(9, 7), 0, 2))])
def select_scatter_rule(node: Node, graph: Graph) -> list[Strategy]:
    rank = len(graph.meta(node.input_refs()[0]).shape)
    dim = normalize_dim(_arg(node, 2, "dim", 0), rank)
    return _scatter_strategies(node, graph, dim, src_drops_dim=True)


@register("aten.fill.Tensor", samples=lambda: [
    Sample((T(5, 7), T())), Sample((Ids(9, 5, 7), Ids(9)))])
def fill_rule(node: Node, graph: Graph) -> list[Strategy]:
    """``x.fill_(value)`` functionalized: every element becomes the (0-dim) value, so any
    dimension of ``x`` may be sharded with the value replicated. Not linear in ``x``."""
    if graph.meta(node.input_refs()[1]).shape != ():
        return []
    return pointwise_strategies(node, graph, None)
