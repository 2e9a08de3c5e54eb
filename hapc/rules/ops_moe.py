"""The ops of mixture-of-experts gating and dispatch: top-k, one-hot masks, capacity
positions (cumsum), sorting, arg-extremes, and scatter/index_add/histc for dispatch and
expert counts. The dispatch and combine products themselves are einsums (ops_matmul.py).

Most of these ops work slice by slice along one dimension, so every *other* dimension
shards freely. Three strategies go further, because MoE layers need them to keep tokens or
experts sharded:

* ``cumsum`` over a sharded dimension (capacity positions over sharded tokens) is an
  exclusive scan of the pieces' totals: ``cumsum_scan`` adds the totals of lower ranks.
* ``one_hot`` can emit a shard of the *class* dimension from replicated ids (expert-sharded
  dispatch masks): ``one_hot_class_shard``.
* ``scatter``/``index_add`` into a tensor sharded along the scatter dimension redirect the
  indices other ranks own to a scratch slot (``*_into_piece``); with the *source* sharded
  along that dimension (each rank holds some tokens), additive forms give a ``Partial`` sum
  (per-expert token counts over sharded tokens).
"""

from __future__ import annotations

import torch

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import Layout, P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.ops_conv import arg
from hapc.rules.registry import Sample, register, register_spec
from hapc.rules.samples import Ids, T
from hapc.rules.spec import normalize_dim

_gen = torch.Generator().manual_seed(4321)


def along_dim_strategies(node: Node, graph: Graph, dim: int | None, keepdim: bool = True) -> list[Strategy]:
    """Ops that work independently on every slice along ``dim``: shard any other dim.

    Every output gets the same shard; with ``keepdim=False`` the output has lost ``dim``.
    """
    shape = graph.meta(node.input_refs()[0]).shape
    if dim is None:
        return []
    dim = normalize_dim(dim, len(shape))
    found = []
    for d, size in enumerate(shape):
        if d == dim or size <= 1:
            continue
        out_d = d if keepdim or d < dim else d - 1
        found.append(Strategy((Shard(d),), tuple(Shard(out_d) for _ in node.outputs)))
    return found


# --- top-k, sort, arg-extremes -------------------------------------------------------------

register_spec("aten.topk.default", lambda n, g: along_dim_strategies(n, g, arg(n, 2, "dim", -1)),
              samples=lambda: [Sample((T(5, 7), 3)), Sample((T(7, 5, 4), 2, 1, False)),
                               Sample((T(5, 7, 4), 1, 0))])
register_spec("aten.sort.default", lambda n, g: along_dim_strategies(n, g, arg(n, 1, "dim", -1)),
              samples=lambda: [Sample((T(5, 7),)), Sample((T(7, 5, 4), 1, True))])
register_spec("aten.sort.stable", lambda n, g: along_dim_strategies(n, g, arg(n, None, "dim", -1)),
              samples=lambda: [Sample((T(5, 7),), {"stable": True}),
                               Sample((Ids(3, 7, 5),), {"stable": True, "dim": 0, "descending": True})])
register_spec("aten.argsort.default", lambda n, g: along_dim_strategies(n, g, arg(n, 1, "dim", -1)),
              samples=lambda: [Sample((T(5, 7),)), Sample((T(7, 5, 4), 0, True))])
register_spec("aten.argsort.stable", lambda n, g: along_dim_strategies(n, g, arg(n, None, "dim", -1)),
              samples=lambda: [Sample((Ids(3, 5, 7),), {"stable": True, "dim": 1})])


def _extreme_rule(node: Node, graph: Graph) -> list[Strategy]:
    """max.dim/min.dim/argmax/argmin: shard the dims kept (argmax over all dims: none)."""
    return along_dim_strategies(node, graph, arg(node, 1, "dim"), bool(arg(node, 2, "keepdim", False)))


register_spec(["aten.max.dim", "aten.min.dim"], _extreme_rule,
              samples=lambda: [Sample((T(5, 7), 1)), Sample((T(7, 5, 4), 0, True)), Sample((T(5, 7, 4), -2))])
register_spec(["aten.argmax.default", "aten.argmin.default"], _extreme_rule,
              samples=lambda: [Sample((T(5, 7), -1)), Sample((T(7, 5, 4), 1, True)), Sample((T(5, 7),))])


# --- cumulative sums -----------------------------------------------------------------------

@register("aten.cumsum.default", samples=lambda: [
    Sample((T(7, 5), 0)), Sample((T(5, 7, 4), -2)), Sample((Ids(2, 10, 4), 0)),
    Sample((Ids(3, 10, 4), 0), {"dtype": torch.float64})])
def cumsum_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Other dims shard freely; the scanned dim shards through an exclusive scan of the
    pieces' totals (one all-reduce). cumsum is linear, so Partial passes through."""
    meta = graph.meta(node.input_refs()[0])
    dim = normalize_dim(arg(node, 1, "dim"), len(meta.shape))
    found = along_dim_strategies(node, graph, dim)
    if meta.shape[dim] > 1:
        found.append(Strategy((Shard(dim),), (Shard(dim),), local="cumsum_scan"))
    if meta.dtype != "bool":
        found.append(Strategy((P,), (P,)))
    return found


register_spec("aten.cumprod.default", lambda n, g: along_dim_strategies(n, g, arg(n, 1, "dim")),
              samples=lambda: [Sample((T(7, 5), 0)), Sample((T(5, 7, 4), -1))])


# --- one-hot masks and histograms ----------------------------------------------------------

@register("aten.one_hot.default", samples=lambda: [Sample((Ids(5, 7, 4), 5)), Sample((Ids(8, 10), 8)),
                                                  Sample((Ids(4, 5, 2, 7), 4))])
def one_hot_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Every id dim maps to the same output dim; the class dim shards from replicated ids."""
    shape = graph.meta(node.input_refs()[0]).shape
    out = graph.meta(node.outputs[0]).shape
    found = [Strategy((Shard(d),), (Shard(d),)) for d, size in enumerate(shape) if size > 1]
    if out[-1] > 1:
        found.append(Strategy((R,), (Shard(len(shape)),), local="one_hot_class_shard"))
    return found


@register("aten.histc.default", samples=lambda: [Sample((T(10, 7), 6, -2.0, 2.0)), Sample((T(11,), 4, -1, 1))])
def histc_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Counts of pieces add up (``Partial``) when the range is fixed; with min == max the
    range comes from the data's own extremes, which a piece does not know."""
    shape = graph.meta(node.input_refs()[0]).shape
    if arg(node, 2, "min", 0) == arg(node, 3, "max", 0):
        return []
    return [Strategy((Shard(d),), (P,)) for d, size in enumerate(shape) if size > 1]


# --- scatter and index_add -----------------------------------------------------------------

def _scatter_strategies(node: Node, graph: Graph, index_pos: int, src_pos: int | None, local: str,
                        additive: bool, tokens_partial: bool) -> list[Strategy]:
    """Shared by scatter/scatter_add/scatter_reduce/index_add.

    ``index_pos``/``src_pos``: positions of index and source among the tensor inputs (self
    is 0). index_add's index is 1-D along ``dim``; the scatter family's index has self's rank.
    """
    refs = node.input_refs()
    shapes = [graph.meta(r).shape for r in refs]
    self_shape = shapes[0]
    dim = normalize_dim(arg(node, 1, "dim"), len(self_shape))
    index_1d = node.op == "aten.index_add.default"
    n = len(refs)

    def lay(self_l: Layout, index_l: Layout, src_l: Layout) -> tuple[Layout, ...]:
        out: list[Layout] = [R] * n
        out[0], out[index_pos] = self_l, index_l
        if src_pos is not None:
            out[src_pos] = src_l
        return tuple(out)

    found = []
    for d, size in enumerate(self_shape):
        if d == dim or size <= 1:
            continue
        # Other dims: index (scatter family) and source must cover self's whole extent.
        if src_pos is not None and shapes[src_pos][d] != size:
            continue
        if not index_1d and shapes[index_pos][d] != size:
            continue
        found.append(Strategy(lay(Shard(d), R if index_1d else Shard(d), Shard(d)), (Shard(d),)))
    if self_shape[dim] > 1:
        found.append(Strategy(lay(Shard(dim), R, R), (Shard(dim),), local=local))
    if additive:
        found.append(Strategy(lay(P, R, P), (P,)))
    if tokens_partial and src_pos is not None:
        # Each rank adds its own tokens (index and source pieces along dim) into a Partial sum.
        index_dim = 0 if index_1d else dim
        if shapes[index_pos][index_dim] == shapes[src_pos][dim] > 1:
            found.append(Strategy(lay(P, Shard(index_dim), Shard(dim)), (P,)))
    return found


def _perm_index(rows: int, high: int, k: int) -> torch.Tensor:
    """[rows, k] ids in [0, high), distinct within a row: a deterministic scatter."""
    return torch.stack([torch.randperm(high, generator=_gen)[:k] for _ in range(rows)])


register_spec("aten.scatter.src",
              lambda n, g: _scatter_strategies(n, g, 1, 2, "scatter_into_piece", False, False),
              samples=lambda: [Sample((T(5, 7), 1, _perm_index(5, 7, 3), T(5, 3))),
                               Sample((T(7, 5), 0, _perm_index(5, 7, 4).T.contiguous(), T(4, 5)))])
register_spec("aten.scatter.value",
              lambda n, g: _scatter_strategies(n, g, 1, None, "scatter_into_piece", False, False),
              samples=lambda: [Sample((T(5, 7), 1, _perm_index(5, 7, 2), 1.5)),
                               Sample((T(7, 5), 0, Ids(7, 3, 5), 0.0))])
register_spec("aten.scatter_add.default",
              lambda n, g: _scatter_strategies(n, g, 1, 2, "scatter_add_into_piece", True, True),
              samples=lambda: [Sample((T(7,), 0, Ids(7, 10), T(10))),
                               Sample((T(7, 5), 0, Ids(7, 10, 5), T(10, 5))),
                               Sample((T(5, 7), 1, Ids(7, 5, 4), T(5, 4)))])


@register("aten.scatter_reduce.two", samples=lambda: [
    Sample((T(7, 5), 0, Ids(7, 10, 5), T(10, 5), "sum")),
    Sample((T(7, 5), 0, Ids(7, 10, 5), T(10, 5), "mean"), {"include_self": False}),
    Sample((T(5, 7), 1, _perm_index(5, 7, 3), T(5, 3), "amax"))])
def scatter_reduce_rule(node: Node, graph: Graph) -> list[Strategy]:
    """sum and mean are linear (Partial passes); sharded tokens sum into a Partial only when
    self is included (otherwise a rank that hits a position drops its share of self)."""
    reduce = arg(node, 4, "reduce")
    include_self = bool(arg(node, None, "include_self", True))
    return _scatter_strategies(node, graph, 1, 2, "scatter_reduce_into_piece", reduce in ("sum", "mean"),
                               reduce == "sum" and include_self)


register_spec("aten.index_add.default",
              lambda n, g: _scatter_strategies(n, g, 1, 2, "index_add_into_piece", True, True),
              samples=lambda: [Sample((T(7, 5), 0, Ids(7, 10), T(10, 5))),
                               Sample((T(5, 7), 1, Ids(7, 4), T(5, 4)), {"alpha": 2.0}),
                               Sample((T(7,), 0, Ids(7, 10), T(10)))])
