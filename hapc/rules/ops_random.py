"""Random ops: ``rand``/``randn``/``randint`` (and ``*_like``), ``normal``, ``uniform``,
``exponential``, ``bernoulli``, ``randperm`` and ``multinomial``.

Every strategy, the all-``Replicate`` one included, draws through a local op of
:mod:`hapc.runtime.random_ops`: element i of a node's global output is a hash of (node, step,
i), so a rank computes only its own piece and every layout (and ``--verify``'s one device)
sees the same numbers. Running the plain op instead would draw from torch's generator, whose
values differ between ranks, layouts and devices.

* created (``rand(size)``): born in any layout, like ``zeros`` (:mod:`hapc.rules.ops_creation`);
* drawn over a tensor's shape (``rand_like(x)``, ``x.uniform_()``, ``bernoulli(x, 0.3)``):
  follow the tensor, whose values they do not read, so a ``Partial`` one will do too;
* with tensor parameters (``bernoulli(p)``, ``normal(mean, std)``): elementwise with
  broadcasting; no ``Partial`` (none is linear in its parameters);
* ``randperm`` and ``multinomial`` are not elementwise: drawn whole on every rank
  (``random_whole``), replicated; the planner slices them where it wants pieces.

None of them has a gradient (torch's are zeros), so the tracer marks their results as needing
none. A random op's pointwise work is a few integer operations per element: the cost model
counts it as elementwise.
"""

from __future__ import annotations

import torch

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register_spec
from hapc.rules.samples import Ids, Pos, T
from hapc.rules.spec import pointwise_strategies

PIECE, WHOLE = "random_piece", "random_whole"     # the local ops (hapc.runtime.random_ops)


def _replicated(node: Node, local: str) -> Strategy:
    return Strategy(tuple(R for _ in node.input_refs()), (R,), local=local)


def created_rule(node: Node, graph: Graph) -> list[Strategy]:
    """No tensor input: each rank draws its piece of any dimension, or the whole."""
    shape = graph.meta(node.outputs[0]).shape
    return [_replicated(node, PIECE)] + [Strategy((), (Shard(d),), local=PIECE) for d, n in enumerate(shape) if n > 1]


def like_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Drawn over the first input's shape, reading only its dtype and device."""
    shape = graph.meta(node.input_refs()[0]).shape
    return [_replicated(node, PIECE), Strategy((P,), (R,), local=PIECE)] + [
        Strategy((Shard(d),), (Shard(d),), local=PIECE) for d, n in enumerate(shape) if n > 1]


def parameterized_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Elementwise in tensor parameters (probabilities, means, standard deviations)."""
    return [_replicated(node, PIECE)] + [Strategy(s.inputs, s.outputs, local=PIECE)
                                         for s in pointwise_strategies(node, graph, None)]


def whole_rule(node: Node, graph: Graph) -> list[Strategy]:
    return [_replicated(node, WHOLE)]


def _probabilities(*shape: int) -> torch.Tensor:
    return Pos(*shape) - 0.5             # in [0, 1)


register_spec("aten.rand.default", created_rule, samples=lambda: [
    Sample(([5, 7],)), Sample(([3, 5, 7],), {"dtype": torch.float64})])
register_spec("aten.randn.default", created_rule, samples=lambda: [Sample(([5, 7],)), Sample(([11],))])
register_spec("aten.randint.default", created_rule, samples=lambda: [Sample((10, [5, 7]))])
register_spec("aten.randint.low", created_rule, samples=lambda: [Sample((-3, 4, [5, 7]))])
register_spec("aten.normal.float_float", created_rule, samples=lambda: [Sample((1.0, 2.0, [5, 7]))])

register_spec(["aten.rand_like.default", "aten.randn_like.default"], like_rule,
              samples=lambda: [Sample((T(5, 7),)), Sample((T(3, 5, 7),), {"dtype": torch.float32})])
register_spec("aten.randint_like.default", like_rule, samples=lambda: [Sample((T(5, 7), 6)), Sample((Ids(9, 5, 7), 3))])
register_spec("aten.randint_like.low_dtype", like_rule, samples=lambda: [Sample((T(5, 7), -2, 6))])
register_spec("aten.bernoulli.p", like_rule, samples=lambda: [Sample((T(5, 7), 0.3))])
register_spec("aten.uniform.default", like_rule, samples=lambda: [Sample((T(5, 7), -1.0, 2.0)), Sample((T(5, 7),))])
register_spec("aten.normal_functional.default", like_rule, samples=lambda: [Sample((T(5, 7), 1.0, 0.5))])
register_spec("aten.exponential.default", like_rule, samples=lambda: [Sample((T(5, 7), 2.0))])

register_spec("aten.bernoulli.default", parameterized_rule, samples=lambda: [Sample((_probabilities(5, 7),))])
register_spec("aten.bernoulli.Tensor", parameterized_rule, samples=lambda: [
    Sample((T(5, 7), _probabilities(7))), Sample((T(5, 7), _probabilities(5, 7)))])
register_spec("aten.normal.Tensor_float", parameterized_rule, samples=lambda: [Sample((T(5, 7), 0.5))])
register_spec("aten.normal.float_Tensor", parameterized_rule, samples=lambda: [Sample((1.0, Pos(5, 7)))])
register_spec("aten.normal.Tensor_Tensor", parameterized_rule, samples=lambda: [
    Sample((T(5, 7), Pos(5, 7))), Sample((T(5, 7), Pos(7)))])

register_spec("aten.randperm.default", whole_rule, samples=lambda: [Sample((9,))])
register_spec("aten.multinomial.default", whole_rule, samples=lambda: [
    Sample((Pos(5, 6), 3)), Sample((Pos(6), 4, True)), Sample((Pos(5, 6), 8, True))])
