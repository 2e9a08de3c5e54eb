"""Views and shape ops: view/reshape, flatten/unflatten, squeeze/unsqueeze, transposes and
permutations, expand, repeat, alias/detach.

None of these computes anything; each only says where an element of the input lands in the
output. So every rule here is a *dimension map* — input dim ``i`` becomes output dim ``j`` —
and a shard follows the map: ``Shard(i)`` in, ``Shard(j)`` out. All of them are linear, so
all-``Partial`` in gives ``Partial`` out.

Views that merge or split dimensions are mapped with :func:`view_groups`: runs of input and
output dimensions with equal products. Only the *outermost* dimension of a group can carry a
shard, because a contiguous piece of an outer dimension is a contiguous piece of the
flattened group while a piece of an inner one is not. Uneven pieces stay aligned because
:meth:`hapc.ir.program.DistProgram.blocks` cuts both mapped dimensions into the same number
of blocks (``[B, S, 768] -> [B, S, 12, 64]``: 12 blocks, every piece a whole number of heads).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register
from hapc.rules.samples import T
from hapc.rules.spec import normalize_dim

DimPairs = list[tuple[int, int]]


def view_groups(in_shape: Sequence[int], out_shape: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pair up runs of input and output dims whose sizes multiply to the same number.

    Dims of size 1 are left out (they carry no data and are never sharded), so
    ``[2, 1, 12] -> [2, 3, 4]`` gives ``[([0], [0]), ([2], [1, 2])]``. Returns ``[]`` when the
    shapes hold different numbers of elements or no elements at all.
    """
    a = [i for i, s in enumerate(in_shape) if s != 1]
    b = [j for j, s in enumerate(out_shape) if s != 1]
    if any(in_shape[i] == 0 for i in a) or _prod(in_shape) != _prod(out_shape):
        return []
    groups = []
    i = j = 0
    while i < len(a) and j < len(b):
        ga, gb = [a[i]], [b[j]]
        pa, pb = in_shape[a[i]], out_shape[b[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                ga.append(a[i])
                pa *= in_shape[a[i]]
                i += 1
            else:
                gb.append(b[j])
                pb *= out_shape[b[j]]
                j += 1
        groups.append((ga, gb))
    return groups


def view_dim_map(in_shape: Sequence[int], out_shape: Sequence[int]) -> DimPairs:
    """Input dim -> output dim pairs along which a shard survives a reshape.

    The outermost dims of each group are paired when their lengths share a factor: both are
    then cut into ``gcd`` blocks whose elements coincide in the flattened group. Without a
    common factor the only "shard" would be one rank holding everything.
    """
    return [(ga[0], gb[0]) for ga, gb in view_groups(in_shape, out_shape)
            if gcd(in_shape[ga[0]], out_shape[gb[0]]) > 1]


def map_strategies(node: Node, graph: Graph, pairs: DimPairs, local: str | None = None,
                   linear: bool = True) -> list[Strategy]:
    """``{S(i)} -> {S(j)}`` for every pair, then ``{P} -> {P}`` for a linear op.

    The first tensor argument is the one mapped. Any further tensor argument only gives a
    shape (``view_as``, ``expand_as``: same shape as the output), so it follows the output's
    layout, or stays ``Replicate`` when the output is ``Partial``.
    """
    refs = node.input_refs()
    in_shape = graph.meta(refs[0]).shape
    out_shape = graph.meta(node.outputs[0]).shape
    extra = len(refs) - 1
    found = []
    for i, j in pairs:
        if in_shape[i] > 1 and out_shape[j] > 1:
            found.append(Strategy((Shard(i),) + (Shard(j),) * extra, (Shard(j),), local))
    if linear:
        found.append(Strategy((P,) + (R,) * extra, (P,)))
    return found


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _shapes(node: Node, graph: Graph) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return graph.meta(node.input_refs()[0]).shape, graph.meta(node.outputs[0]).shape


# --- reshapes: view, reshape, flatten, unflatten, squeeze, unsqueeze -------------------------

def _reshape_rule(local: str):
    def rule(node: Node, graph: Graph) -> list[Strategy]:
        in_shape, out_shape = _shapes(node, graph)
        return map_strategies(node, graph, view_dim_map(in_shape, out_shape), local)
    return rule


def _view_samples() -> list[Sample]:
    return [
        Sample((T(2, 5, 30), [2, 5, 6, 5])),     # split hidden into heads: S(2) -> S(2)
        Sample((T(2, 5, 6, 5), [2, 5, -1])),     # merge heads back
        Sample((T(4, 5, 7), [20, 7])),           # merge batch and sequence: S(0) -> S(0)
        Sample((T(20, 7), [4, 5, 7])),
        Sample((T(6, 10), [4, 15])),             # a group cut across: 2 common blocks
        Sample((T(7, 1, 9), [7, 9, 1])),
    ]


for _op in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"):
    register(_op, samples=_view_samples)(_reshape_rule("view_local"))

register("aten.view_as.default", samples=lambda: [Sample((T(2, 5, 30), T(2, 5, 6, 5))),
                                                  Sample((T(20, 7), T(4, 5, 7)))])(
    _reshape_rule("reshape_local"))
register("aten.flatten.using_ints", samples=lambda: [Sample((T(4, 5, 7),)), Sample((T(4, 5, 7), 1)),
                                                     Sample((T(2, 7, 3, 5), 1, 2))])(
    _reshape_rule("reshape_local"))
register("aten.unflatten.int", samples=lambda: [Sample((T(2, 30), 1, [6, 5])),
                                                Sample((T(20, 7), 0, [4, -1]))])(
    _reshape_rule("reshape_local"))
register("aten.unsqueeze.default", samples=lambda: [Sample((T(4, 7), 0)), Sample((T(4, 7), -1)),
                                                    Sample((T(4, 7), 1))])(
    _reshape_rule("reshape_local"))
# A piece of length 1 on a sharded dim must survive squeeze: hence the reshape local op.
register("aten.squeeze.dim", samples=lambda: [Sample((T(4, 1, 7), 1)), Sample((T(4, 7), 1))])(
    _reshape_rule("reshape_local"))
register("aten.squeeze.dims", samples=lambda: [Sample((T(1, 4, 1, 7), [0, 2]))])(
    _reshape_rule("reshape_local"))
register("aten.squeeze.default", samples=lambda: [Sample((T(1, 4, 1, 7),)), Sample((T(3, 5),))])(
    _reshape_rule("reshape_local"))


# --- permutations ------------------------------------------------------------------------------

def _perm_rule(perm_of):
    """A rule for an op that only reorders dims: ``perm_of(node, rank)[j]`` is the input dim
    that becomes output dim ``j``. The plain op runs on the pieces."""
    def rule(node: Node, graph: Graph) -> list[Strategy]:
        in_shape, _ = _shapes(node, graph)
        perm = perm_of(node, len(in_shape))
        return map_strategies(node, graph, [(i, j) for j, i in enumerate(perm)])
    return rule


def _swap(rank: int, a: int, b: int) -> list[int]:
    perm = list(range(rank))
    a, b = normalize_dim(a, rank), normalize_dim(b, rank)
    perm[a], perm[b] = perm[b], perm[a]
    return perm


def _movedim(rank: int, src, dst) -> list[int]:
    src = [normalize_dim(d, rank) for d in ([src] if isinstance(src, int) else src)]
    dst = [normalize_dim(d, rank) for d in ([dst] if isinstance(dst, int) else dst)]
    perm: list[int | None] = [None] * rank
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(i for i in range(rank) if i not in src)
    return [p if p is not None else next(rest) for p in perm]


_PERMUTATIONS = {
    "aten.transpose.int": lambda n, r: _swap(r, n.args[1], n.args[2]),
    "aten.swapaxes.default": lambda n, r: _swap(r, n.args[1], n.args[2]),
    "aten.swapdims.default": lambda n, r: _swap(r, n.args[1], n.args[2]),
    "aten.t.default": lambda n, r: list(range(r))[::-1],
    "aten.numpy_T.default": lambda n, r: list(range(r))[::-1],
    "aten.mT.default": lambda n, r: _swap(r, -2, -1),
    "aten.permute.default": lambda n, r: [normalize_dim(d, r) for d in n.args[1]],
    "aten.movedim.int": lambda n, r: _movedim(r, n.args[1], n.args[2]),
    "aten.movedim.intlist": lambda n, r: _movedim(r, n.args[1], n.args[2]),
}
_PERM_SAMPLES = {
    "aten.transpose.int": lambda: [Sample((T(4, 5, 7), 1, 2)), Sample((T(4, 5, 7, 2), 0, -1))],
    "aten.swapaxes.default": lambda: [Sample((T(4, 5, 7), 0, 1))],
    "aten.swapdims.default": lambda: [Sample((T(4, 5, 7), -1, 0))],
    "aten.t.default": lambda: [Sample((T(4, 7),)), Sample((T(5),))],
    "aten.numpy_T.default": lambda: [Sample((T(4, 7),))],
    "aten.mT.default": lambda: [Sample((T(4, 5, 7),))],
    "aten.permute.default": lambda: [Sample((T(4, 5, 7, 2), [0, 2, 1, 3])), Sample((T(4, 5, 7), [2, 0, 1]))],
    "aten.movedim.int": lambda: [Sample((T(4, 5, 7), 0, 2))],
    "aten.movedim.intlist": lambda: [Sample((T(4, 5, 7, 2), [0, 1], [3, 0]))],
}
for _op, _perm in _PERMUTATIONS.items():
    register(_op, samples=_PERM_SAMPLES[_op])(_perm_rule(_perm))


@register(["aten.alias.default", "aten.detach.default"],
          samples=lambda: [Sample((T(4, 5, 7),))])
def identity_rule(node: Node, graph: Graph) -> list[Strategy]:
    """The value itself (detach only stops the gradient): any layout passes through."""
    rank = len(graph.meta(node.input_refs()[0]).shape)
    return map_strategies(node, graph, [(d, d) for d in range(rank)])


# --- expand and repeat -------------------------------------------------------------------------

@register(["aten.expand.default"],
          samples=lambda: [Sample((T(4, 1, 7), [4, 5, 7])), Sample((T(1, 1, 5, 5), [4, -1, 5, 5])),
                           Sample((T(7), [3, 4, 7])), Sample((T(4, 1), [-1, 5]))])
def expand_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Dims that keep their size map through; a broadcast dim (size 1 -> n, or new) can be
    sharded on the output with the input ``Replicate``: each rank expands to its own length.
    The gradient of that input is then each rank's partial sum, as ``Replicate`` inputs have."""
    in_shape, out_shape = _shapes(node, graph)
    lead = len(out_shape) - len(in_shape)
    found = map_strategies(node, graph, [(i, i + lead) for i in range(len(in_shape))], "expand_local")
    for j, size in enumerate(out_shape):
        if size > 1 and (j < lead or in_shape[j - lead] == 1):
            found.append(Strategy((R,) * len(node.input_refs()), (Shard(j),), "expand_local"))
    return found


@register("aten.expand_as.default", samples=lambda: [Sample((T(4, 1, 7), T(4, 5, 7))),
                                                     Sample((T(7), T(3, 7)))])
def expand_as_rule(node: Node, graph: Graph) -> list[Strategy]:
    """As :func:`expand_rule`; the shape-giving tensor follows the output's layout."""
    in_shape, out_shape = _shapes(node, graph)
    lead = len(out_shape) - len(in_shape)
    found = map_strategies(node, graph, [(i, i + lead) for i in range(len(in_shape))], "expand_local")
    for j, size in enumerate(out_shape):
        if size > 1 and (j < lead or in_shape[j - lead] == 1):
            found.append(Strategy((R, Shard(j)), (Shard(j),), "expand_local"))
    return found


def _repeat_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Dims repeated once map through with the plain op (repeat counts are not sizes); a dim
    repeated more than once interleaves copies of every piece, so it cannot stay sharded."""
    in_shape, out_shape = _shapes(node, graph)
    reps = list(node.args[1])
    reps = [1] * (len(in_shape) - len(reps)) + reps      # tile pads its counts on the left
    lead = len(out_shape) - len(in_shape)
    pairs = [(i, i + lead) for i in range(len(in_shape)) if reps[i + len(reps) - len(in_shape)] == 1]
    return map_strategies(node, graph, pairs)


register("aten.repeat.default", samples=lambda: [Sample((T(4, 5, 7), [1, 2, 1])),
                                                 Sample((T(4, 7), [3, 1, 2]))])(_repeat_rule)
register("aten.tile.default", samples=lambda: [Sample((T(4, 5, 7), [2, 1])),
                                               Sample((T(4, 7), [2, 1, 1]))])(_repeat_rule)

