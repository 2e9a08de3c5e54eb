"""Ops that build attention masks and position ids: Boolean and integer elementwise ops,
two-tensor min/max, and ``diff``.

Hugging Face's mask code (``transformers.masking_utils``) combines causal, sliding-window and
padding conditions with Python's ``&``/``|`` operators, which export keeps as
``aten.__and__``/``aten.__or__``; packed-sequence detection takes ``torch.diff`` of the
position ids; T5's relative-position buckets use ``torch.min(a, b)``. All are elementwise
(``diff`` along one dimension), so any dimension they do not work along may be sharded.

None of the Boolean or integer ops is linear: they take no ``Partial`` input. ``diff`` is a
difference of shifted copies, so it is linear: ``Partial`` in, ``Partial`` out.
"""

from __future__ import annotations

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import Layout, P, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register, register_spec
from hapc.rules.samples import B, Ids, Pos, T
from hapc.rules.spec import normalize_dim, pointwise_strategies

# Python-operator overloads and the bitwise/logical ops the pointwise module does not list.
BOOLEAN = [
    "aten.__and__.Tensor", "aten.__or__.Tensor", "aten.__xor__.Tensor", "aten.bitwise_xor.Tensor",
    "aten.logical_xor.default",
]
BOOLEAN_SCALAR = ["aten.__and__.Scalar", "aten.__or__.Scalar", "aten.bitwise_and.Scalar",
                  "aten.bitwise_or.Scalar"]
# Nonlinear binary ops on numbers.
NUMERIC = ["aten.min.other", "aten.max.other", "aten.clamp.Tensor", "aten.floor_divide.default",
           "aten.remainder.Tensor", "aten.fmod.Tensor"]


def _nonlinear(node: Node, graph: Graph) -> list[Strategy]:
    return pointwise_strategies(node, graph, None)


register_spec(BOOLEAN, _nonlinear, samples=lambda: [Sample((B(5, 7), B(7))), Sample((B(5, 1, 7), B(4, 1)))])
register_spec(BOOLEAN_SCALAR, _nonlinear, samples=lambda: [Sample((B(5, 7), True)), Sample((Ids(8, 5, 7), 3))])


def _numeric_samples(op: str):
    def make() -> list[Sample]:
        if op == "aten.clamp.Tensor":
            return [Sample((T(5, 7), T(7) - 0.5, T(5, 7) + 0.5)), Sample((T(5, 7), T(1, 7)))]
        if op == "aten.floor_divide.default":     # integers only: it has no derivative
            return [Sample((Ids(50, 5, 7), Ids(6, 7) + 1)), Sample((Ids(50, 5, 1, 7), Ids(6, 4, 1) + 1))]
        if op in ("aten.remainder.Tensor", "aten.fmod.Tensor"):
            return [Sample((T(5, 7), Pos(7))), Sample((Ids(50, 5, 7), Ids(6, 7) + 1))]
        return [Sample((T(5, 7), T(7))), Sample((T(5, 1, 7), T(4, 1)))]
    return make


for _op in NUMERIC:
    register_spec(_op, _nonlinear, samples=_numeric_samples(_op))


def _arg(node: Node, pos: int, name: str, default):
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


@register("aten.diff.default", samples=lambda: [
    Sample((T(5, 7),)), Sample((T(5, 7, 4), 1, 1)), Sample((T(5, 7), 2, 0)),
    Sample((T(5, 7), 1, -1), {"prepend": T(5, 1)}), Sample((T(5, 7), 1, 0), {"append": T(2, 7)}),
    Sample((Ids(9, 5, 7),), {"prepend": Ids(9, 5, 1)})])
def diff_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Shard any dimension but the one differenced; every tensor input (``prepend``,
    ``append``) has the same size there, so all are sharded alike."""
    refs = node.input_refs()
    shape = graph.meta(refs[0]).shape
    out_shape = graph.meta(node.outputs[0]).shape
    dim = normalize_dim(_arg(node, 2, "dim", -1), len(shape))
    if any(len(graph.meta(r).shape) != len(shape) for r in refs):
        return []
    found = []
    for d, size in enumerate(out_shape):
        if d != dim and size > 1:
            ins: tuple[Layout, ...] = tuple(Shard(d) for _ in refs)
            found.append(Strategy(ins, (Shard(d),)))
    if graph.meta(refs[0]).dtype.startswith(("float", "bfloat", "complex")):
        found.append(Strategy(tuple(P for _ in refs), (P,)))
    return found


