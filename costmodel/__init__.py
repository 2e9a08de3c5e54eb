"""The cost model: cluster spec and catalogs, compute, collective and memory costs, and the simulator.

Where things live:

* :mod:`costmodel.catalog` — published device and link numbers;
* :mod:`costmodel.cluster` / :mod:`costmodel.cluster_file` — the :class:`Cluster` and its file format;
* :mod:`costmodel.opclass` — op classes and their efficiencies (the one place for them);
* :mod:`costmodel.compute` — roofline time of one node, the lower bound;
* :mod:`costmodel.collectives` — alpha-beta cost of every collective and variant;
* :mod:`costmodel.transfers` — which collective a layout change (and its gradient) needs;
* :mod:`costmodel.memory` — bytes per device of a program;
* :mod:`costmodel.simulator` — a program on a cluster -> time per iteration.

Only :mod:`hapc.ir` and :mod:`hapc.errors` are imported from hapc (lower layers only).
"""

from costmodel.cluster import Cluster, Device, Host, Link, load_cluster
from costmodel.collectives import best_variant, collective_seconds
from costmodel.compute import ComputeTime, lower_bound_seconds, node_seconds, roofline_seconds
from costmodel.memory import DeviceMemory, MemoryReport, program_memory
from costmodel.opclass import DEFAULT_EFFICIENCY, op_class
from costmodel.simulator import SimResult, simulate

__all__ = [
    "DEFAULT_EFFICIENCY",
    "Cluster",
    "ComputeTime",
    "Device",
    "DeviceMemory",
    "Host",
    "Link",
    "MemoryReport",
    "SimResult",
    "best_variant",
    "collective_seconds",
    "load_cluster",
    "lower_bound_seconds",
    "node_seconds",
    "op_class",
    "program_memory",
    "roofline_seconds",
    "simulate",
]
