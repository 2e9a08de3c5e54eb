"""Joining, cutting and indexing: cat/stack, split/chunk/unbind, slice/select/narrow,
index_select/gather/index, pad, flip/roll, tril/triu.

The common thread: an op that picks or places elements *along* some dims leaves every other
dim alone, so a shard on an untouched dim passes through and the plain op runs on the
pieces (its positions refer to untouched, whole dims). A shard on a touched dim would need
global positions translated to local ones; only tril/triu do that (the diagonal shifts by
the piece's offset). Two more ways to shard come from the index tensors: an output row of
``index_select``/``gather``/``x[idx]`` depends only on its own index entries, so sharding the
*index* shards the output while the source stays ``Replicate``.

All ops here are linear in the tensor they read from, so ``Partial`` data with replicated
indices gives ``Partial`` output (``pad`` only with a zero fill).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hapc.ir.graph import Graph, Node, Ref
from hapc.ir.layout import Layout, P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register
from hapc.rules.samples import Ids, T
from hapc.rules.spec import normalize_dim, partial_strategies

INT_MAX = 9223372036854775807


def _arg(node: Node, pos: int, name: str, default: Any = None) -> Any:
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


def untouched_strategies(node: Node, graph: Graph, touched: Sequence[int], n_outputs: int = 1,
                         out_dim=lambda d: d) -> list[Strategy]:
    """One tensor input: ``S(d) -> S(out_dim(d))`` on every output for each dim ``d`` the op
    does not touch, then all-``Partial``. ``out_dim`` returns ``None`` for a dim that leaves."""
    shape = graph.meta(node.input_refs()[0]).shape
    touched = {normalize_dim(t, len(shape)) for t in touched}
    out_shape = graph.meta(node.outputs[0]).shape
    found = []
    for d, size in enumerate(shape):
        j = out_dim(d)
        if d in touched or size <= 1 or j is None or out_shape[j] != size:
            continue
        found.append(Strategy((Shard(d),), (Shard(j),) * n_outputs))
    return found + partial_strategies(1, "additive", n_outputs)


# --- cat and stack -----------------------------------------------------------------------------

def _cat_rule(stack: bool):
    def rule(node: Node, graph: Graph) -> list[Strategy]:
        """All inputs sharded alike on a dim other than the joined one."""
        refs = node.input_refs()
        all_shapes = [graph.meta(r).shape for r in refs]
        # cat skips empty 1-D tensors of any other rank (an empty KV cache in Hugging Face
        # GPT-2): they stay Replicate and take no part in the sharding.
        skipped = [not stack and s == (0,) for s in all_shapes]
        shapes = [s for s, skip in zip(all_shapes, skipped) if not skip]
        if not shapes or any(len(s) != len(shapes[0]) for s in shapes):
            return []
        rank = len(shapes[0])
        dim = normalize_dim(_arg(node, 1, "dim", 0), rank + stack)

        def lay(layout: Layout) -> tuple[Layout, ...]:
            return tuple(R if skip else layout for skip in skipped)

        found = []
        for d in range(rank):
            j = d + 1 if stack and d >= dim else d
            if (j == dim and not stack) or any(s[d] <= 1 or s[d] != shapes[0][d] for s in shapes):
                continue
            found.append(Strategy(lay(Shard(d)), (Shard(j),)))
        return found + [Strategy(lay(P), (P,))]
    return rule


register("aten.cat.default", samples=lambda: [Sample(([T(4, 1, 7), T(4, 5, 7)], 1)),
                                              Sample(([T(4, 7), T(3, 7), T(5, 7)],)),
                                              Sample(([T(4, 5, 7), T(4, 5, 2)], -1)),
                                              Sample(([T(0), T(4, 5, 7)], -2))])(_cat_rule(False))
register("aten.stack.default", samples=lambda: [Sample(([T(4, 7), T(4, 7)],)),
                                                Sample(([T(4, 7), T(4, 7), T(4, 7)], 1)),
                                                Sample(([T(4, 7), T(4, 7)], -1))])(_cat_rule(True))


# --- split, chunk, unbind ----------------------------------------------------------------------

def _split_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Every output sharded like the input on a dim other than the split one."""
    dim = _arg(node, 2, "dim", 0)
    return untouched_strategies(node, graph, [dim], len(node.outputs))


for _op, _samples in {
    "aten.split.Tensor": lambda: [Sample((T(4, 11, 7), 3, 1)), Sample((T(10, 7), 4))],
    "aten.unsafe_split.Tensor": lambda: [Sample((T(4, 11, 7), 3, 1))],
    "aten.split_with_sizes.default": lambda: [Sample((T(4, 11, 7), [2, 5, 4], 1)),
                                              Sample((T(4, 7), [5, 2], -1))],
    "aten.chunk.default": lambda: [Sample((T(4, 11, 7), 3, 1)), Sample((T(10, 7), 2))],
    "aten.unsafe_chunk.default": lambda: [Sample((T(4, 11, 7), 3, 1))],
    "aten.tensor_split.indices": lambda: [Sample((T(4, 11, 7), [3, 11], 1)), Sample((T(10, 7), [2, 5]))],
    "aten.tensor_split.sections": lambda: [Sample((T(4, 11, 7), 3, 1)), Sample((T(10, 7), 4, -1))],
}.items():
    register(_op, samples=_samples)(_split_rule)


@register("aten.unbind.int", samples=lambda: [Sample((T(4, 3, 7), 1)), Sample((T(2, 5, 7),))])
def unbind_rule(node: Node, graph: Graph) -> list[Strategy]:
    rank = len(graph.meta(node.input_refs()[0]).shape)
    dim = normalize_dim(_arg(node, 1, "dim", 0), rank)
    return untouched_strategies(node, graph, [dim], len(node.outputs),
                                lambda d: d - 1 if d > dim else d)


# --- slice, select, narrow ---------------------------------------------------------------------

def _is_whole(size: int, start: Any, end: Any, step: Any) -> bool:
    """Whether ``x[start:end:step]`` along a dim of ``size`` keeps every element in order."""
    start = 0 if start is None else start
    end = INT_MAX if end is None else end
    return (start <= 0 if start >= 0 else start + size <= 0) and end >= size and step in (None, 1)


@register("aten.slice.Tensor", samples=lambda: [Sample((T(4, 11, 7), 1, 1, 5)),
                                                Sample((T(4, 11, 7), 1, 0, INT_MAX, 2)),
                                                Sample((T(11, 7), 0, -4)),
                                                Sample((T(11, 7), 0, 0, INT_MAX))])
def slice_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Shard any other dim; a slice that keeps the whole dim (``x[:, :]``, which Hugging Face
    code emits often) is the identity and keeps even that dim's shard."""
    shape = graph.meta(node.input_refs()[0]).shape
    dim = normalize_dim(_arg(node, 1, "dim", 0), len(shape))
    whole = _is_whole(shape[dim], _arg(node, 2, "start"), _arg(node, 3, "end"), _arg(node, 4, "step", 1))
    return untouched_strategies(node, graph, [] if whole else [dim])


@register("aten.narrow.default", samples=lambda: [Sample((T(4, 11, 7), 1, 2, 5)), Sample((T(11, 7), -1, 0, 1))])
def narrow_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Unlike slice, narrow checks its length against the (local) size: the narrowed dim is
    never sharded, even when the narrow keeps all of it."""
    return untouched_strategies(node, graph, [node.args[1]])


@register("aten.select.int", samples=lambda: [Sample((T(4, 11, 7), 1, 3)), Sample((T(4, 7), 0, -1))])
def select_rule(node: Node, graph: Graph) -> list[Strategy]:
    rank = len(graph.meta(node.input_refs()[0]).shape)
    dim = normalize_dim(node.args[1], rank)
    return untouched_strategies(node, graph, [dim], out_dim=lambda d: d - 1 if d > dim else d)


# --- index_select, gather, index ---------------------------------------------------------------

@register("aten.index_select.default", samples=lambda: [Sample((T(4, 11, 7), 1, Ids(11, 5))),
                                                        Sample((T(11, 7), 0, Ids(11, 8)))])
def index_select_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Shard the source on any other dim, or the (1-D) index with the source replicated."""
    x, index = node.input_refs()
    shape = graph.meta(x).shape
    dim = normalize_dim(node.args[1], len(shape))
    found = []
    for d, size in enumerate(shape):
        if d != dim and size > 1:
            found.append(Strategy((Shard(d), R), (Shard(d),)))
    if graph.meta(index).numel > 1 and len(graph.meta(index).shape) == 1:
        found.append(Strategy((R, Shard(0)), (Shard(dim),)))
    return found + [Strategy((P, R), (P,))]


@register("aten.gather.default", samples=lambda: [Sample((T(4, 11, 7), 1, Ids(4, 4, 6, 7))),
                                                  Sample((T(5, 7), 0, Ids(5, 8, 3))),
                                                  Sample((T(5, 7), 1, Ids(7, 5, 7)))])
def gather_rule(node: Node, graph: Graph) -> list[Strategy]:
    """``out[i][j] = x[i][index[i][j]]`` (dim 1): along the gathered dim the index may be
    sharded with the source replicated; along another dim both are sharded alike, which lines
    their pieces up only when they have the same length there."""
    x, index = node.input_refs()
    shape, ishape = graph.meta(x).shape, graph.meta(index).shape
    dim = normalize_dim(node.args[1], len(shape))
    found = []
    for d, size in enumerate(ishape):
        if size <= 1:
            continue
        if d == dim:
            found.append(Strategy((R, Shard(d)), (Shard(d),)))
        elif shape[d] == size:
            found.append(Strategy((Shard(d), Shard(d)), (Shard(d),)))
    return found + [Strategy((P, R), (P,))]


def _broadcast_shape(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = []
    for k in range(rank):
        sizes = {s[k - rank + len(s)] for s in shapes if k - rank + len(s) >= 0} - {1}
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


@register("aten.index.Tensor", samples=lambda: [
    Sample((T(11, 7), [Ids(11, 5)])),                       # x[idx]: rows picked by ids
    Sample((T(4, 11, 7), [None, Ids(11, 5)])),              # x[:, idx]
    Sample((T(4, 11, 7), [Ids(4, 5), Ids(11, 5)])),           # two index tensors, broadcast together
    Sample((T(4, 11, 7), [Ids(4, 5, 1), None, Ids(7, 1, 6)])),  # non-adjacent: index dims go first
    Sample((T(4, 11, 7), [None, Ids(11, 1, 3), Ids(7, 5, 1)]))])  # adjacent, broadcast index shapes
def index_rule(node: Node, graph: Graph) -> list[Strategy]:
    """``x[i0, i1, ...]``: the indexed dims of ``x`` are replaced by the broadcast shape of the
    index tensors (in place when the indexed dims are adjacent, in front otherwise).

    * a dim of ``x`` that is not indexed keeps its shard (indices stay ``Replicate``);
    * a dim of the broadcast index shape can be sharded on every index tensor that spans it
      (the others broadcast it, so stay ``Replicate``) with ``x`` replicated.
    Boolean masks give a data-dependent shape: no strategies.
    """
    refs = node.input_refs()
    shape = graph.meta(refs[0]).shape
    out_shape = graph.meta(node.outputs[0]).shape
    indices = list(node.args[1])
    metas = [graph.meta(i.name) for i in indices if isinstance(i, Ref)]
    if any(m.dtype in ("bool", "uint8") for m in metas) or len(metas) != len(refs) - 1 or not metas:
        return []
    indices += [None] * (len(shape) - len(indices))
    indexed = [d for d, i in enumerate(indices) if i is not None]
    bshape = _broadcast_shape([m.shape for m in metas])
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    front = indexed[0] if adjacent else 0        # where the index dims land in the output
    kept = [d for d in range(len(shape)) if d not in indexed]
    out_of_kept = {d: (d if d < front else d - len(indexed) + len(bshape)) if adjacent
                   else len(bshape) + kept.index(d) for d in kept}
    expected = [None] * len(out_shape)
    for d in kept:
        expected[out_of_kept[d]] = shape[d]
    for k, size in enumerate(bshape):
        expected[front + k] = size
    if tuple(expected) != tuple(out_shape):
        return []          # a form of advanced indexing this rule does not model
    found = []
    n_idx = len(metas)
    for d in kept:
        if shape[d] > 1:
            found.append(Strategy((Shard(d),) + (R,) * n_idx, (Shard(out_of_kept[d]),)))
    for k, size in enumerate(bshape):
        if size <= 1:
            continue
        lays: list[Layout] = [R]
        for m in metas:
            pos = k - len(bshape) + len(m.shape)
            lays.append(Shard(pos) if pos >= 0 and m.shape[pos] == size else R)
        found.append(Strategy(tuple(lays), (Shard(front + k),)))
    return found + [Strategy((P,) + (R,) * n_idx, (P,))]


# --- pad, flip, roll ---------------------------------------------------------------------------

def _pad_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Unpadded dims keep their shard; a zero fill (or a mode that copies values) is linear."""
    rank = len(graph.meta(node.input_refs()[0]).shape)
    pad = list(node.args[1])
    touched = [rank - 1 - k // 2 for k in range(len(pad)) if pad[k] != 0]
    found = untouched_strategies(node, graph, touched)
    mode = _arg(node, 2, "mode", "constant") if node.op == "aten.pad.default" else "constant"
    value = _arg(node, 3 if node.op == "aten.pad.default" else 2, "value", 0)
    if mode == "constant" and value not in (None, 0, 0.0):
        found = [s for s in found if P not in s.inputs]
    return found


register("aten.pad.default", samples=lambda: [Sample((T(4, 11), [0, 1])),
                                              Sample((T(4, 11), [0, 1], "constant", -100.0)),
                                              Sample((T(5, 4, 11), [1, 1, 0, 0], "reflect"))])(_pad_rule)
register("aten.constant_pad_nd.default", samples=lambda: [Sample((T(4, 5, 11), [2, 1])),
                                                          Sample((T(4, 11), [0, 0, 1, 0], 3.0))])(_pad_rule)


@register("aten.flip.default", samples=lambda: [Sample((T(4, 5, 7), [1])), Sample((T(4, 7), [0, 1]))])
def flip_rule(node: Node, graph: Graph) -> list[Strategy]:
    return untouched_strategies(node, graph, list(node.args[1]))


@register("aten.roll.default", samples=lambda: [Sample((T(4, 5, 7), [2], [1])), Sample((T(4, 7), [3]))])
def roll_rule(node: Node, graph: Graph) -> list[Strategy]:
    """With no dims, roll shifts the flattened tensor: every dim is touched."""
    rank = len(graph.meta(node.input_refs()[0]).shape)
    dims = list(_arg(node, 2, "dims", []) or [])
    return untouched_strategies(node, graph, dims if dims else list(range(rank)))


# --- tril, triu --------------------------------------------------------------------------------

def _triangle_rule(local: str):
    def rule(node: Node, graph: Graph) -> list[Strategy]:
        """Batch dims pass through; rows or columns shift the diagonal by the piece's offset."""
        shape = graph.meta(node.input_refs()[0]).shape
        found = untouched_strategies(node, graph, [len(shape) - 2, len(shape) - 1])
        for d in (len(shape) - 2, len(shape) - 1):
            if shape[d] > 1:
                found.append(Strategy((Shard(d),), (Shard(d),), local))
        return found
    return rule


register("aten.tril.default", samples=lambda: [Sample((T(3, 7, 7),)), Sample((T(7, 5), 1)),
                                               Sample((T(5, 7), -2))])(_triangle_rule("tril_local"))
register("aten.triu.default", samples=lambda: [Sample((T(3, 7, 7),)), Sample((T(7, 5), 1)),
                                               Sample((T(5, 7), -2))])(_triangle_rule("triu_local"))
