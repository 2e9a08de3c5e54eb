"""Elementwise ops (with broadcasting) and dropout.

All come from :func:`pointwise_strategies`: any output dimension that no input broadcasts
may be sharded. What differs between ops is only how ``Partial`` inputs pass through, which
follows from linearity:

* additive (``x + y``, ``-x``, ``2 * x``, dtype casts): all-Partial in, Partial out;
* multilinear (``x * y``): one Partial factor times replicated ones;
* ``x / y``: linear in ``x`` only; ``where(c, a, b)``: linear in ``(a, b)``.

Adding a constant (``x + 1``) is not linear: every rank would add it once.
"""

from __future__ import annotations

import torch

from hapc.ir.graph import Graph, Node, Ref
from hapc.ir.layout import P, R
from hapc.ir.program import Strategy
from hapc.rules.ops_cast import keeps_partial_sums
from hapc.rules.registry import Sample, register, register_spec
from hapc.rules.samples import B, Pos, T
from hapc.rules.spec import pointwise_strategies

UNARY = [
    "relu", "gelu", "silu", "tanh", "sigmoid", "exp", "log", "sqrt", "rsqrt", "abs", "erf", "sin", "cos",
    "reciprocal", "softplus", "leaky_relu", "hardtanh", "elu", "log1p", "expm1", "sign", "floor", "ceil",
    "round", "square", "mish", "hardswish", "hardsigmoid", "relu6", "logical_not", "bitwise_not", "isnan",
    "nan_to_num", "clamp_min", "clamp_max", "sgn", "neg", "clone", "to", "_to_copy", "contiguous",
    "lift_fresh_copy",
]
UNARY_OVERLOADS = {
    "clamp_min": ["default"], "clamp_max": ["default"], "to": ["dtype", "dtype_layout"],
}
# Unary ops that are linear maps of their input.
LINEAR_UNARY = {"neg", "clone", "to", "_to_copy", "contiguous", "lift_fresh_copy"}


def _unary_ops() -> dict[str, str]:
    """aten overload name -> family name."""
    ops = {}
    for name in UNARY:
        for overload in UNARY_OVERLOADS.get(name, ["default"]):
            ops[f"aten.{name}.{overload}"] = name
    ops["aten.clamp.default"] = "clamp"
    ops["aten.pow.Tensor_Scalar"] = "pow"
    ops["aten.leaky_relu.default"] = "leaky_relu"
    return ops


def _unary_samples(op: str):
    def make() -> list[Sample]:
        if op in ("aten.log.default", "aten.sqrt.default", "aten.rsqrt.default", "aten.reciprocal.default",
                  "aten.log1p.default"):
            return [Sample((Pos(5, 7),))]
        if op in ("aten.logical_not.default", "aten.bitwise_not.default"):
            return [Sample((B(5, 7),))]
        if op == "aten.clamp.default":
            return [Sample((T(5, 7), -0.5, 0.5))]
        if op in ("aten.clamp_min.default", "aten.clamp_max.default"):
            return [Sample((T(5, 7), 0.1))]
        if op == "aten.pow.Tensor_Scalar":
            return [Sample((T(5, 7), 2))]
        if op == "aten.to.dtype":
            return [Sample((T(5, 7), torch.float64)), Sample((T(5, 7), torch.int64)), Sample((T(5, 7), torch.bool))]
        if op == "aten.to.dtype_layout":
            return [Sample((T(5, 7),), {"dtype": torch.float64})]
        if op == "aten._to_copy.default":
            return [Sample((T(5, 7),), {"dtype": torch.float64}), Sample((T(5, 7),), {"dtype": torch.int64})]
        return [Sample((T(5, 7),))]
    return make


# Casts are linear only between float types: into an integer or bool each piece would round.
CASTS = {"to", "_to_copy"}


def _unary_rule(linear: bool):
    def rule(node: Node, graph: Graph) -> list[Strategy]:
        if linear and node.op.split(".")[1] in CASTS:
            linear_here = keeps_partial_sums(node, graph)
        else:
            linear_here = linear
        return pointwise_strategies(node, graph, "additive" if linear_here else None)
    return rule


for _op, _family in _unary_ops().items():
    register_spec(_op, _unary_rule(_family in LINEAR_UNARY), samples=_unary_samples(_op))


def _tensor_args(node: Node) -> int:
    return len(node.input_refs())


@register(["aten.add.Tensor", "aten.sub.Tensor"],
          samples=lambda: [Sample((T(5, 7), T(7))), Sample((T(5, 1, 7), T(4, 1))), Sample((T(5, 7), 1.5))])
def add_rule(node: Node, graph: Graph) -> list[Strategy]:
    # x + y is linear in (x, y) jointly; x + constant is not.
    linear = "additive" if _tensor_args(node) == 2 or _is_zero(node.args[1]) else None
    return pointwise_strategies(node, graph, linear)


@register("aten.mul.Tensor",
          samples=lambda: [Sample((T(5, 7), T(5, 7))), Sample((T(5, 7), T(7))), Sample((T(5, 7), 3.0))])
def mul_rule(node: Node, graph: Graph) -> list[Strategy]:
    return pointwise_strategies(node, graph, "multilinear" if _tensor_args(node) == 2 else "additive")


register_spec(["aten.mul.Scalar", "aten.div.Scalar"],
              lambda n, g: pointwise_strategies(n, g, "additive"),
              samples=lambda: [Sample((T(5, 7), 3.0))])


@register("aten.div.Tensor",
          samples=lambda: [Sample((T(5, 7), Pos(5, 7))), Sample((T(5, 7), Pos(7))), Sample((T(5, 7), 2.0))])
def div_rule(node: Node, graph: Graph) -> list[Strategy]:
    found = pointwise_strategies(node, graph, None)
    if isinstance(node.args[0], Ref):
        if _tensor_args(node) == 1:
            found.append(Strategy((P,), (P,)))
        elif isinstance(node.args[1], Ref):
            found.append(Strategy((P, R), (P,)))
    return found


def _is_zero(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


BINARY_NONLINEAR = [
    "aten.maximum.default", "aten.minimum.default", "aten.pow.Tensor_Tensor", "aten.atan2.default",
    "aten.eq.Tensor", "aten.ne.Tensor", "aten.lt.Tensor", "aten.le.Tensor", "aten.gt.Tensor", "aten.ge.Tensor",
    "aten.eq.Scalar", "aten.ne.Scalar", "aten.lt.Scalar", "aten.le.Scalar", "aten.gt.Scalar", "aten.ge.Scalar",
    "aten.logical_and.default", "aten.logical_or.default", "aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor",
    "aten.rsub.Scalar", "aten.remainder.Scalar", "aten.fmod.Scalar", "aten.add.Scalar", "aten.sub.Scalar",
    "aten.pow.Scalar", "aten.div.Tensor_mode", "aten.gelu_backward.default",
]


def _binary_samples(op: str):
    def make() -> list[Sample]:
        if op.endswith(".Scalar") or op == "aten.div.Tensor_mode":
            if op == "aten.pow.Scalar":
                return [Sample((2.0, T(5, 7)))]
            if op == "aten.div.Tensor_mode":
                return [Sample((T(5, 7), Pos(7)), {"rounding_mode": "floor"})]
            return [Sample((T(5, 7), 0.3))]
        if op.startswith(("aten.logical", "aten.bitwise")):
            return [Sample((B(5, 7), B(7)))]
        if op == "aten.pow.Tensor_Tensor":
            return [Sample((Pos(5, 7), T(7)))]
        if op == "aten.gelu_backward.default":
            return [Sample((T(5, 7), T(5, 7)))]
        return [Sample((T(5, 7), T(7))), Sample((T(5, 1, 7), T(4, 1)))]
    return make


for _op in BINARY_NONLINEAR:
    register_spec(_op, lambda n, g: pointwise_strategies(n, g, None), samples=_binary_samples(_op))


WHERE_SAMPLES = {
    "aten.where.self": lambda: [Sample((B(5, 7), T(5, 7), T(7)))],
    "aten.where.ScalarOther": lambda: [Sample((B(5, 7), T(5, 7), 0.0))],
    "aten.where.ScalarSelf": lambda: [Sample((B(5, 7), 1.0, T(7)))],
    "aten.where.Scalar": lambda: [Sample((B(5, 7), 1.0, 0.0))],
}


def where_rule(node: Node, graph: Graph) -> list[Strategy]:
    found = pointwise_strategies(node, graph, None)
    if node.op == "aten.where.self" and len(node.input_refs()) == 3:
        found.append(Strategy((R, P, P), (P,)))   # linear in the two branches, for a fixed condition
    return found


for _op, _samples in WHERE_SAMPLES.items():
    register_spec(_op, where_rule, samples=_samples)


@register("aten.masked_fill.Scalar",
          samples=lambda: [Sample((T(5, 7), B(5, 7), 0.0)), Sample((T(5, 7), B(7), -1.0))])
def masked_fill_rule(node: Node, graph: Graph) -> list[Strategy]:
    found = pointwise_strategies(node, graph, None)
    if _is_zero(node.args[2]) and len(node.input_refs()) == 2:
        found.append(Strategy((P, R), (P,)))     # filling with zeros keeps the map linear
    return found


register_spec("aten.masked_fill.Tensor", masked_fill_rule,
              samples=lambda: [Sample((T(5, 7), B(7), torch.tensor(-1.0, dtype=torch.float64)))])
register_spec("aten.broadcast_tensors.default", lambda n, g: pointwise_strategies(n, g, "additive"),
              samples=lambda: [Sample(([T(5, 7), T(7)],))])


@register("aten.dropout.default", samples=lambda: [Sample((T(5, 7), 0.3, True)), Sample((T(5, 7), 0.0, False))])
def dropout_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Dropout draws its mask for the global tensor from a seed shared by all ranks
    (:func:`hapc.runtime.random_ops.dropout`), so every layout drops the same elements."""
    found = pointwise_strategies(node, graph, "additive")   # a fixed mask is a linear map
    return [Strategy((R,), (R,), local="dropout")] + [
        Strategy(s.inputs, s.outputs, local="dropout") for s in found]
