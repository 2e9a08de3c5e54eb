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


def run_device(cluster: Cluster) -> str:
    """``cuda`` when every device of the cluster is a GPU of the catalog, else ``cpu`` (CPU ranks,
    and devices described by their own numbers, as the examples' CPU stand-ins are)."""
    from costmodel.catalog import device_spec

    gpus = [device_spec(d.type) for d in cluster.devices]
    return "cuda" if all(spec is not None and spec.name != "cpu" for spec in gpus) else "cpu"


def launch_lines(cluster: Cluster, program: str, extra: str | None = None) -> list[str]:
    """``torchrun`` lines for ``program``: one for a one-node cluster, else one per node;
    ``extra`` (default: ``--device cpu|cuda --verify``, see :func:`run_device`) follows it."""
    if extra is None:
        extra = f"--device {run_device(cluster)} --verify"
    sizes = node_sizes(cluster)
    tail = f" {extra}" if extra else ""
    if len(sizes) == 1:
        return [f"torchrun --nproc_per_node={sizes[0]} {program}{tail}"]
    return [f"torchrun --nnodes={len(sizes)} --node_rank={i} --nproc_per_node={k} --master_addr=NODE0_ADDRESS "
            f"--master_port=29500 {program}{tail}   # on node {i}" for i, k in enumerate(sizes)]
