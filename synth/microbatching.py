"""Whether a model's step can run as micro-batches and give the whole batch's loss and gradients,
and with which weights (pipelines' micro-batches; gradient accumulation is the same question).

Running the batch as ``m`` slices and adding up is exact only when every sample's computation
is its own until the loss, and the loss adds the samples' terms in a known way:

* a **mean** over the batch (or over all elements, of which each sample has as many): each
  micro-batch's loss weighs ``1/m``;
* a **sum**: each weighs 1;
* a **mean over counted targets** (``cross_entropy``/``nll_loss`` with ``ignore_index`` or class
  weights: a masked language model, labels padded with -100): the divisor is the number of
  counted targets of the whole batch, known only from the data. Each micro-batch's loss weighs
  ``count_k``, and the step divides the sum (and every gradient) by the total count.

Sorting the batch's tokens by routed expert (a mixture of experts) couples none, when each
token's result comes from its own row (:mod:`synth.routed_tokens`). Anything else couples
samples: a contrastive loss (every sample against every other), batch
statistics (training-mode batch norm), a mean over the batch taken before a non-linear op, a
scan along the batch. Micro-batching those computes another model, so it is refused, naming the
op and its source line.

The test is the sharding rules' own: a sample's computation is its own exactly when every node
has a strategy that keeps the batch dimension sharded (``Shard`` of the batch in, ``Shard`` out),
which the rule validator checks against ground truth for any uneven split, hence for micro-batch
slices too. Where the batch is summed (a ``Partial`` result), only linear ops may follow (the
ones with ``Partial`` strategies) until the loss. This walks the graph once with those rules;
no search, no shares.
"""

from __future__ import annotations

from dataclasses import dataclass

from hapc.errors import UserError
from hapc.ir.graph import Graph, Node
from hapc.ir.layout import Layout, Partial, Replicate, Shard
from hapc.ir.program import Strategy
from synth.routed_tokens import WHY as ROUTING_WHY
from synth.routed_tokens import Routed, routed_outputs, starts_routing

MEAN, SUM, COUNT = "mean", "sum", "count"

# Local implementations that compute a sample's piece from that piece alone (no collective).
PER_SAMPLE_LOCALS = frozenset({
    "dropout", "sdpa_dropout", "random_piece", "view_local", "reshape_local", "expand_local", "tril_local", "triu_local",
    "conv_groups_local", "adaptive_avg_pool_local", "one_hot_class_shard", "arange_local", "create_local",
    "linear_sfb",          # data-parallel forward; its collective is the weight gradient's
    "scatter_into_piece", "scatter_add_into_piece", "scatter_reduce_into_piece", "index_add_into_piece",
})
# The local ops of random ops (hapc.rules.ops_random).
RANDOM_LOCALS = frozenset({"random_piece", "random_whole"})
# A loss whose mean divides by the global number of counted targets.
COUNTED_MEANS = frozenset({"cross_entropy_batch", "nll_loss_batch"})
@dataclass(frozen=True)
class LossSplit:
    """How the loss adds up over micro-batches: ``kind`` is ``"mean"``, ``"sum"`` or
    ``"count"``; for ``"count"``, ``node`` is the loss node whose counted targets weigh each
    micro-batch."""

    kind: str
    node: str | None = None
    # The nodes whose results sum samples' terms (the loss's reductions over the batch and the
    # linear ops after them): their constants must not change with the batch size.
    summed: tuple[str, ...] = ()


class MicroBatchingRefused(UserError):
    """The model's samples are coupled, so micro-batches would compute another loss."""


@dataclass(frozen=True)
class _Batch:
    """A value that holds the batch along ``dim``, each sample's rows its own."""

    dim: int


@dataclass(frozen=True)
class _Summed:
    """A value that sums samples' contributions (a ``Partial``), by ``kinds`` of reduction."""

    kinds: frozenset[tuple[str, str | None]]


def loss_split(graph: Graph, batch: int | None = None) -> LossSplit:
    """How ``graph``'s loss decomposes over micro-batches; raises
    :class:`MicroBatchingRefused` (one line: the op, its source line, why) when it does not."""
    from synth.stagespace import batch_size

    batch = batch_size(graph) if batch is None else batch
    state: dict[str, _Batch | _Summed] = {}
    summed_nodes: list[str] = []
    for name in graph.inputs:
        shape = graph.meta(name).shape
        if shape and shape[0] == batch and batch > 1:
            state[name] = _Batch(0)
    for node in graph.nodes:
        refs = node.input_refs()
        held = [state.get(r) for r in refs]
        if batch > 1 and all(h is None for h in held) and _draws_per_sample(graph, node, batch):
            # Noise drawn for the batch (ViT-MAE's masking) differs by sample: its rows are the
            # samples', and whatever it decides (a mask and its count) is the batch's too.
            state.update((o, _Batch(0)) for o in node.outputs)
            continue
        if any(isinstance(h, Routed) for h in held):     # tokens sorted by expert (synth.routed_tokens)
            outs = routed_outputs(node, graph, held)
            if outs is None:
                where = f" at {node.source}" if node.source else ""
                raise MicroBatchingRefused(f"{node.op} ({node.name}){where} {ROUTING_WHY}: micro-batches would "
                                           "compute another loss; use --microbatches 1")
            state.update(zip(node.outputs, outs))
            continue
        if all(h is None for h in held):       # the same for every sample (weights, positions, masks)
            continue
        strategy = _per_sample_strategy(graph, node, refs, held, batch)
        if strategy is None and starts_routing(node, graph, held[0].dim if isinstance(held[0], _Batch) else None):
            state[node.outputs[0]], state[node.outputs[1]] = Routed("rows"), Routed("perm")
            continue
        if strategy is None:
            raise MicroBatchingRefused(_why(node, held))
        summed = frozenset().union(*(h.kinds for h in held if isinstance(h, _Summed)))
        for out, lay in zip(node.outputs, strategy.outputs):
            if isinstance(lay, Shard):
                state[out] = _Batch(lay.dim % max(1, len(graph.meta(out).shape)))
            elif isinstance(lay, Partial):
                state[out] = _Summed(summed or frozenset({_reduction(node, strategy)}))
                summed_nodes.append(node.name)
    final = state.get(graph.output)
    if final is None or isinstance(final, _Batch):
        return LossSplit(MEAN)          # no batch (or one sample): nothing to weigh
    kinds = sorted(final.kinds, key=lambda k: (k[0], k[1] or ""))
    if len(kinds) > 1:
        terms = ", ".join(f"{_kind_text(k)}" for k in kinds)
        raise MicroBatchingRefused(f"the loss adds terms that average over different counts ({terms}); "
                                   "micro-batches cannot weigh them alike: use --microbatches 1")
    kind, node = kinds[0]
    return LossSplit(kind, node, tuple(dict.fromkeys(summed_nodes)))


def check_batch_constants(whole: Graph, micro: Graph, split: LossSplit) -> None:
    """Refuse a loss that divides (or multiplies) a sum over the batch by a number the trace
    took from the batch size (``loss.sum() / x.shape[0]``: torch.export bakes the size in, and
    a micro-batch's trace divides by its own): the micro-batches' losses would not add up to
    the batch's. ``whole`` and ``micro`` are the model traced at the batch and at a micro-batch."""
    theirs = {n.name: n for n in micro.nodes}
    for node in whole.nodes:
        if node.name not in split.summed or node.name not in theirs:
            continue
        other = theirs[node.name]
        if (node.args, node.kwargs) != (other.args, other.kwargs):
            where = f" at {node.source}" if node.source else ""
            raise MicroBatchingRefused(
                f"{node.op} ({node.name}){where} scales a sum over the batch by a number that changes with the "
                f"batch size ({_constants(node)} for the batch, {_constants(other)} for a micro-batch; e.g. "
                "dividing by x.shape[0]): micro-batches would compute another loss; take a mean, or use "
                "--microbatches 1")


def _constants(node: Node) -> str:
    from hapc.ir.graph import Ref

    values = [a for a in (*node.args, *node.kwargs.values()) if not isinstance(a, Ref)]
    return ", ".join(map(repr, values)) or "-"


def _per_sample_strategy(graph: Graph, node: Node, refs: list[str], held: list[_Batch | _Summed | None],
                         batch: int) -> Strategy | None:
    """A strategy that takes each input as it is held (the batch's dimension sharded, a sum as
    a Partial, the rest whole) with a local that needs no other sample; the first in the rule's
    order. Failing that, one that also slices a batch-free value along a dimension of the
    batch's size: a mask or position table the model builds for its batch (``expand`` to ``B``,
    HF's causal mask indexed by ``arange(B)``), which a micro-batch's trace builds again at its
    own size. (Traced on the meta device, hapc cannot see whether such a value's rows depend on
    their index beyond that; ``--verify`` would.)"""
    from synth.space import node_strategies

    wanted: list[Layout | None] = []
    for ref, h in zip(refs, held):
        if isinstance(h, _Batch):
            wanted.append(Shard(h.dim))
        elif isinstance(h, _Summed):
            wanted.append(Partial())
        else:
            wanted.append(None)          # whole: Replicate
    options = [s for s in node_strategies(graph, node)
               if s.local is None or s.local in PER_SAMPLE_LOCALS or s.local in COUNTED_MEANS]
    for sliced in (0, batch):
        for s in options:
            if all(_same(lay, want, graph, ref, sliced) for lay, want, ref in zip(s.inputs, wanted, refs)):
                return s
    return None


def _draws_per_sample(graph: Graph, node: Node, batch: int) -> bool:
    """A random op (its rule draws each piece from the global draw) whose output has a row per
    sample."""
    from synth.space import node_strategies

    return all(graph.meta(o).shape[:1] == (batch,) for o in node.outputs) and \
        any(s.local in RANDOM_LOCALS for s in node_strategies(graph, node))


def _same(lay: Layout, want: Layout | None, graph: Graph, ref: str, sliced: int) -> bool:
    """Whether a strategy's input layout ``lay`` takes the value as it is held (``want``; None
    for whole, which may be sliced along a dimension of length ``sliced``)."""
    if want is None:
        return isinstance(lay, Replicate) or (isinstance(lay, Shard) and graph.meta(ref).shape[lay.dim] == sliced)
    if isinstance(want, Shard):
        rank = max(1, len(graph.meta(ref).shape))
        return isinstance(lay, Shard) and lay.dim % rank == want.dim % rank
    return isinstance(lay, Partial)


def _reduction(node: Node, strategy: Strategy) -> tuple[str, str | None]:
    """What kind of sum over samples a node starts (its result a Partial of sharded inputs)."""
    if strategy.local in COUNTED_MEANS:
        return COUNT, node.name
    return (MEAN, None) if strategy.rescale is not None else (SUM, None)


def _kind_text(kind: tuple[str, str | None]) -> str:
    return {MEAN: "a mean over the batch", SUM: "a sum over the batch"}.get(
        kind[0], f"a mean over the counted targets of {kind[1]}")


def _why(node: Node, held: list[_Batch | _Summed | None]) -> str:
    where = f" at {node.source}" if node.source else ""
    if any(isinstance(h, _Summed) for h in held) and any(isinstance(h, _Batch) for h in held):
        what = "uses a statistic of the whole batch (a sum or mean over its samples) on each sample"
    elif any(isinstance(h, _Summed) for h in held):
        what = "takes a sum over the batch into a non-linear op (its value on the whole batch is not " \
               "the sum of its values on micro-batches)"
    elif any(isinstance(h, _Batch) for h in held) and _couples_batch_dims(held):
        what = "combines different samples (e.g. every sample against every other, as a contrastive loss does)"
    else:
        what = "mixes the samples of the batch (batch statistics, a scan or sort along the batch, or an op " \
               "hapc cannot split by sample)"
    return (f"{node.op} ({node.name}){where} {what}: micro-batches would compute another loss; "
            "use --microbatches 1")


def _couples_batch_dims(held: list[_Batch | _Summed | None]) -> bool:
    """Two inputs holding the batch along different dimensions (``a @ b.T`` of two batches)."""
    return len({h.dim for h in held if isinstance(h, _Batch)}) > 1
