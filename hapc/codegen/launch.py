"""The torchrun command lines that start an emitted program on a cluster's shape.

One line per node, in the cluster file's node order: node ``i`` runs ranks
``sum(sizes[:i]) .. sum(sizes[:i + 1]) - 1`` (torchrun numbers ranks node by node in
``--node_rank`` order), so each rank lands on the device the plan gave it. The emitted program
prints the same lines (it cannot import hapc) and checks the launch at start.
"""

from __future__ import annotations

from costmodel.cluster import Cluster


def node_sizes(cluster: Cluster) -> tuple[int, ...]:
    """Devices (ranks) per node, in cluster order."""
    return tuple(len(h.devices) for h in cluster.nodes)


def launch_lines(cluster: Cluster, program: str, extra: str = "--device cpu --verify") -> list[str]:
    """``torchrun`` lines for ``program``: one for a one-node cluster, else one per node."""
    sizes = node_sizes(cluster)
    tail = f" {extra}" if extra else ""
    if len(sizes) == 1:
        return [f"torchrun --nproc_per_node={sizes[0]} {program}{tail}"]
    return [f"torchrun --nnodes={len(sizes)} --node_rank={i} --nproc_per_node={k} --master_addr=NODE0_ADDRESS "
            f"--master_port=29500 {program}{tail}   # on node {i}" for i, k in enumerate(sizes)]
