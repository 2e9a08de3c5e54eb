"""How one logical tensor lives on the devices of a 1-D device group.

We use PyTorch DTensor's names because users already know them:

* ``Replicate()`` — every rank holds the whole tensor.
* ``Shard(dim)``  — rank r holds a contiguous piece along ``dim``; piece lengths follow the
  per-device shares (uneven in general), see :mod:`hapc.ir.shards`.
* ``Partial()``   — every rank holds a tensor of the full shape; the logical value is their sum.
* ``ExpertRows()`` (``E``) — rows of expert-sorted tokens, each rank holding the rows routed
  to the experts whose weights it holds (a grouped matmul with its experts sharded). A
  ``Shard(0)`` whose piece lengths only the routing decides, at run time: the cost model sizes
  it as ``Shard(0)`` by the shares; no layout change makes one or reads one (which rows are
  whose is known only to the grouped matmuls that take the routing's offsets), so it lives
  from one grouped matmul to the next (:mod:`hapc.rules.expert_rows`).

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


@dataclass(frozen=True, order=True)
class ExpertRows(Shard):
    dim: int = 0

    def __repr__(self) -> str:
        return "E"


Layout = Union[Replicate, Shard, Partial]

R = Replicate()
P = Partial()
E = ExpertRows()


def parse_layout(text: str) -> Layout:
    """Inverse of ``repr``: ``"R"``, ``"P"``, ``"E"``, ``"S(2)"``."""
    text = text.strip()
    if text == "R":
        return R
    if text == "P":
        return P
    if text == "E":
        return E
    if text.startswith("S(") and text.endswith(")"):
        return Shard(int(text[2:-1]))
    raise ValueError(f"not a layout: {text!r} (want R, P, E or S(dim))")


def grad_layout(layout: Layout) -> Layout:
    """Layout of the gradient of a value held in ``layout`` (see module docstring)."""
    if isinstance(layout, Replicate):
        return P
    if isinstance(layout, Partial):
        return R
    return layout


def reachable(src: Layout, dst: Layout) -> bool:
    """Whether a layout change can turn ``src`` into ``dst``: any but to or from
    ``ExpertRows`` (see the module docstring)."""
    return src == dst or not (isinstance(src, ExpertRows) or isinstance(dst, ExpertRows))
