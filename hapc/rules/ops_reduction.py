"""Reductions (sum, mean, max, var, norms, logsumexp) and the softmax family.

A dimension that is kept may be sharded freely. A *summed* dimension may be sharded too:
each rank sums its piece and the output is ``Partial``. A *mean* over a sharded dimension is
a sum divided by the global length, which the strategy's ``rescale`` gives exactly even for
uneven pieces. Other reductions (max, var, softmax over a dim) need the whole dimension.
"""

from __future__ import annotations

from collections.abc import Sequence

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import Layout, P, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register_spec
from hapc.rules.samples import T
from hapc.rules.spec import normalize_dim


def _reduced_dims(node: Node, graph: Graph, dim_arg: int = 1) -> tuple[list[int], bool]:
    """Which input dims the node reduces, and whether they are kept (keepdim)."""
    rank = len(graph.meta(node.input_refs()[0]).shape)
    dims = node.args[dim_arg] if len(node.args) > dim_arg else node.kwargs.get("dim")
    if dims is None or dims == []:
        return list(range(rank)), False
    dims = [dims] if isinstance(dims, int) else list(dims)
    keep_pos = dim_arg + 1
    keepdim = node.args[keep_pos] if len(node.args) > keep_pos else node.kwargs.get("keepdim", False)
    return sorted(normalize_dim(d, rank) for d in dims), bool(keepdim)


def _kept_strategies(shape: Sequence[int], reduced: list[int], keepdim: bool, n_out: int) -> list[Strategy]:
    found = []
    for d, size in enumerate(shape):
        if d in reduced or size <= 1:
            continue
        out_dim = d if keepdim else d - sum(1 for r in reduced if r < d)
        found.append(Strategy((Shard(d),), tuple(Shard(out_dim) for _ in range(n_out))))
    return found


def reduction_rule(kind: str, dim_arg: int = 1):
    """``kind``: "sum" (Partial over a sharded summed dim), "mean" (same, rescaled) or "other"."""
    def rule(node: Node, graph: Graph) -> list[Strategy]:
        shape = graph.meta(node.input_refs()[0]).shape
        reduced, keepdim = _reduced_dims(node, graph, dim_arg)
        found = _kept_strategies(shape, reduced, keepdim, len(node.outputs))
        if kind in ("sum", "mean"):
            for d in reduced:
                if shape[d] > 1:
                    found.append(Strategy((Shard(d),), (P,), rescale=(0, d) if kind == "mean" else None))
            found.append(Strategy((P,), (P,)))
        return found
    return rule


register_spec("aten.sum.default", reduction_rule("sum"), samples=lambda: [Sample((T(5, 7),))])
register_spec("aten.sum.dim_IntList", reduction_rule("sum"),
              samples=lambda: [Sample((T(5, 7, 4), [1])), Sample((T(5, 7, 4), [0, 2], True))])
register_spec("aten.mean.default", reduction_rule("mean"), samples=lambda: [Sample((T(5, 7),))])
register_spec("aten.mean.dim", reduction_rule("mean"),
              samples=lambda: [Sample((T(5, 7, 4), [1])), Sample((T(5, 7, 4), [-1, 0], True))])
register_spec(["aten.amax.default", "aten.amin.default"], reduction_rule("other"),
              samples=lambda: [Sample((T(5, 7, 4), [1])), Sample((T(5, 7, 4), [2], True))])
register_spec(["aten.logsumexp.default", "aten.any.dim", "aten.all.dim", "aten.prod.dim_int"],
              reduction_rule("other"), samples=lambda: [Sample((T(5, 7, 4), 1))])
register_spec(["aten.var.correction", "aten.std.correction"], reduction_rule("other"),
              samples=lambda: [Sample((T(5, 7, 4), [1]), {"correction": 1}),
                               Sample((T(5, 7, 4), [2]), {"correction": 0, "keepdim": True})])
register_spec(["aten.var.dim", "aten.std.dim"], reduction_rule("other"),
              samples=lambda: [Sample((T(5, 7, 4), [1]))])
register_spec("aten.linalg_vector_norm.default", reduction_rule("other", dim_arg=2),
              samples=lambda: [Sample((T(5, 7, 4), 2, [1]))])


def softmax_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Softmax-like ops normalise along ``dim``: every other dimension may be sharded."""
    shape = graph.meta(node.input_refs()[0]).shape
    dim = normalize_dim(node.args[1], len(shape))
    found: list[Strategy] = []
    for d, size in enumerate(shape):
        if d != dim and size > 1:
            ins: tuple[Layout, ...] = tuple(Shard(d) for _ in node.input_refs())
            found.append(Strategy(ins, (Shard(d),)))
    return found


register_spec(["aten.softmax.int", "aten.log_softmax.int"], softmax_rule,
              samples=lambda: [Sample((T(5, 7, 4), -1)), Sample((T(5, 7, 4), 1))])
register_spec(["aten._softmax.default", "aten._log_softmax.default"], softmax_rule,
              samples=lambda: [Sample((T(5, 7, 4), -1, False))])
