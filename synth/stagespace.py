"""Where pipeline stages may sit: the device groups a stage may run on and the graph cuts it
may start at (the space :class:`synth.stages.StagePlanner` searches).

* **Groups**: a node, an equal part of one (halves, quarters on small clusters), or a run of
  identical whole nodes, each a sub-cluster of its own; stages take groups in the cluster's
  node order or the reverse (:func:`device_orders`, :func:`find_groups`).
* **Cuts**: positions between nodes of the graph where few activation bytes are live (between
  transformer blocks, say), since everything live there crosses the link (:func:`cut_candidates`).
* **Micro-batch counts**: powers of two that leave every group member a sample
  (:func:`microbatch_counts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from costmodel.cluster import Cluster
from costmodel.groups import group_key, sub_cluster
from costmodel.pipeline import graph_facts
from hapc.ir.batch import batch_size  # noqa: F401 - re-exported: its home before hapc.ir.batch
from hapc.ir.graph import Graph
from hapc.rules.expert_rows import expert_row_values

MAX_CUTS = 48            # cut candidates kept for the DP (evenly by work when there are more)
CUT_BODY = (0.05, 0.95)  # share of the work where the least live bytes between nodes is looked for


@dataclass
class Group:
    """A device group a stage may run on."""

    ranks: tuple[int, ...]
    cluster: Cluster                # the group as a cluster of its own
    key: str
    end: int                        # device position after the group (index into the order)


def group_of(cluster: Cluster, ranks: Sequence[int]) -> Group:
    """The group of the given ranks (no position in a device order)."""
    sub = sub_cluster(cluster, ranks)
    return Group(tuple(ranks), sub, group_key(sub), -1)


def device_orders(cluster: Cluster) -> list[list[list[int]]]:
    """Nodes (each a list of ranks) in cluster order and, when it differs, reversed."""
    nodes = [list(h.devices) for h in cluster.nodes]
    orders = [nodes]
    if len(nodes) > 1:
        orders.append(nodes[::-1])
    return orders


def find_groups(cluster: Cluster, nodes: list[list[int]]) -> tuple[list[int], dict[int, list[Group]]]:
    """Device positions in the order ``nodes`` and, per position, the groups that may start there."""
    flat = [r for node in nodes for r in node]
    parts = 4 if len(nodes) <= 2 else 2 if len(nodes) <= 4 else 1
    starts: list[int] = []
    node_start: list[int] = []
    pos = 0
    for node in nodes:
        node_start.append(pos)
        split = max(p for p in range(1, min(parts, len(node)) + 1) if len(node) % p == 0)
        step = len(node) // split
        starts.extend(range(pos, pos + len(node), step))
        pos += len(node)
    positions = starts + [pos]
    node_of_pos = {}
    for i, node in enumerate(nodes):
        for p in range(node_start[i], node_start[i] + len(node)):
            node_of_pos[p] = i
    out: dict[int, list[Group]] = {}
    for a in starts:
        i = node_of_pos[a]
        end_of_node = node_start[i] + len(nodes[i])
        ends = [p for p in positions if a < p <= end_of_node]
        if a == node_start[i]:       # runs of identical whole nodes
            shape = _node_shape(cluster, nodes[i])
            j = i + 1
            while j < len(nodes) and _node_shape(cluster, nodes[j]) == shape:
                ends.append(node_start[j] + len(nodes[j]))
                j += 1
        groups = []
        for b in ends:
            ranks = tuple(flat[a:b])
            sub = sub_cluster(cluster, ranks)
            groups.append(Group(ranks, sub, group_key(sub), b))
        out[a] = groups
    return positions, out


def _node_shape(cluster: Cluster, ranks: list[int]) -> str:
    return group_key(sub_cluster(cluster, ranks))


def microbatch_counts(batch: int, groups: Sequence[Group]) -> list[int]:
    """Powers of two that divide the batch and leave the smallest group a sample per member
    (a group too big for a count is left out of that count's DP)."""
    smallest = min(len(g.ranks) for g in groups)
    counts = []
    m = 1
    while m <= batch and batch // m >= smallest and m <= 64:
        if batch % m == 0:
            counts.append(m)
        m *= 2
    return counts or [1]


def cut_candidates(graph: Graph, live_bytes: np.ndarray) -> list[int]:
    """Node indices where a stage may start: 0, the end, and the positions between nodes where
    the live activation bytes are at their smallest (within 1.5x of the least found between
    5% and 95% of the work, not counting positions before the first or after the last
    parameter use), at most :data:`MAX_CUTS`."""
    n = len(graph.nodes)
    reads_param = [i for i, reads in enumerate(graph_facts(graph).refs)
                   if any(graph.values[r].kind == "param" for r in reads)]
    if len(reads_param) < 2:
        return [0, n]
    lo, hi = reads_param[0] + 1, reads_param[-1]
    inside = _inside_expert_rows(graph)
    inner = [i for i in range(lo, hi + 1) if live_bytes[i] > 0 and i not in inside]
    if not inner:
        return [0, n]
    work = np.cumsum([0.0] + [node.cost.fwd_flops + node.cost.bwd_flops + node.cost.fwd_bytes for node in graph.nodes])
    # The least is taken away from the ends: a classifier's pooled features after the last
    # block are far smaller than anything between blocks and would leave no cut in the body.
    body = [i for i in inner if CUT_BODY[0] * work[-1] <= work[i] <= CUT_BODY[1] * work[-1]] or inner
    least = min(live_bytes[i] for i in body)
    chosen = [i for i in inner if live_bytes[i] <= 1.5 * least]
    # Two cuts with nothing in between that does work are the same cut: keep the one that
    # sends less (the first on a tie).
    dedup: list[int] = []
    for i in chosen:
        if not dedup or work[i] > work[dedup[-1]]:
            dedup.append(i)
        elif live_bytes[i] < live_bytes[dedup[-1]]:
            dedup[-1] = i
    if len(dedup) > MAX_CUTS:
        targets = np.linspace(work[dedup[0]], work[dedup[-1]], MAX_CUTS)
        picks = {dedup[int(np.argmin([abs(work[i] - t) for i in dedup]))] for t in targets}
        dedup = sorted(picks | {i for i in dedup if live_bytes[i] < least})   # cheaper than any in the body
    return [0] + dedup + [n]




def _inside_expert_rows(graph: Graph) -> set[int]:
    """Positions a value that may be held as expert rows lives across (between two grouped
    matmuls of a mixture of experts): only the grouped matmuls know which rows are whose, so
    no stage can send such a value to the next (:class:`hapc.ir.layout.ExpertRows`)."""
    rows = expert_row_values(graph)
    if not rows:
        return set()
    made: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for ref in node.input_refs():
            if ref in rows:
                last[ref] = i
        for out in node.outputs:
            if out in rows:
                made[out] = i
    return {i for v, start in made.items() for i in range(start + 1, last.get(v, start) + 1)}
