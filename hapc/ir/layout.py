"""How one logical tensor lives on the devices of a 1-D device group.

We use PyTorch DTensor's names because users already know them:

* ``Replicate()`` — every rank holds the whole tensor.
* ``Shard(dim)``  — rank r holds a contiguous piece along ``dim``; piece lengths follow the
  per-device shares (uneven in general), see :mod:`hapc.ir.shards`.
* ``Partial()``   — every rank holds a tensor of the full shape; the logical value is their sum.

Gradients follow the dual convention that autograd gives for free when each rank
back-propagates its own share of the loss: the gradient of a ``Replicate`` value is
``Partial`` (each rank holds its contribution), of a ``Shard`` value is the same ``Shard``,
of a ``Partial`` value is ``Replicate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True, order=True)
class Replicate:
    def __repr__(self) -> str:
        return "R"


@dataclass(frozen=True, order=True)
class Shard:
    dim: int

    def __repr__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, order=True)
class Partial:
    def __repr__(self) -> str:
        return "P"


Layout = Union[Replicate, Shard, Partial]

R = Replicate()
P = Partial()


def parse_layout(text: str) -> Layout:
    """Inverse of ``repr``: ``"R"``, ``"P"``, ``"S(2)"``."""
    text = text.strip()
    if text == "R":
        return R
    if text == "P":
        return P
    if text.startswith("S(") and text.endswith(")"):
        return Shard(int(text[2:-1]))
    raise ValueError(f"not a layout: {text!r} (want R, P or S(dim))")


def grad_layout(layout: Layout) -> Layout:
    """Layout of the gradient of a value held in ``layout`` (see module docstring)."""
    if isinstance(layout, Replicate):
        return P
    if isinstance(layout, Partial):
        return R
    return layout
