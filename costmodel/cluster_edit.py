"""A cluster after something changed: a device lost, a device slower than its spec.

``hapc replan --drop RANK`` and ``--slow RANK=FACTOR`` describe the change against the old
plan's cluster rather than asking for a new file; these functions derive the new cluster.
Ranks are renumbered node by node as the cluster-file order gives them (rank ``i`` of the new
program runs on ``new.devices[i]``), and :func:`surviving_ranks` says which old rank each new
one was, so that a plan's per-device shares carry over.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from costmodel.cluster import Cluster, Host
from hapc.errors import UserError


def without_devices(cluster: Cluster, ranks: Iterable[int]) -> Cluster:
    """``cluster`` with the devices at ``ranks`` removed (a node left empty goes too)."""
    drop = set(ranks)
    for r in sorted(drop):
        if not 0 <= r < cluster.world:
            raise UserError(f"--drop {r}: the cluster has ranks 0..{cluster.world - 1}")
    if len(drop) >= cluster.world:
        raise UserError("--drop: that would leave no device")
    new_rank = {d.index: i for i, d in enumerate(d for d in cluster.devices if d.index not in drop)}
    devices, nodes = [], []
    for host in cluster.nodes:
        kept = [r for r in host.devices if r in new_rank]
        if not kept:
            continue
        node = len(nodes)
        nodes.append(Host(node, tuple(new_rank[r] for r in kept), host.intra_link))
        devices += [replace(cluster.devices[r], index=new_rank[r], node=node) for r in kept]
    name = f"{cluster.name}-without-" + "-".join(map(str, sorted(drop))) if cluster.name else ""
    return replace(cluster, devices=devices, nodes=nodes, name=name, source="")


def slowed(cluster: Cluster, factors: Mapping[int, float]) -> Cluster:
    """``cluster`` with device ``rank`` ``factor`` times slower (compute and memory bandwidth)
    for each entry of ``factors``: a throttled or shared GPU, a straggler."""
    devices = list(cluster.devices)
    for rank, factor in sorted(factors.items()):
        if not 0 <= rank < cluster.world:
            raise UserError(f"--slow {rank}={factor:g}: the cluster has ranks 0..{cluster.world - 1}")
        if not factor > 0:
            raise UserError(f"--slow {rank}={factor:g}: the factor must be positive (2 = half as fast)")
        d = devices[rank]
        devices[rank] = replace(d, peak_flops={k: v / factor for k, v in d.peak_flops.items()},
                                hbm_bandwidth_Bps=d.hbm_bandwidth_Bps / factor)
    return replace(cluster, devices=devices, source="")


def surviving_ranks(world: int, dropped: Iterable[int]) -> list[int]:
    """Old rank of each new rank after ``dropped`` left a world of ``world``."""
    gone = set(dropped)
    return [r for r in range(world) if r not in gone]
