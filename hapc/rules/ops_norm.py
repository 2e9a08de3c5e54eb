"""Layer norm and RMS norm: they normalise over the trailing ``normalized_shape`` dims.

Any leading dimension (batch, sequence) may be sharded; the affine weight and bias stay
replicated. Sharding the normalised dims would need partial statistics from every rank.
"""

from __future__ import annotations

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import Layout, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register_spec
from hapc.rules.samples import T


def norm_rule(node: Node, graph: Graph) -> list[Strategy]:
    refs = node.input_refs()
    shape = graph.meta(refs[0]).shape
    normalized = len(node.args[1])
    found = []
    for d in range(len(shape) - normalized):
        if shape[d] > 1:
            ins: tuple[Layout, ...] = (Shard(d),) + tuple(R for _ in refs[1:])
            found.append(Strategy(ins, (Shard(d),)))
    return found


register_spec("aten.layer_norm.default", norm_rule,
              samples=lambda: [Sample((T(5, 7, 10), [10], T(10), T(10), 1e-5)), Sample((T(7, 4, 5), [4, 5]))])
register_spec("aten.rms_norm.default", norm_rule,
              samples=lambda: [Sample((T(5, 7, 10), [10], T(10), 1e-6)), Sample((T(7, 10), [10]))])
