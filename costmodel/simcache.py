"""What the simulator prices again and again for one graph on one cluster, remembered.

``synthesize()`` simulates eight or so programs of the same graph on the same cluster (the
baselines, a candidate per search, the warm start at new shares), and a transformer's
program repeats one block's steps per layer. The prices inside are pure functions of a few
numbers, so each is computed once and looked up after:

* a node's forward and backward roofline seconds depend on its op, its FLOPs and bytes, its
  output dtype, the fraction of it a rank holds and the device's capabilities: the 24 layers
  of a ViT share one entry per op (a measured op table prices by the op's arguments too, so
  under one a node is keyed by its own name);
* a collective's seconds depend on its kind, the variant asked for and the per-rank bytes
  (and, for an all-to-all, the two cuts of its send matrix);
* the all-reduces a local op runs inside itself depend on the op and the node;
* the lower bound depends on the graph and the cluster alone.

Every entry is the very float the uncached call returns, so a simulation with a cache gives
the same numbers, bit for bit, as one without (tests/costmodel/test_cm_simcache.py). A cache
belongs to one graph and one cluster object: :meth:`SimulationCache.serves` says whether it
may be used for a pair, and :func:`costmodel.simulator.simulate` starts a fresh one when not.
"""

from __future__ import annotations

from collections.abc import Sequence

from costmodel.cluster import Cluster
from costmodel.collectives import best_variant, collective_seconds
from costmodel.compute import ComputeTime, lower_bound_seconds, node_seconds
from costmodel.internal import internal_all_reduces
from hapc.ir.graph import DTYPE_BYTES, Graph, Node


class SimulationCache:
    """Prices for simulating programs of ``graph`` on ``cluster`` (see the module docstring).

    Make one per (graph, cluster) and pass it to every :func:`~costmodel.simulator.simulate`
    of that pair; the cluster must not be edited while the cache is in use.
    """

    def __init__(self, graph: Graph, cluster: Cluster) -> None:
        self.graph = graph
        self.cluster = cluster
        self.nodes: dict[str, Node] = {n.name: n for n in graph.nodes}
        self._node_keys: dict[str, tuple] = {}
        self._times: dict[tuple, ComputeTime] = {}
        self._collectives: dict[tuple, tuple[str, float]] = {}
        self._internal: dict[tuple, tuple[list[float], list[float]]] = {}
        self._lower_bound: float | None = None
        self._whole_bytes: dict[str, float] = {}
        self.lookups = 0          # node-time requests, for tests and profiles
        self.misses = 0           # of which priced afresh

    def serves(self, graph: Graph, cluster: Cluster) -> bool:
        return graph is self.graph and cluster is self.cluster

    # ---- compute -------------------------------------------------------------------------
    def node_key(self, node: Node) -> tuple:
        """Everything :func:`node_seconds` reads from a node: equal for repeated layers."""
        key = self._node_keys.get(node.name)
        if key is None:
            table = self.cluster.op_table
            if table is not None:
                key = ("node", node.name)       # measured times go by the op's arguments too
            else:
                c = node.cost
                dtype = self.graph.meta(node.outputs[0]).dtype if node.outputs else None
                key = (node.op, c.fwd_flops, c.bwd_flops, c.fwd_bytes, c.bwd_bytes, dtype)
            self._node_keys[node.name] = key
        return key

    def device_key(self, rank: int) -> tuple:
        """Everything :func:`node_seconds` reads from rank ``rank``'s device (its type selects
        measured op times): equal for identical devices."""
        d = self.cluster.devices[rank]
        return d.type, tuple(sorted(d.peak_flops.items())), d.hbm_bandwidth_Bps

    def node_time(self, node: Node, node_key: tuple, rank: int, device_key: tuple,
                  fraction: float) -> ComputeTime:
        """:func:`node_seconds` of ``node`` on rank ``rank``'s device (``device_key`` names its
        capabilities) at ``fraction`` of the work."""
        self.lookups += 1
        key = (node_key, fraction, device_key)
        hit = self._times.get(key)
        if hit is None:
            self.misses += 1
            hit = self._times[key] = node_seconds(node, self.graph, self.cluster.devices[rank], self.cluster,
                                                  fraction)
        return hit

    def whole_bytes(self, name: str) -> float:
        """Bytes of the whole value ``name`` (a copy ``base@...`` has its base's), as
        :func:`costmodel.transfers.local_bytes` gives a rank holding it ``Replicate``."""
        hit = self._whole_bytes.get(name)
        if hit is None:
            meta = self.graph.meta(name.split("@", 1)[0])
            hit = self._whole_bytes[name] = float(meta.numel * DTYPE_BYTES.get(meta.dtype, 4))
        return hit

    def lower_bound_seconds(self) -> float:
        if self._lower_bound is None:
            self._lower_bound = lower_bound_seconds(self.graph, self.cluster)
        return self._lower_bound

    def internal(self, local: str | None, node: Node) -> tuple[list[float], list[float]]:
        """:func:`internal_all_reduces` of a local op on a node (nothing for a plain op)."""
        if local is None:
            return _NONE
        key = (local, node.name)
        hit = self._internal.get(key)
        if hit is None:
            hit = self._internal[key] = internal_all_reduces(local, node, self.graph)
        return hit

    # ---- communication -------------------------------------------------------------------
    def best(self, kind: str, piece_bytes: Sequence[float], send_matrix=None) -> tuple[str, float]:
        """:func:`best_variant` over the whole cluster."""
        key = (kind, "auto", tuple(piece_bytes), _matrix_key(send_matrix))
        hit = self._collectives.get(key)
        if hit is None:
            hit = self._collectives[key] = best_variant(kind, piece_bytes, self.cluster,
                                                        send_matrix=send_matrix)
        return hit

    def seconds(self, kind: str, piece_bytes: Sequence[float], variant: str, send_matrix=None) -> float:
        """:func:`collective_seconds` of a named variant over the whole cluster."""
        key = (kind, variant, tuple(piece_bytes), _matrix_key(send_matrix))
        hit = self._collectives.get(key)
        if hit is None:
            hit = self._collectives[key] = (variant, collective_seconds(
                kind, piece_bytes, self.cluster, None, variant, send_matrix=send_matrix))
        return hit[1]


_NONE: tuple[list[float], list[float]] = ([], [])


def _matrix_key(send_matrix) -> tuple | None:
    if send_matrix is None:
        return None
    factors = (getattr(send_matrix, "before", None), getattr(send_matrix, "after", None),
               getattr(send_matrix, "total", None))
    if factors[0] is not None:
        return ("factors", *factors)
    return ("rows", tuple(tuple(row) for row in send_matrix))
