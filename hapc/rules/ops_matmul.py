"""Matrix products: mm, bmm, matmul, linear, addmm, einsum.

All are products summed over a contracted dimension: sharding that dimension gives a
``Partial`` output (row-parallel linear); sharding any other dimension shards the output
(column-parallel linear, data parallel). They are linear in each operand separately.
"""

from __future__ import annotations

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import P, Partial, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.registry import Sample, register, register_spec
from hapc.rules.samples import T
from hapc.rules.spec import einsum_strategies

register_spec("aten.mm.default", lambda n, g: einsum_strategies(n, g, "m k+, k+ n -> m n", "multilinear"),
              samples=lambda: [Sample((T(7, 10), T(10, 5)))])
register_spec("aten.bmm.default",
              lambda n, g: einsum_strategies(n, g, "b m k+, b k+ n -> b m n", "multilinear"),
              samples=lambda: [Sample((T(5, 7, 10), T(5, 10, 4)))])


def _with_bias_partial(found: list[Strategy], bias_pos: int) -> list[Strategy]:
    """A bias added to a Partial sum must itself be Partial (else it is counted once per rank)."""
    out = []
    for s in found:
        if isinstance(s.outputs[0], Partial):
            ins = list(s.inputs)
            ins[bias_pos] = P
            s = Strategy(tuple(ins), s.outputs)
        out.append(s)
    return out


@register("aten.linear.default", samples=lambda: [Sample((T(3, 7, 10), T(6, 10), T(6))),
                                                  Sample((T(7, 10), T(6, 10)))])
def linear_rule(node: Node, graph: Graph) -> list[Strategy]:
    if len(node.input_refs()) == 3:
        found = einsum_strategies(node, graph, "... k+, n k+, n -> ... n", "multilinear")
        # Multilinear in (x, w); the bias is added: P only with a Partial bias.
        found = [s for s in found if not (s.inputs[2] == P and s.inputs.count(P) == 1)]
        found = _with_bias_partial(found, 2)
    else:
        found = einsum_strategies(node, graph, "... k+, n k+ -> ... n", "multilinear")
    return found + sufficient_factor_strategies(found)


def sufficient_factor_strategies(found: list[Strategy]) -> list[Strategy]:
    """Data-parallel linear whose weight gradient is rebuilt from broadcast factors.

    ``dW = dY^T X``: instead of all-reducing ``dW`` (out x in values), every rank gathers the
    batch pieces of ``X`` and ``dY`` (batch x (in + out)) and computes the whole ``dW`` itself
    (Xie et al.'s sufficient factor broadcasting). Cheaper when the batch is small next to the
    layer. The forward is the data-parallel one; :func:`hapc.runtime.local_ops.linear_sfb`
    marks it, the cost model prices the factor gathers instead of the all-reduce, and the
    emitted program implements the backward.
    """
    out = []
    for s in found:
        x, w = s.inputs[0], s.inputs[1]
        rest = s.inputs[2:]
        if isinstance(x, Shard) and w == R and all(r == R for r in rest) and isinstance(s.outputs[0], Shard):
            out.append(Strategy(s.inputs, s.outputs, local="linear_sfb"))
    return out


@register("aten.addmm.default", samples=lambda: [Sample((T(6), T(7, 10), T(10, 6)))])
def addmm_rule(node: Node, graph: Graph) -> list[Strategy]:
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return []
    found = einsum_strategies(node, graph, "n, m k+, k+ n -> m n", "multilinear")
    found = [s for s in found if not (s.inputs[0] == P and s.inputs.count(P) == 1)]
    return _with_bias_partial(found, 0)


@register("aten.matmul.default", samples=lambda: [Sample((T(3, 7, 10), T(10, 5))),
                                                  Sample((T(2, 3, 7, 10), T(2, 3, 10, 5))),
                                                  Sample((T(7, 10), T(3, 10, 5))), Sample((T(7, 10), T(2, 3, 10, 5)))])
def matmul_rule(node: Node, graph: Graph) -> list[Strategy]:
    a, b = (graph.meta(r).shape for r in node.input_refs())
    if len(a) >= 2 and len(b) == 2:
        return einsum_strategies(node, graph, "... m k+, k+ n -> ... m n", "multilinear")
    if len(a) == 2 and len(b) >= 3:      # a weight times a batch of matrices (Mamba's dt_proj.weight @ x)
        return einsum_strategies(node, graph, "m k+, ... k+ n -> ... m n", "multilinear")
    if len(a) == len(b) and len(a) >= 3 and a[:-2] == b[:-2]:
        return einsum_strategies(node, graph, "... m k+, ... k+ n -> ... m n", "multilinear")
    return []


@register("aten.einsum.default", samples=lambda: [Sample(("bik,bkj->bij", [T(3, 5, 7), T(3, 7, 4)])),
                                                  Sample(("bhqd,bhkd->bhqk", [T(2, 3, 5, 4), T(2, 3, 6, 4)]))])
def einsum_rule(node: Node, graph: Graph) -> list[Strategy]:
    equation = node.args[0]
    if not isinstance(equation, str) or "..." in equation or "->" not in equation:
        return []
    lhs, rhs = equation.replace(" ", "").split("->")
    operands = lhs.split(",")
    spec = ", ".join(" ".join(c + ("+" if c not in rhs else "") for c in op) for op in operands)
    return einsum_strategies(node, graph, f"{spec} -> {' '.join(rhs)}", "multilinear")


@register("aten.baddbmm.default", samples=lambda: [
    Sample((T(5, 7, 4), T(5, 7, 10), T(5, 10, 4))),
    Sample((T(6, 1, 4), T(6, 7, 10), T(6, 10, 4)), {"beta": 1.0, "alpha": 0.25}),   # BLOOM's ALiBi
    Sample((T(4), T(5, 7, 10), T(5, 10, 4)), {"beta": 0.5, "alpha": 2.0})])
def baddbmm_rule(node: Node, graph: Graph) -> list[Strategy]:
    """``beta * self + alpha * (b1 @ b2)``: bmm's strategies, with ``self`` (broadcast from the
    right) sharded where the output is, and ``Partial`` when the product is (so that its
    ``beta * self`` is counted once). The scalars scale each term; they change no layout."""
    rank = len(graph.meta(node.input_refs()[0]).shape)
    if rank > 3:
        return []
    bias = " ".join("b m n".split()[3 - rank:])
    found = einsum_strategies(node, graph, f"{bias}, b m k+, b k+ n -> b m n", "multilinear")
    found = [s for s in found if not (s.inputs[0] == P and s.inputs.count(P) == 1)]
    return _with_bias_partial(found, 0)
