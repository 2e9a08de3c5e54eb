"""Which ops keep ``ExpertRows`` (``E``) as they are, and where the graph offers them.

A grouped matmul with its experts sharded leaves each rank the rows routed to its own experts
(:mod:`hapc.rules.ops_grouped_mm`). Between the up and the down projection of an expert MLP
come row-local ops, ``silu(gate) * up`` or a cast: each rank applies them to its rows, and the
next grouped matmul reads them as they are, so nothing travels between the two products and
each rank's work is its experts' share of the rows.

The strategies are offered only on values downstream of a grouped matmul through such ops
(:func:`expert_row_values`), so the search of models without experts sees no new choice. An
op here keeps every row where it is: elementwise ops (a product with a value broadcast over
the rows, too) and chunks and slices along another dimension.
"""

from __future__ import annotations

from hapc.ir.graph import Graph, Node, Ref
from hapc.ir.layout import E, R, Shard
from hapc.ir.program import Strategy

GROUPED_MM_OPS = frozenset({"transformers.grouped_mm_fallback.default"})

# Elementwise, one tensor.
_ROW_UNARY = frozenset({
    "aten.silu.default", "aten.gelu.default", "aten.relu.default", "aten.neg.default", "aten.tanh.default",
    "aten.abs.default", "aten.clone.default", "aten.to.dtype", "aten._to_copy.default", "aten.contiguous.default",
    "aten.mul.Scalar", "aten.div.Scalar", "aten.alias.default", "aten.detach.default", "aten.sigmoid.default",
    "aten.add.Scalar", "aten.sub.Scalar", "aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default",
    "aten.exp.default", "aten.pow.Tensor_Scalar", "aten.floor_divide.default", "aten.div.Tensor_mode",
    "aten.remainder.Scalar", "aten.ge.Scalar", "aten.lt.Scalar", "aten.eq.Scalar",
})
# Elementwise, two tensors: both the same rows, or one broadcast over the rows.
_ROW_BINARY = frozenset({"aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor"})
# Moving nothing across rows: along a dimension other than the first.
_ALONG_DIM = {"aten.chunk.default": (2, 0), "aten.split.Tensor": (2, 0), "aten.split_with_sizes.default": (2, 0),
              "aten.slice.Tensor": (1, 0)}     # op: (position of its dim argument, its default)

_RECENT: list[tuple[Graph, int, frozenset[str], frozenset[str]]] = []   # the last few graphs asked about


def expert_row_values(graph: Graph) -> frozenset[str]:
    """Values that may be held as ``ExpertRows``: grouped matmul outputs, routed lookups
    (:func:`_routed_lookups`) and what the ops above make of them, kept only where every reader
    can read them so (a value nothing but a layout change could pass on is no choice at all;
    one nobody reads, as a rule's one-node sample graph has, stays a choice)."""
    return _analysis(graph)[0]


def _analysis(graph: Graph) -> tuple[frozenset[str], frozenset[str]]:
    """(expert-row values, the routed lookups among them), remembered for the last few graphs."""
    for g, size, rows, lookups in _RECENT:
        if g is graph and size == len(graph.nodes):
            return rows, lookups
    lookups = _routed_lookups(graph)
    found: set[str] = set()
    for node in graph.nodes:
        if node.op in GROUPED_MM_OPS or node.name in lookups or keeps_rows(node, graph, found):
            found.update(node.outputs)
    users: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for ref in dict.fromkeys(node.input_refs()):
            if ref in found:
                users.setdefault(ref, []).append(node)
    for node in reversed(graph.nodes):     # readers come after: their verdicts are known
        for out in node.outputs:
            if out in found and not all(
                    (u.op in GROUPED_MM_OPS and u.input_refs()[0] == out and out not in u.input_refs()[1:])
                    or (u.op not in GROUPED_MM_OPS and all(o in found for o in u.outputs)
                        and keeps_rows(u, graph, found))
                    for u in users.get(out, [])):
                found.discard(out)
    result = (frozenset(found), frozenset(n for n, out in lookups.items() if out in found))
    _RECENT[:] = [e for e in _RECENT if e[0] is not graph][-3:] + [(graph, len(graph.nodes), *result)]
    return result


def expert_row_strategies(node: Node, graph: Graph) -> list[Strategy]:
    """``node`` on this rank's expert rows, when it reads some and keeps them; else nothing.
    (Grouped matmuls list their own, :mod:`hapc.rules.ops_grouped_mm`.)"""
    if node.op in GROUPED_MM_OPS:
        return []
    rows, lookups = _analysis(graph)
    if not all(o in rows for o in node.outputs):
        return []
    if node.name in lookups:
        return [Strategy((Shard(0), R), (E,), local="index_expert_rows")]
    if not keeps_rows(node, graph, rows):
        return []
    return [Strategy(tuple(E if r in rows else R for r in node.input_refs()), tuple(E for _ in node.outputs))]


def keeps_rows(node: Node, graph: Graph, rows: set[str] | frozenset[str]) -> bool:
    """Whether ``node`` reads some of ``rows`` (values with one row per routed token) and keeps
    every row where it is: what may run on any subset of the rows, as a rank's expert rows or a
    micro-batch's tokens in sorted order (:mod:`synth.routed_tokens`) are."""
    refs = node.input_refs()
    if not refs or not any(r in rows for r in refs):
        return False
    op = node.op
    out_shape = graph.meta(node.outputs[0]).shape
    if op in _ROW_UNARY:
        return len(set(refs)) == 1 and graph.meta(refs[0]).shape == out_shape
    if op in _ALONG_DIM:
        pos, default = _ALONG_DIM[op]
        dim = node.args[pos] if len(node.args) > pos else node.kwargs.get("dim", default)
        return len(set(refs)) == 1 and dim % len(graph.meta(refs[0]).shape) != 0
    if op in _ROW_BINARY:          # with a number as the other operand, or a tensor
        return all(_same_rows(graph.meta(r).shape, out_shape) if r in rows
                   else _without_rows(graph.meta(r).shape, out_shape) for r in refs)
    return False


def _routed_lookups(graph: Graph) -> dict[str, str]:
    """Nodes ``table[ids]`` whose ``ids`` are the ascending sort of a 1-D tensor (the routed
    expert ids, as GPT-OSS gathers each row's expert bias): the rows of a rank's experts are
    the rows whose id it holds, so a rank holding those experts' table rows looks up just its
    own rows. The sort is trusted to be the routing's: the grouped matmuls' offsets count the
    same ids (every Hugging Face MoE layer computes both from one sort)."""
    ascending = {n.outputs[0] for n in graph.nodes
                 if n.op in ("aten.sort.default", "aten.sort.stable") and len(graph.meta(n.outputs[0]).shape) == 1
                 and not (n.args[2] if len(n.args) > 2 else n.kwargs.get("descending", False))}
    found = {}
    for node in graph.nodes:
        if node.op != "aten.index.Tensor" or len(node.args) < 2 or not isinstance(node.args[1], (list, tuple)):
            continue
        indices = node.args[1]
        if len(indices) == 1 and isinstance(indices[0], Ref) and indices[0].name in ascending:
            found[node.name] = node.outputs[0]
    return found


def _same_rows(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """Whether an operand of this shape has the output's rows (broadcast along the others only)."""
    return len(shape) == len(out_shape) and shape[:1] == out_shape[:1]


def _without_rows(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """Whether an operand of this shape broadcasts over the output's rows (holds no row of its own)."""
    return len(shape) < len(out_shape) or (len(shape) == len(out_shape) and shape[0] == 1)
