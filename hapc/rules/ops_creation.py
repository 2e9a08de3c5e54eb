"""Tensor creation: arange, zeros/ones/full/empty and their ``*_like`` / ``new_*`` forms.

A created tensor depends on no other rank, so it can be born in any layout: each rank makes
only its own piece (:func:`hapc.runtime.local_ops.create_local`, and ``arange_local`` for
ranges, whose piece starts at the rank's offset). ``*_like`` ops simply follow their input,
whose local piece already has the local shape; their values do not depend on the input, so
a ``Partial`` input gives a ``Replicate`` result. (``empty`` has no rule: its values
cannot be checked, and traced models rarely use it.)
"""

from __future__ import annotations

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register_spec
from hapc.rules.samples import T


def born_sharded_rule(local: str):
    def rule(node: Node, graph: Graph) -> list[Strategy]:
        if node.input_refs():
            return []
        shape = graph.meta(node.outputs[0]).shape
        return [Strategy((), (Shard(d),), local=local) for d, n in enumerate(shape) if n > 1]
    return rule


register_spec("aten.arange.default", born_sharded_rule("arange_local"), samples=lambda: [Sample((10,))])
register_spec("aten.arange.start", born_sharded_rule("arange_local"), samples=lambda: [Sample((2, 13))])
register_spec("aten.arange.start_step", born_sharded_rule("arange_local"), samples=lambda: [Sample((1, 20, 3))])
for _op in ("aten.zeros.default", "aten.ones.default"):
    register_spec(_op, born_sharded_rule("create_local"), samples=lambda: [Sample(([5, 7],))])
register_spec("aten.full.default", born_sharded_rule("create_local"), samples=lambda: [Sample(([5, 7], 1.5))])


def like_rule(node: Node, graph: Graph) -> list[Strategy]:
    shape = graph.meta(node.input_refs()[0]).shape
    found = [Strategy((Shard(d),), (Shard(d),)) for d, n in enumerate(shape) if n > 1]
    return found + [Strategy((P,), (R,))]


for _op in ("aten.zeros_like.default", "aten.ones_like.default"):
    register_spec(_op, like_rule, samples=lambda: [Sample((T(5, 7),))])
register_spec("aten.full_like.default", like_rule, samples=lambda: [Sample((T(5, 7), 2.5))])


def new_rule(node: Node, graph: Graph) -> list[Strategy]:
    """``x.new_zeros(size)`` reads only ``x``'s dtype and device: any layout of ``x`` will do."""
    shape = graph.meta(node.input_refs()[0]).shape
    return [Strategy((Shard(d),), (R,)) for d, n in enumerate(shape) if n > 1] + [Strategy((P,), (R,))]


for _op in ("aten.new_zeros.default", "aten.new_ones.default"):
    register_spec(_op, new_rule, samples=lambda: [Sample((T(5, 7), [3, 4]))])
register_spec("aten.new_full.default", new_rule, samples=lambda: [Sample((T(5, 7), [3, 4], 1.5))])
