"""Prices of the search's moves, from the cost model, cached.

The search adds up, for every node, the time of its chosen strategy (the slowest rank's
forward + backward roofline for the share it holds) and of every layout change its inputs
need (the forward collective plus its autograd dual, run with the forward's variant). Parameters add the price of keeping
their gradient consistent: an all-reduce for a replicated one (scaled by ``overlap``, the part
of it that does *not* hide behind backward compute), nothing for a sharded one.

Prices depend only on shapes, dtypes, layouts and shares, so they are cached by those:
the twelfth transformer layer costs nothing to price.

Pieces follow :func:`hapc.ir.shards.shard_lengths` of the sharded dimension on its own (the
block coupling between dimensions is a program-wide detail the final simulation accounts for).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from costmodel.cluster import Cluster
from costmodel.collectives import best_variant, collective_seconds, dual_variant
from costmodel.compute import node_seconds
from costmodel.internal import internal_all_reduces
from hapc.ir.graph import DTYPE_BYTES, Graph, Node, TensorMeta
from hapc.ir.layout import Layout, Partial, Replicate, Shard, reachable
from hapc.ir.program import Strategy
from hapc.ir.shards import shard_lengths


@dataclass(frozen=True)
class MovePrice:
    seconds: float
    fwd_kind: str        # collective kind, "local" or "none"
    fwd_variant: str


class Prices:
    """Cached prices for one cluster and one share vector."""

    def __init__(self, graph: Graph, cluster: Cluster, shares: Sequence[float], *,
                 grad_sync_overlap: float = 0.5) -> None:
        self.graph = graph
        self.cluster = cluster
        self.shares = tuple(float(s) for s in shares)
        self.world = len(self.shares)
        self.overlap = grad_sync_overlap
        self._compute: dict[tuple, float] = {}
        self._moves: dict[tuple, MovePrice] = {}
        self._grad_sync: dict[TensorMeta, float] = {}     # the one price that depends on the overlap
        # What a search derives from this graph and these layout-change prices alone (value
        # signatures, conversion tables; see synth.moves.MoveTables), kept for the next search
        # at the same prices: with_overlap twins share it.
        self.search_memos: dict[str, object] = {}
        self._lengths_known: dict[int, tuple[int, ...]] = {}   # a dict, not a cycle through lru_cache
        # Devices with the same capabilities compute alike: price each kind once, not each of
        # hundreds of ranks (a 256-GPU cluster has two kinds).
        kinds = [(d.type, tuple(sorted(d.peak_flops.items())), d.hbm_bandwidth_Bps) for d in cluster.devices]
        self._device_kinds = kinds
        self._kind_device: dict[tuple, object] = {}
        for kind, device in zip(kinds, cluster.devices):
            self._kind_device.setdefault(kind, device)

    def with_overlap(self, grad_sync_overlap: float) -> Prices:
        """These prices under another overlap assumption. Only gradient synchronisation depends
        on it, so compute and layout-change prices are shared (the outer loop searches each
        share vector under several overlaps: the second search prices nothing again)."""
        twin = object.__new__(Prices)
        twin.__dict__.update(self.__dict__)
        twin.overlap = grad_sync_overlap
        twin._grad_sync = {}
        return twin

    # ---- compute -------------------------------------------------------------------------
    def fractions(self, length: int | None) -> tuple[float, ...]:
        """Share of the work per rank when a dimension of ``length`` is split (None: whole)."""
        if length is None:
            return (1.0,) * self.world
        return tuple(n / length for n in self._lengths(length))

    def _lengths(self, length: int) -> tuple[int, ...]:
        hit = self._lengths_known.get(length)
        if hit is None:
            hit = self._lengths_known[length] = tuple(shard_lengths(length, self.shares))
        return hit

    def compute_seconds(self, node: Node, strategy: Strategy, key: tuple) -> float:
        """Slowest rank's forward + backward seconds for ``node`` under ``strategy``.

        ``key`` identifies the node's cost signature (equal for repeated layers).
        """
        length = sharded_length(self.graph, node, strategy)
        ck = (key, length, strategy.local)
        hit = self._compute.get(ck)
        if hit is not None:
            return hit
        worst = 0.0
        for kind, f in set(zip(self._device_kinds, self.fractions(length))):    # not per device
            t = node_seconds(node, self.graph, self._kind_device[kind], self.cluster, f)
            worst = max(worst, t.fwd_seconds + t.bwd_seconds)
        if self.world > 1:            # all-reduces the local op runs inside itself
            fwd, bwd = internal_all_reduces(strategy.local, node, self.graph)
            worst += sum(self._collective("all_reduce", [b] * self.world)[1] for b in fwd + bwd)
        self._compute[ck] = worst
        return worst

    def node_lower_bound(self, node: Node, key: tuple) -> float:
        """No strategy of ``node`` beats its work spread over all ranks in proportion to speed."""
        ck = (key, "lb")
        hit = self._compute.get(ck)
        if hit is None:
            rate = 0.0
            per_kind = {}
            for kind in self._device_kinds:       # summed rank by rank, priced kind by kind
                total = per_kind.get(kind)
                if total is None:
                    t = node_seconds(node, self.graph, self._kind_device[kind], self.cluster, 1.0)
                    total = per_kind[kind] = t.fwd_seconds + t.bwd_seconds
                rate += 1.0 / total if total > 0 else 0.0
            hit = 1.0 / rate if rate > 0 else 0.0
            self._compute[ck] = hit
        return hit

    # ---- layout changes ------------------------------------------------------------------
    def move(self, meta: TensorMeta, needs_grad: bool, src: Layout, dst: Layout) -> MovePrice:
        """Forward collective + backward dual for turning ``src`` into ``dst``."""
        key = (meta, needs_grad, src, dst)
        hit = self._moves.get(key)
        if hit is None:
            hit = self._price_move(meta, needs_grad, src, dst)
            self._moves[key] = hit
        return hit

    def _pieces(self, meta: TensorMeta, layout: Layout) -> list[float]:
        full = float(meta.numel * DTYPE_BYTES.get(meta.dtype, 4))
        if not isinstance(layout, Shard):
            return [full] * self.world
        length = meta.shape[layout.dim]
        return [full * n / length for n in self._lengths(length)]

    def _collective(self, kind: str, pieces: list[float]) -> tuple[str, float]:
        return best_variant(kind, pieces, self.cluster)

    def _price_move(self, meta: TensorMeta, needs_grad: bool, src: Layout, dst: Layout) -> MovePrice:
        if src == dst:
            return MovePrice(0.0, "none", "")
        if not reachable(src, dst):
            return MovePrice(math.inf, "none", "")
        fwd_kind, back_kind = transfer_kinds(src, dst)
        seconds, variant = 0.0, ""
        if fwd_kind not in ("local", "none"):
            pieces = self._pieces(meta, dst if fwd_kind == "reduce_scatter" else src)
            variant, seconds = self._collective(fwd_kind, pieces)
        if needs_grad and back_kind not in ("local", "none"):
            pieces = self._pieces(meta, src if back_kind == "reduce_scatter" else dst)
            seconds += self._dual(back_kind, pieces, variant)
        if fwd_kind == "local":
            seconds += self._local_write_seconds(meta)
        return MovePrice(seconds, fwd_kind, variant)

    def _dual(self, kind: str, pieces: list[float], forward_variant: str) -> float:
        """The backward collective, run with its forward's variant as the emitted autograd dual
        runs it (and the simulator prices it); the cheapest one where that has no such form."""
        variant = dual_variant(kind, forward_variant)
        if variant == "auto":
            return self._collective(kind, pieces)[1]
        return collective_seconds(kind, pieces, self.cluster, None, variant)

    def _local_write_seconds(self, meta: TensorMeta) -> float:
        nbytes = meta.numel * DTYPE_BYTES.get(meta.dtype, 4)
        return max(nbytes / d.hbm_bandwidth_Bps for d in self.cluster.devices)

    def factor_gather_seconds(self, x: TensorMeta, x_layout: Layout, y: TensorMeta, y_layout: Layout) -> float:
        """Sufficient factor broadcasting: gather the input and the output gradient pieces."""
        key = (x, x_layout, y, y_layout, "sfb")
        hit = self._moves.get(key)
        if hit is None:
            t = self._collective("all_gather", self._pieces(x, x_layout))[1]
            t += self._collective("all_gather", self._pieces(y, y_layout))[1]
            hit = MovePrice(t, "all_gather", "")
            self._moves[key] = hit
        return hit.seconds

    def grad_sync_seconds(self, meta: TensorMeta) -> float:
        """Exposed part of the all-reduce that keeps a replicated parameter's gradient whole."""
        hit = self._grad_sync.get(meta)
        if hit is None:
            _, t = self._collective("all_reduce", self._pieces(meta, Replicate()))
            hit = self._grad_sync[meta] = t * (1.0 - self.overlap)
        return hit


def transfer_kinds(src: Layout, dst: Layout) -> tuple[str, str]:
    """(forward, backward) collective kinds of a layout change; see costmodel.transfers."""
    if src == dst:
        return "none", "none"
    if isinstance(src, Shard) and isinstance(dst, Replicate):
        return "all_gather", "reduce_scatter"
    if isinstance(src, Partial) and isinstance(dst, Replicate):
        return "all_reduce", "all_reduce"
    if isinstance(src, Partial) and isinstance(dst, Shard):
        return "reduce_scatter", "all_gather"
    if isinstance(src, Shard) and isinstance(dst, Shard):
        return "all_to_all", "all_to_all"
    if isinstance(src, Replicate) and isinstance(dst, Shard):
        return "none", "local"
    if isinstance(src, Shard) and isinstance(dst, Partial):
        return "local", "none"
    if isinstance(src, Replicate) and isinstance(dst, Partial):
        return "none", "none"
    raise ValueError(f"no transfer {src} -> {dst}")


def sharded_length(graph: Graph, node: Node, strategy: Strategy) -> int | None:
    """Length of the dimension a strategy splits (all its sharded dims are split alike)."""
    for name, lay in zip(node.outputs, strategy.outputs):
        if isinstance(lay, Shard):
            return graph.meta(name).shape[lay.dim]
    for name, lay in zip(node.input_refs(), strategy.inputs):
        if isinstance(lay, Shard):
            return graph.meta(name).shape[lay.dim]
    return None
