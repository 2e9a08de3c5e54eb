"""Layer norm and RMS norm: they normalise over the trailing ``normalized_shape`` dims.

Any leading dimension (batch, sequence) may be sharded; the affine weight and bias stay
replicated. Sharding the normalised dims would need partial statistics from every rank.
"""

from __future__ import annotations

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import Layout, P, R, Shard
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


def weight_norm_rule(node: Node, graph: Graph) -> list[Strategy]:
    """``_weight_norm(v, g, dim) = v * g / ||v||`` with the norm taken over every dimension but
    ``dim``: sharding ``dim`` (output channels, for a convolution) keeps each norm on one rank.
    The result is linear in ``g``, so ``Partial`` magnitudes give a ``Partial`` weight."""
    v, g = node.input_refs()[:2]
    shape, g_shape = graph.meta(v).shape, graph.meta(g).shape
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    found = [Strategy((R, P), (P,))]
    if 0 <= dim < len(shape) and shape[dim] > 1 and len(g_shape) == len(shape) and g_shape[dim] == shape[dim]:
        found.append(Strategy((Shard(dim), Shard(dim)), (Shard(dim),)))
    return found


register_spec("aten._weight_norm.default", weight_norm_rule, samples=lambda: [
    Sample((T(7, 5, 3), T(7, 1, 1), 0)),
    Sample((T(6, 5, 7), T(1, 1, 7), 2)),        # wav2vec2's positional convolution: dim=2
    Sample((T(7, 5), T(1, 5), 1))])
