"""Generators that turn a compact, einsum-like spec into the strategies of an op.

The notation, for a node whose tensor arguments are listed in order::

    "m k+, k+ n -> m n"           # mm: k is summed over, so sharding it gives Partial
    "... k+, n k+ -> ... n"       # linear without bias; "..." stands for any leading dims
    "b h^ s d, b h^ t d -> ..."   # "^": this dimension may not be split

A letter present on some inputs and on the output may be sharded: every input that has it
is ``Shard`` on it and so is the output. A letter marked ``+`` (absent from the output) may
be sharded too when the op sums over it: the output is then ``Partial``. Dimensions of size
1 are never sharded (they broadcast).

``Partial`` inputs follow the op's linearity, given by ``linear``:

* ``"multilinear"`` — linear in each input separately (products such as ``mm``): exactly one
  input ``Partial`` and the rest ``Replicate`` gives a ``Partial`` output;
* ``"additive"`` — linear in all inputs jointly (``add``, ``sum``, views): all ``Partial``
  gives ``Partial``;
* ``None`` — ``Partial`` inputs are not accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import Layout, P, R, Shard
from hapc.rules.registry import Strategy

Linearity = Literal["multilinear", "additive", None]


@dataclass(frozen=True)
class DimSpec:
    letter: str
    reduced: bool = False
    unsplittable: bool = False


@dataclass(frozen=True)
class EinsumSpec:
    inputs: tuple[tuple[DimSpec, ...] | None, ...]  # None: "..." expanded per call
    output: tuple[DimSpec, ...]
    raw: str

    @staticmethod
    def parse(text: str) -> EinsumSpec:
        lhs, rhs = (part.strip() for part in text.split("->"))
        return EinsumSpec(tuple(_parse_operand(op) for op in lhs.split(",")), _parse_operand(rhs), text)


def _parse_operand(text: str) -> tuple[DimSpec, ...]:
    dims = []
    for tok in text.split():
        if tok == "...":
            dims.append(DimSpec("..."))
            continue
        dims.append(DimSpec(tok.rstrip("+^"), reduced=tok.endswith("+"), unsplittable=tok.endswith("^")))
    return tuple(dims)


def _expand(dims: Sequence[DimSpec], rank: int) -> list[DimSpec]:
    """Replace ``...`` by as many anonymous batch letters as the tensor's rank requires."""
    if not any(d.letter == "..." for d in dims):
        return list(dims)
    i = [d.letter for d in dims].index("...")
    n = rank - (len(dims) - 1)
    return list(dims[:i]) + [DimSpec(f"_{k}") for k in range(n)] + list(dims[i + 1:])


def einsum_strategies(node: Node, graph: Graph, spec: str | EinsumSpec,
                      linear: Linearity = None) -> list[Strategy]:
    """Strategies for a node whose tensor inputs are described by ``spec`` (see module doc)."""
    spec = EinsumSpec.parse(spec) if isinstance(spec, str) else spec
    refs = node.input_refs()
    shapes = [graph.meta(r).shape for r in refs]
    if len(shapes) != len(spec.inputs) or len(node.outputs) != 1:
        return []
    out_shape = graph.meta(node.outputs[0]).shape
    operands = [_expand(dims, len(shape)) for dims, shape in zip(spec.inputs, shapes)]
    out_dims = _expand(spec.output, len(out_shape))
    if any(len(o) != len(s) for o, s in zip(operands, shapes)) or len(out_dims) != len(out_shape):
        return []

    letters: dict[str, DimSpec] = {}
    for dims in operands + [out_dims]:
        for d in dims:
            letters.setdefault(d.letter, d)
            if d.unsplittable or d.reduced:
                letters[d.letter] = d
    out_letters = [d.letter for d in out_dims]
    found: list[Strategy] = []
    for letter, d in letters.items():
        if d.unsplittable:
            continue
        ins: list[Layout] = []
        for dims, shape in zip(operands, shapes):
            pos = [i for i, x in enumerate(dims) if x.letter == letter and shape[i] > 1]
            ins.append(Shard(pos[0]) if pos else R)
        if all(x == R for x in ins):
            continue
        if letter in out_letters:
            j = out_letters.index(letter)
            if out_shape[j] <= 1:
                continue
            found.append(Strategy(tuple(ins), (Shard(j),)))
        elif d.reduced:
            found.append(Strategy(tuple(ins), (P,)))
    found += partial_strategies(len(refs), linear)
    return found


def partial_strategies(n_inputs: int, linear: Linearity, outputs: int = 1) -> list[Strategy]:
    """The ``Partial``-in, ``Partial``-out strategies that the op's linearity allows."""
    outs = tuple(P for _ in range(outputs))
    if linear == "additive":
        return [Strategy(tuple(P for _ in range(n_inputs)), outs)]
    if linear == "multilinear":
        return [Strategy(tuple(P if j == i else R for j in range(n_inputs)), outs) for i in range(n_inputs)]
    return []


def pointwise_strategies(node: Node, graph: Graph, linear: Linearity = None) -> list[Strategy]:
    """Elementwise ops with broadcasting: shard any output dim that an input does not broadcast.

    Inputs are aligned to the output from the right, as broadcasting does; an input whose
    aligned dimension has size 1 (or that does not reach that far) stays ``Replicate``.
    """
    refs = node.input_refs()
    if not node.outputs:
        return []
    out_shape = graph.meta(node.outputs[0]).shape
    if any(graph.meta(o).shape != out_shape for o in node.outputs):
        return []
    found = []
    for j, size in enumerate(out_shape):
        if size <= 1:
            continue
        ins: list[Layout] = []
        for r in refs:
            shape = graph.meta(r).shape
            k = j - (len(out_shape) - len(shape))
            ins.append(Shard(k) if k >= 0 and shape[k] == size else R)
        if any(x != R for x in ins) or not refs:
            found.append(Strategy(tuple(ins), tuple(Shard(j) for _ in node.outputs)))
    found += partial_strategies(len(refs), linear, len(node.outputs))
    return found


def normalize_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim
