"""Casts that keep values: ``type_as`` (export keeps it as ``aten.type_as``), ``to`` with a
device (Hugging Face moves masks and rotary tables with ``.to(x.device)``), ``to`` another
tensor's dtype and device.

A cast maps each element on its own and is linear (a sum of pieces casts to the cast of the
sum, up to rounding), so every layout passes through: ``Shard`` to ``Shard``, ``Partial`` to
``Partial``. The second tensor of ``type_as``/``to.other`` gives only its dtype and device: its
values are never read, so it may arrive in any layout; it is asked for ``Replicate`` (or the
same shard, when its shape matches) so that nothing moves for it.
"""

from __future__ import annotations

import torch

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register
from hapc.rules.samples import Ids, T
from hapc.rules.spec import pointwise_strategies


@register(["aten.type_as.default", "aten.to.other"], samples=lambda: [
    Sample((T(5, 7), T(3, dtype=torch.float32))), Sample((T(5, 7), T(5, 7, dtype=torch.float32))),
    Sample((Ids(9, 5, 7), T(2))), Sample((T(5, 7), T(7))), Sample((T(5, 7), Ids(3, 2))),
    Sample((T(5, 7), T(5, 3, dtype=torch.float32)))])
def type_as_rule(node: Node, graph: Graph) -> list[Strategy]:
    x, other = node.input_refs()[:2]
    linear = keeps_partial_sums(node, graph)
    found = pointwise_strategies(node, graph, "additive" if linear else None)
    other_shape, out_shape = graph.meta(other).shape, graph.meta(node.outputs[0]).shape
    if other_shape != out_shape:
        # Read for its dtype only: whole, or sharded alike where it has a dimension as long
        # (Granite's routing weights cast as the hidden states they route, both by token).
        found = [Strategy((s.inputs[0], R), s.outputs) for s in found if s.inputs[0] != R] + [
            Strategy((s.inputs[0], s.inputs[0]), s.outputs) for s in found
            if isinstance(s.inputs[0], Shard) and s.inputs[0].dim < len(other_shape)
            and other_shape[s.inputs[0].dim] == out_shape[s.inputs[0].dim]]
    if linear:
        found.append(Strategy((P, R), (P,)))
    return found


@register("aten.to.device", samples=lambda: [
    Sample((T(5, 7), torch.device("cpu"), torch.float64, False, True)),
    Sample((T(5, 7), torch.device("cpu"), torch.float64)),
    Sample((Ids(9, 5, 7), torch.device("cpu"), torch.int32)), Sample((T(5, 7), torch.device("cpu"), torch.int64))])
def to_device_rule(node: Node, graph: Graph) -> list[Strategy]:
    return pointwise_strategies(node, graph, "additive" if keeps_partial_sums(node, graph) else None)


def keeps_partial_sums(node: Node, graph: Graph) -> bool:
    """A cast keeps a ``Partial`` sum only between float types: to an integer it would round
    each piece, not the sum. (Into a narrower float it rounds each piece too, by at most the
    precision the cast asks for.)"""
    dtypes = (graph.meta(node.input_refs()[0]).dtype, graph.meta(node.outputs[0]).dtype)
    return all(d.startswith(("float", "bfloat")) for d in dtypes)
