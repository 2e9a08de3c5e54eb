"""Mixture-of-experts routing under micro-batches: sorting the batch's tokens by expert couples
no samples, so long as every token's result is computed from its own row.

A Hugging Face MoE layer flattens the batch's tokens, sorts them by routed expert, runs each
expert's grouped matmul over its stretch of the sorted rows (offsets from a histogram of the
sorted ids), and puts the rows back in token order with the inverse permutation. The sort
reads every sample, yet each token's output depends on its own row and its expert's weights
alone (there is no capacity that drops tokens by position here): a micro-batch sorts its own
tokens and gets the same rows. :func:`synth.microbatching.loss_split` asks this module about
every node that reads such sorted values, and accepts the layer when the values stay:

* ``perm``: the sort's permutation (and ``perm // k``): indices of the batch's token rows;
* ``rows``: anything in sorted order, one row per sorted token: the sorted ids, the gathered
  hidden states and routing weights, what row-local ops (:mod:`hapc.rules.expert_rows`) and the
  grouped matmuls make of them, an expert table looked up by the sorted ids;
* ``counts``: tokens per expert (a histogram of the sorted ids) and their running sum, read only
  as a grouped matmul's offsets;
* ``inverse``: the inverse permutation (``inv[perm] = arange(n)``), read only to put rows back,
  after which they are the batch's rows again.

Anything else reading them (a position in sorted order, a sum over the sorted rows) is refused
as coupling samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from hapc.ir.graph import Graph, Node
from hapc.rules.expert_rows import GROUPED_MM_OPS, keeps_rows

SORTS = ("aten.sort.default", "aten.sort.stable")
# Views that keep the sorted rows first (unsqueeze(-1) of the routing weights); the elementwise
# ops, chunks and slices that keep every row are hapc.rules.expert_rows.keeps_rows's.
_ROW_VIEWS = frozenset({"aten.unsqueeze.default", "aten.view.default", "aten.reshape.default",
                        "aten._unsafe_view.default"})


@dataclass(frozen=True)
class Routed:
    """A value of the batch's tokens in their routing's sorted order (see the module docstring)."""

    what: str          # "perm", "rows", "counts", "zeros" (a blank inverse) or "inverse"


def starts_routing(node: Node, graph: Graph, batch_dim: int | None) -> bool:
    """An ascending sort of a 1-D value holding the batch's tokens (``batch_dim`` 0)."""
    if node.op not in SORTS or batch_dim != 0 or len(graph.meta(node.input_refs()[0]).shape) != 1:
        return False
    return not (node.args[2] if len(node.args) > 2 else node.kwargs.get("descending", False))


def routed_outputs(node: Node, graph: Graph, held: list) -> list | None:
    """What ``node``'s outputs hold when it reads routed values (``held``: each input's state,
    :class:`Routed`, a batch dimension as ``int``, or None for values the same for every
    sample); None when it couples samples."""
    from synth.microbatching import _Batch

    refs = node.input_refs()
    kinds = {h.what for h in held if isinstance(h, Routed)}
    op = node.op
    out = node.outputs
    if op == "aten.index_put.default" and len(refs) == 3:
        blank, idx, values = held
        made_from = _producer(graph, refs[2])
        if blank == Routed("zeros") and idx == Routed("perm") and values is None and made_from is not None \
                and made_from.op == "aten.arange.default" and graph.meta(refs[2]).shape == graph.meta(refs[1]).shape:
            return [Routed("inverse")]               # inv[perm] = arange(n)
        return None
    n_rows = _routed_rows(graph, refs, held)
    if n_rows is None:
        return None
    if op == "aten.index.Tensor" and len(refs) == 2:
        src_held, idx_held = held
        if idx_held == Routed("perm") and isinstance(src_held, _Batch) and src_held.dim == 0:
            return [Routed("rows")]                  # gather the tokens' rows in sorted order
        if idx_held == Routed("rows") and src_held is None:
            return [Routed("rows")]                  # an expert table looked up by the sorted ids
        if idx_held == Routed("inverse") and src_held == Routed("rows"):
            return [_Batch(0)]                       # back in token order
        return None
    if op in ("aten.histc.default", "aten.bincount.default") and kinds == {"rows"}:
        return [Routed("counts")]
    if op == "aten.cumsum.default" and kinds == {"counts"}:
        return [Routed("counts")]
    if op in GROUPED_MM_OPS:
        return [Routed("rows")] if held[0] == Routed("rows") and held[1] is None \
            and held[2] == Routed("counts") else None
    if op in ("aten.zeros_like.default", "aten.empty_like.default") and kinds <= {"perm"}:
        return [Routed("zeros")]
    if "counts" in kinds or "inverse" in kinds or "zeros" in kinds or len(kinds) != 1:
        return None
    if any(isinstance(h, _Batch) for h in held):
        return None
    if op in _ROW_VIEWS:
        keeps = all(graph.meta(o).shape[:1] == (n_rows,) for o in out)
    else:
        keeps = keeps_rows(node, graph, {r for r, h in zip(refs, held) if isinstance(h, Routed)})
    return [Routed(next(iter(kinds))) for _ in out] if keeps else None


def _routed_rows(graph: Graph, refs: list[str], held: list) -> int | None:
    """The number of sorted rows the routed inputs share (None if they disagree, or a value the
    same for every sample has one entry per sorted row: a position in sorted order)."""
    rows = {graph.meta(r).shape[0] for r, h in zip(refs, held) if isinstance(h, Routed) and h.what != "counts"
            and graph.meta(r).shape}
    if len(rows) > 1:
        return None
    n = rows.pop() if rows else 0
    for r, h in zip(refs, held):
        shape = graph.meta(r).shape
        if h is None and n and len(shape) >= 1 and shape[0] == n:
            return None
    return n


def _producer(graph: Graph, name: str) -> Node | None:
    for node in graph.nodes:
        if name in node.outputs:
            return node
    return None


WHY = ("reads the batch's tokens in their routing's sorted order other than row by row (a position in "
       "that order, or a sum over its rows)")
