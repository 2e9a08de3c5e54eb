"""Loss functions: cross-entropy, NLL, MSE/L1 and friends.

A loss *mean* over a batch split unevenly must still be the exact global mean. For losses
over class-index targets the divisor is the global number of counted targets (ignored ids
and class weights change it, and it depends on the data), so the local implementation sums
its terms and divides by that count, summed over ranks with one tiny collective
(:func:`hapc.runtime.local_ops.cross_entropy_batch`). Elementwise losses divide by a known
size, so ``rescale`` suffices. Vocabulary-parallel cross-entropy takes logits sharded on the
class dimension (the output of a vocabulary-parallel LM head).
"""

from __future__ import annotations

import torch

from hapc.ir.graph import Graph, Node, Ref
from hapc.ir.layout import Layout, P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register, register_spec
from hapc.rules.samples import Ids, T

MEAN, SUM, NONE = 1, 2, 0


def _arg(node: Node, pos: int, name: str, default):
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


def _class_target_loss(node: Node, graph: Graph, *, smoothing_pos: int | None) -> list[Strategy]:
    refs = node.input_refs()
    logits, target = refs[0], refs[1]
    shape = graph.meta(logits).shape
    reduction = _arg(node, 3, "reduction", MEAN)
    has_weight = isinstance(_arg(node, 2, "weight", None), Ref)
    smoothing = _arg(node, smoothing_pos, "label_smoothing", 0.0) if smoothing_pos else 0.0
    rest: tuple[Layout, ...] = (R,) if has_weight else ()
    found = []
    if not graph.meta(target).is_float:
        if len(shape) == 1:
            return []
        for d, size in enumerate(shape):
            if d == 1 or size <= 1:
                continue
            t_dim = d if d == 0 else d - 1
            ins = (Shard(d), Shard(t_dim)) + rest
            if reduction == NONE:
                found.append(Strategy(ins, (Shard(t_dim),)))
            elif reduction == SUM:
                found.append(Strategy(ins, (P,)))
            elif not (has_weight and smoothing):
                local = "cross_entropy_batch" if smoothing_pos else "nll_loss_batch"
                found.append(Strategy(ins, (P,), local=local))
        if len(shape) == 2 and shape[1] > 1 and not has_weight and not smoothing and smoothing_pos:
            # Every rank holds its share of each term, so even reduction="none" is Partial.
            found.append(Strategy((Shard(1), R), (P,), local="vocab_parallel_cross_entropy"))
        return found
    # Probability targets: the mean divides by a known size, so rescale is exact.
    for d, size in enumerate(shape):
        if d == 1 or size <= 1:
            continue
        ins = (Shard(d), Shard(d)) + rest
        out = Shard(0 if d == 0 else d - 1) if reduction == NONE else P
        found.append(Strategy(ins, (out,), rescale=(0, d) if reduction == MEAN else None))
    return found


@register("aten.cross_entropy_loss.default", samples=lambda: [
    Sample((T(7, 11), Ids(11, 7))),
    Sample((T(7, 11), torch.tensor([1, -100, 3, 4, -100, 0, 10]))),
    Sample((T(7, 11), Ids(11, 7), T(11).abs(), SUM), frozen=(2,)),
    Sample((T(7, 11), Ids(11, 7), None, NONE)),
    Sample((T(7, 11), Ids(11, 7), T(11).abs(), MEAN, -100, 0.0), frozen=(2,)),
    Sample((T(7, 11), Ids(11, 7), None, MEAN, -100, 0.1)),
    Sample((T(5, 11, 4), Ids(11, 5, 4))),
    Sample((T(7, 11), T(7, 11).softmax(-1))),
])
def cross_entropy_rule(node: Node, graph: Graph) -> list[Strategy]:
    return _class_target_loss(node, graph, smoothing_pos=5)


@register(["aten.nll_loss_nd.default", "aten.nll_loss.default"], samples=lambda: [
    Sample((T(7, 11).log_softmax(-1), Ids(11, 7), None, MEAN, -100)),
    Sample((T(7, 11).log_softmax(-1), torch.tensor([1, -100, 3, 4, -100, 0, 10]), None, MEAN, -100)),
    Sample((T(7, 11).log_softmax(-1), Ids(11, 7), T(11).abs(), SUM, -100), frozen=(2,)),
    Sample((T(7, 11).log_softmax(-1), Ids(11, 7), T(11).abs(), MEAN, -100), frozen=(2,)),
])
def nll_loss_rule(node: Node, graph: Graph) -> list[Strategy]:
    return _class_target_loss(node, graph, smoothing_pos=None)


def elementwise_loss_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Losses that are a mean/sum of elementwise terms of two same-shaped tensors."""
    refs = node.input_refs()
    if len(refs) != 2 or graph.meta(refs[0]).shape != graph.meta(refs[1]).shape:
        return []
    shape = graph.meta(refs[0]).shape
    reduction = _arg(node, 2, "reduction", MEAN)
    found = []
    for d, size in enumerate(shape):
        if size <= 1:
            continue
        if reduction == NONE:
            found.append(Strategy((Shard(d), Shard(d)), (Shard(d),)))
        else:
            found.append(Strategy((Shard(d), Shard(d)), (P,), rescale=(0, d) if reduction == MEAN else None))
    return found


register_spec(["aten.mse_loss.default", "aten.l1_loss.default", "aten.smooth_l1_loss.default",
               "aten.huber_loss.default"],
              elementwise_loss_rule,
              samples=lambda: [Sample((T(7, 5), T(7, 5))), Sample((T(7, 5), T(7, 5), SUM)),
                               Sample((T(7, 5), T(7, 5), NONE))])
register_spec("aten.binary_cross_entropy_with_logits.default", elementwise_loss_rule,
              samples=lambda: [Sample((T(7, 5), T(7, 5).sigmoid()))])
