"""Device groups: the part of a cluster one pipeline stage runs on, as a cluster of its own.

A pipeline stage runs an ordinary SPMD program on its group, so the group is priced exactly as
a whole cluster is: :func:`sub_cluster` renumbers the group's ranks from 0 and keeps only the
nodes (and links) it touches. Everything downstream (the A* search, the LP, the simulator)
then works on the group unchanged.

Between two groups, activations and their gradients cross one link: the node's own link when
both groups sit on the same node, the network otherwise (:func:`link_between`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

from costmodel.cluster import Cluster, Host, Link


def sub_cluster(cluster: Cluster, ranks: Sequence[int]) -> Cluster:
    """The cluster made of ``ranks`` only (in the given order), renumbered 0..len-1.

    Nodes keep their relative order and links; a node that contributes one device keeps its
    link too (harmless: a one-rank node never uses it). The network stays when the group
    spans two or more nodes.
    """
    ranks = list(ranks)
    if not ranks or len(set(ranks)) != len(ranks):
        raise ValueError(f"a device group needs distinct ranks, got {ranks}")
    node_order: list[int] = []
    for r in ranks:
        n = cluster.node_of(r)
        if n not in node_order:
            node_order.append(n)
    new_node = {n: i for i, n in enumerate(node_order)}
    devices = [replace(cluster.devices[r], index=i, node=new_node[cluster.node_of(r)]) for i, r in enumerate(ranks)]
    hosts = [Host(i, tuple(j for j, r in enumerate(ranks) if cluster.node_of(r) == n), cluster.nodes[n].intra_link)
             for i, n in enumerate(node_order)]
    network = cluster.network if len(node_order) > 1 else None
    name = f"{cluster.name or 'cluster'}[{ranks[0]}..{ranks[-1]}]" if ranks == list(range(ranks[0], ranks[-1] + 1)) \
        else f"{cluster.name or 'cluster'}{ranks}"
    return replace(cluster, devices=devices, nodes=hosts, network=network, name=name, source="")


def group_key(cluster: Cluster) -> str:
    """A key equal for groups that price alike (same devices, links and node shape in order),
    wherever they sit in the cluster: the stage planner synthesises each key once."""
    d = cluster.to_dict()
    d.pop("name", None)
    return json.dumps(d, sort_keys=True)


def link_between(cluster: Cluster, a: Sequence[int], b: Sequence[int]) -> Link | None:
    """The link activations cross from group ``a`` to group ``b``: the shared node's link when
    both groups are on one node, else the network (None for a group talking to itself)."""
    nodes_a = {cluster.node_of(r) for r in a}
    nodes_b = {cluster.node_of(r) for r in b}
    if set(a) == set(b):
        return None
    if len(nodes_a) == 1 and nodes_a == nodes_b:
        return cluster.nodes[next(iter(nodes_a))].intra_link
    return cluster.network
