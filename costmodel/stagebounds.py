"""Lower bounds on a pipeline stage's cost on a device group, before the group has a program.

The stage planner prices a stage from its group's SPMD program (:mod:`costmodel.pipeline`),
and finding that program is an A* search plus a share LP per group: most of what a pipeline
search costs. Most groups never make it into a plan worth pricing, so the planner first prices
every group by what *any* program on it must at least cost, and synthesises a group only when
a plan that uses it could still win (:mod:`synth.stages`).

**Why these are lower bounds for every program.** A node's roofline time on a rank doing a
fraction ``f`` of its work is ``f * a + launch`` (``a``: its whole-work time without the launch;
with ``m`` micro-batches ``a / m`` for a node that depends on the batch), and in every program
the fractions of a node's work over the group's ranks sum to at least 1 (sharded pieces sum to
1; a replicated node does all of it everywhere). For weights ``w_r >= 0`` summing to 1 (here
each rank's share of the group's peak FLOPS), the slowest rank's time over a node range is at
least the weighted mean of the ranks' times, and that mean is at least, per node,
``min_r (w_r * a_r) + min_r w_r * launch``. For a homogeneous group this is the node perfectly
balanced. Collectives, the exposed gradient all-reduce and shared-parameter exchanges cost at
least nothing. The optimizer touches each trainable parameter's bytes at least once over the
group, so its step is bounded the same way. Memory: every program holds each parameter (with
its gradient and optimizer state) and keeps each activation autograd saves at least once over
the group (pieces of a sharded value sum to it), so the group's memory taken as one pool bounds
the micro-batches a range can hold in flight from above (the least room per activation byte
over the ranks is at most the pool's).

Not available (the planner then synthesises the group at once): a cluster with measured op
times (:attr:`Cluster.op_table`), whose per-op times need not be linear in the work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.cluster import Cluster
from costmodel.compute import node_seconds
from costmodel.memory import kept_outputs, optimizer_copies, saved_extra_fraction
from costmodel.pipeline import batch_dependent_values
from hapc.ir.graph import Graph

@dataclass(frozen=True)
class StageBoundProfile:
    """Prefix sums over nodes (index ``i`` = nodes ``[0, i)``) of lower bounds, per micro-batch:
    forward and backward seconds of the slowest rank; per iteration: the optimizer's seconds
    and the bytes the group must hold (parameters, gradients, optimizer state)."""

    fwd_seconds: np.ndarray
    bwd_seconds: np.ndarray
    optimizer_seconds: np.ndarray
    static_bytes: np.ndarray
    activation_bytes: np.ndarray      # one micro-batch's, summed over the group's ranks
    capacity_bytes: float

    def inflight_max(self, first: np.ndarray, stop: np.ndarray) -> np.ndarray:
        """An upper bound on the micro-batches whose activations ranges ``[first, stop)`` can
        hold next to their parameters: the group's memory as one pool (no rank holds more than
        its share of a pool that is too small); -1 where even the parameters do not fit."""
        room = self.capacity_bytes - (self.static_bytes[stop] - self.static_bytes[first])
        act = self.activation_bytes[stop] - self.activation_bytes[first]
        with np.errstate(divide="ignore", invalid="ignore"):
            count = np.where(act > 0, np.floor(room / np.where(act > 0, act, 1.0)), np.inf)
        return np.where(room < 0, -1.0, count)


def bounds_available(cluster: Cluster) -> bool:
    """Whether :class:`StageBounds` may bound groups of ``cluster`` (see the module docstring)."""
    return cluster.op_table is None


class StageBounds:
    """Lower bounds for one group (a cluster of its own, :func:`costmodel.groups.sub_cluster`),
    taken apart once per group so that each micro-batch count costs a few array operations."""

    def __init__(self, graph: Graph, group: Cluster, optimizer: str | int = "adamw") -> None:
        if not bounds_available(group):
            raise ValueError("stage bounds need roofline op times; this cluster has measured ones")
        n = len(graph.nodes)
        peaks = np.array([d.flops("fp32") for d in group.devices], dtype=float)
        weights = peaks / peaks.sum()
        launch = group.launch_latency_seconds
        kinds: dict[tuple, list[int]] = {}       # equal devices price alike: one column per kind
        for r, d in enumerate(group.devices):
            kinds.setdefault((d.type, tuple(sorted(d.peak_flops.items())), d.hbm_bandwidth_Bps), []).append(r)
        reps = [ranks[0] for ranks in kinds.values()]
        kind_weight = np.array([weights[r] for r in reps])
        self.fwd_work = np.zeros(n)      # min over ranks of w_r * a_r: forward seconds without launches
        self.bwd_work = np.zeros(n)
        self.fwd_launch = np.zeros(n)
        self.bwd_launch = np.zeros(n)
        least_weight = float(weights.min())
        for i, node in enumerate(graph.nodes):
            times = [node_seconds(node, graph, group.devices[r], group, 1.0) for r in reps]
            fwd = np.array([t.fwd_seconds for t in times])
            bwd = np.array([t.bwd_seconds for t in times])
            if fwd.max() > 0:
                self.fwd_work[i] = float((kind_weight * (fwd - launch)).min())
                self.fwd_launch[i] = least_weight * launch
            if bwd.max() > 0:
                self.bwd_work[i] = float((kind_weight * (bwd - launch)).min())
                self.bwd_launch[i] = least_weight * launch
        batch = batch_dependent_values(graph)
        self.scaled = np.array([any(o in batch for o in node.outputs) for node in graph.nodes], dtype=bool)

        # Parameters: charged to the node that reads them first, as the pricer does.
        first_use: dict[str, int] = {}
        for i, node in enumerate(graph.nodes):
            for ref in node.input_refs():
                first_use.setdefault(ref, i)
        copies = optimizer_copies(optimizer)
        accesses = 3 + 2 * copies
        hbm_Bps = np.array([d.hbm_bandwidth_Bps for d in group.devices]) * group.efficiency["hbm"]
        per_byte = float((weights * accesses / hbm_Bps).min())
        opt = np.zeros(n)
        static = np.zeros(n)
        for name in graph.params + graph.buffers:
            if name not in first_use:
                continue
            value = graph.values[name]
            nbytes = float(graph.meta(name).nbytes)
            i = first_use[name]
            if value.requires_grad:
                static[i] += nbytes * (2 + copies)
                if nbytes > 0:
                    opt[i] += nbytes * per_byte + least_weight * launch
            else:
                static[i] += nbytes
        # Activations kept for backward: every program keeps at least each one once over the
        # group (pieces of a sharded value sum to it), as the pricer counts them.
        act = np.zeros(n)
        act_fixed = np.zeros(n)
        for i, node in enumerate(graph.nodes):
            for _, out, times in kept_outputs(graph, node):
                target = act if out in batch else act_fixed
                target[i] += times * float(graph.meta(out).nbytes)
            extra = saved_extra_fraction(graph, node)
            if extra:
                target = act if node.outputs[0] in batch else act_fixed
                target[i] += extra * float(graph.meta(node.outputs[0]).nbytes)
        for name in graph.inputs:
            if name in first_use:
                act[first_use[name]] += float(graph.meta(name).nbytes)
        self.optimizer = opt
        self.static = static
        self.activations = act
        self.activations_fixed = act_fixed
        self.capacity_bytes = float(sum(d.memory_bytes for d in group.devices))

    def profile(self, microbatches: int) -> StageBoundProfile:
        m = max(1, int(microbatches))
        per = np.where(self.scaled, 1.0 / m, 1.0)

        def prefix(a: np.ndarray) -> np.ndarray:
            return np.concatenate([[0.0], np.cumsum(a)])

        return StageBoundProfile(prefix(self.fwd_work * per + self.fwd_launch),
                                 prefix(self.bwd_work * per + self.bwd_launch),
                                 prefix(self.optimizer), prefix(self.static),
                                 prefix(self.activations / m + self.activations_fixed), self.capacity_bytes)
