"""A distributed (SPMD) program: the traced graph with a layout for every value.

It is an ordered list of instructions over named values:

* :class:`Compute` runs one graph node on every rank with a chosen :class:`Strategy`;
* :class:`Redistribute` changes a value's layout with a collective (or a free local slice).

Sources (parameters, buffers, inputs) start in ``source_layouts``: a ``Shard`` parameter is
stored sharded (ZeRO-3 style when it is gathered before use). Every rank computes from the
same program; which piece it holds follows from ``shares`` and :meth:`DistProgram.blocks`.
``state_shares``, when set, shards the optimizer state (and, in one-stage programs, the
gradients) of the parameters stored replicated, ZeRO-1/2 style: rank ``r`` keeps
``state_shares[r]`` of each one's rows and updates only those (:mod:`synth.zero`).
``recompute`` runs every call of a repeated block (a layer) again in backward instead of
keeping its activations (:mod:`costmodel.recompute`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from math import gcd
from typing import Any, Union

from hapc.ir.graph import Graph
from hapc.ir.layout import ExpertRows, Layout, Partial, Replicate, Shard
from hapc.ir.shards import offsets, shard_lengths


@dataclass(frozen=True)
class Strategy:
    """``{inputs} op {outputs}``, with how each rank computes its piece.

    ``inputs`` has one layout per tensor argument, in ``node.input_refs()`` order.
    ``local`` names a function in :mod:`hapc.runtime.local_ops` that replaces the plain op on
    each rank (vocab-parallel embedding masks foreign ids, a view needs local sizes, ...);
    ``None`` runs the op itself on the local pieces.
    ``rescale = (input position, dim)`` multiplies every output by local/global length of
    that input dimension: a mean over a sharded dimension becomes an exact ``Partial`` sum even
    when pieces are uneven.
    """

    inputs: tuple[Layout, ...]
    outputs: tuple[Layout, ...]
    local: str | None = None
    rescale: tuple[int, int] | None = None

    def __repr__(self) -> str:
        ins = ", ".join(map(repr, self.inputs))
        outs = ", ".join(map(repr, self.outputs))
        extra = f" via {self.local}" if self.local else ""
        extra += f" rescale{self.rescale}" if self.rescale else ""
        return f"{{{ins}}} -> {{{outs}}}{extra}"

    @property
    def is_replicated(self) -> bool:
        return all(isinstance(x, Replicate) for x in self.inputs + self.outputs)


@dataclass(frozen=True)
class Compute:
    node: str
    strategy: Strategy
    inputs: tuple[str, ...]      # the value actually read for each tensor argument


@dataclass(frozen=True)
class Redistribute:
    src: str
    out: str
    src_layout: Layout
    dst_layout: Layout
    method: str = "auto"         # which collective variant (padded, grouped, hierarchical ...)

    def __repr__(self) -> str:
        return f"{self.out} = redistribute({self.src}: {self.src_layout} -> {self.dst_layout}, {self.method})"


Step = Union[Compute, Redistribute]


@dataclass
class DistProgram:
    graph: Graph
    shares: tuple[float, ...]
    source_layouts: dict[str, Layout]
    steps: list[Step] = field(default_factory=list)
    state_shares: tuple[float, ...] | None = None
    recompute: bool = False     # repeated blocks keep only their inputs (costmodel.recompute)
    _blocks: dict[tuple[str, int], int] | None = field(default=None, repr=False)
    _pieces: tuple[Any, dict[tuple, tuple]] | None = field(default=None, repr=False,
                                                                                compare=False)

    @property
    def world(self) -> int:
        return len(self.shares)

    def layouts(self) -> dict[str, Layout]:
        """Layout of every value the program holds, sources and results."""
        out = dict(self.source_layouts)
        nodes = {n.name: n for n in self.graph.nodes}
        for step in self.steps:
            if isinstance(step, Compute):
                for name, lay in zip(nodes[step.node].outputs, step.strategy.outputs):
                    out[name] = lay
            else:
                out[step.out] = step.dst_layout
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        base = name.split("@", 1)[0]
        return self.graph.meta(base).shape

    def blocks(self) -> dict[tuple[str, int], int]:
        """Block count of every sharded dimension (see :mod:`hapc.ir.shards`).

        All dimensions sharded within one strategy hold corresponding pieces on each rank, so
        they must be cut into the same number of blocks: the gcd of their lengths. The classes
        are found by merging (value, dim) pairs' member lists, the smaller into the larger (a
        program links thousands of pairs; this is a third of a parent-pointer union-find's
        time in Python).
        """
        if self._blocks is not None:
            return self._blocks
        group_of: dict[tuple[str, int], list[tuple[str, int]]] = {}   # pair -> its class's members

        def link(keys):
            group = None
            for k in keys:
                members = group_of.get(k)
                if members is None:
                    if group is None:
                        group = []
                    group.append(k)
                    group_of[k] = group
                elif group is None:
                    group = members
                elif members is not group:
                    if len(members) > len(group):
                        group, members = members, group
                    for m in members:
                        group_of[m] = group
                    group.extend(members)

        outputs = {n.name: n.outputs for n in self.graph.nodes}
        for name, lay in self.source_layouts.items():
            if isinstance(lay, Shard):
                link([(name, self._dim(name, lay.dim))])
        for step in self.steps:
            if isinstance(step, Compute):
                # Expert rows are cut by the routing, not in blocks: they tie nothing (an expert
                # MLP's weights keep blocks of whole experts whatever the number of tokens).
                keys = [(v, self._dim(v, lay.dim)) for v, lay in zip(step.inputs, step.strategy.inputs)
                        if isinstance(lay, Shard) and not isinstance(lay, ExpertRows)]
                keys += [(v, self._dim(v, lay.dim)) for v, lay in zip(outputs[step.node], step.strategy.outputs)
                         if isinstance(lay, Shard) and not isinstance(lay, ExpertRows)]
                link(keys)
            else:
                if isinstance(step.dst_layout, Shard):
                    link([(step.out, self._dim(step.out, step.dst_layout.dim))])
                if isinstance(step.src_layout, Shard) and isinstance(step.dst_layout, Shard) \
                        and step.src_layout.dim == step.dst_layout.dim:
                    # A layout-preserving move (e.g. a copy between groups) keeps the pieces.
                    link([(step.src, self._dim(step.src, step.src_layout.dim)),
                          (step.out, self._dim(step.out, step.dst_layout.dim))])
        sizes: dict[int, int] = {}          # id of a class's member list -> its block count
        for key, group in group_of.items():
            if id(group) not in sizes:
                sizes[id(group)] = gcd(*(self.shape(v)[d] for v, d in group))
        self._blocks = {key: sizes[id(group)] for key, group in group_of.items()}
        return self._blocks

    def _dim(self, value: str, dim: int) -> int:
        return dim + len(self.shape(value)) if dim < 0 else dim

    def state_rows(self, name: str) -> list[int] | None:
        """Under ZeRO (``state_shares``), the rows of parameter ``name``'s first dimension each
        rank owns (its optimizer state, and its gradient in a one-stage program); None when the
        parameter is not sharded so: not trainable, not stored replicated, a scalar, or with
        fewer rows than would give every rank one."""
        if self.state_shares is None:
            return None
        value = self.graph.values[name]
        if not value.requires_grad or not isinstance(self.source_layouts.get(name, Replicate()), Replicate) \
                or not value.meta.shape:
            return None
        rows = _piece_lengths(value.meta.shape[0], self.state_shares, value.meta.shape[0])
        return list(rows) if min(rows) > 0 else None

    def lengths(self, value: str, dim: int) -> list[int]:
        """Piece lengths of ``value`` along its sharded ``dim``, one per rank."""
        dim = self._dim(value, dim)
        length = self.shape(value)[dim]
        key = (length, self.blocks().get((value, dim), length))
        # Remembered per program (keyed by the shares object it was made for): hashing the
        # shares of 256 devices for the shared cache on every call cost more than the lengths.
        if self._pieces is None or self._pieces[0] is not self.shares:
            self._pieces = (self.shares, {})
        hit = self._pieces[1].get(key)
        if hit is None:
            hit = self._pieces[1][key] = _piece_lengths(key[0], tuple(self.shares), key[1])
        return list(hit)

    def piece_bytes(self, value: str, dim: int, full_bytes: float) -> list[float]:
        """Bytes of each rank's piece of ``value`` (``full_bytes`` whole) cut along ``dim``:
        ``full_bytes * length_r / length``, remembered like :meth:`lengths` (the cost model asks
        for the same few sizes thousands of times per program, 256 ranks each)."""
        dim = self._dim(value, dim)
        length = self.shape(value)[dim]
        if length == 0:
            return [0.0] * self.world
        key = (length, self.blocks().get((value, dim), length), full_bytes)
        memo = self._pieces[1] if self._pieces is not None and self._pieces[0] is self.shares else None
        hit = memo.get(key) if memo is not None else None
        if hit is None:
            hit = tuple(full_bytes * n / length for n in self.lengths(value, dim))
            self._pieces[1][key] = hit
        return list(hit)

    def offsets(self, value: str, dim: int) -> list[int]:
        return offsets(self.lengths(value, dim))

    def local_shape(self, value: str, layout: Layout, rank: int) -> tuple[int, ...]:
        shape = list(self.shape(value))
        if isinstance(layout, Shard):
            d = self._dim(value, layout.dim)
            shape[d] = self.lengths(value, d)[rank]
        return tuple(shape)

    def invalidate(self) -> None:
        self._blocks = None
        self._pieces = None


def is_partial(layout: Layout) -> bool:
    return isinstance(layout, Partial)


@lru_cache(maxsize=4096)
def _piece_lengths(length: int, shares: tuple[float, ...], n_blocks: int) -> tuple[int, ...]:
    """:func:`shard_lengths`, remembered: the simulator and memory model ask for the same few
    (length, shares) pairs thousands of times per program."""
    return tuple(shard_lengths(length, shares, n_blocks))


def empty_ranks(program: DistProgram, step: Compute) -> list[int]:
    """Ranks whose pieces of this plain-op step are empty (every sharded dimension of a strategy
    is cut into the same blocks, so one empty piece means all are), when the op's results are
    all pieces or summands; such a rank computes zeros (``hapc.runtime.local_ops.empty_piece_result``)."""
    strat = step.strategy
    if strat.local is not None or any(isinstance(o, Replicate) for o in strat.outputs) \
            or any(isinstance(x, Partial) for x in strat.inputs) \
            or any(isinstance(x, ExpertRows) for x in strat.inputs):   # the routing sizes those pieces
        return []
    sharded = [(v, lay.dim) for v, lay in zip(step.inputs, strat.inputs) if isinstance(lay, Shard)]
    if not sharded:
        return []
    lengths = program.lengths(*sharded[0])
    return [r for r, n in enumerate(lengths) if n == 0]
