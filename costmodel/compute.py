"""Compute cost of one IR node on one device: a roofline, forward and backward separately.

    seconds = max(flops / (peak[dtype] * efficiency[op class]),  bytes / (hbm * efficiency["hbm"]))
              + launch latency

The FLOPs and bytes are the node's own :class:`hapc.ir.graph.Cost`, which the tracer takes
from PyTorch's ``FlopCounterMode`` for forward *and* backward (so a matmul's backward is its
two products and an elementwise op's backward is what its formula needs, not a blanket 2x).
They describe the whole, unsharded op; ``fraction`` scales them to the part one rank holds.

**Which peak.** The dtype of a node is the dtype of its first output: ``float16`` uses the
fp16 peak, ``bfloat16`` the bf16 peak, anything else the fp32 peak. fp32 products use the
TF32 peak only when the cluster says ``allow_tf32: true``: PyTorch leaves TF32 matmuls off
by default (``torch.backends.cuda.matmul.allow_tf32 = False``), and pricing fp32 at TF32
speed would make fp32 plans look 8x faster on an A100 than they run.

**Measured times win.** Where the cluster carries a per-op table measured on the device
(:mod:`costmodel.optable`, from ``hapc profile --model``) and it holds the node's signature,
its interpolated forward and backward times replace the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.cluster import Cluster, Device
from costmodel.opclass import op_class, uses_tensor_cores
from hapc.ir.graph import Graph, Node

_DTYPE_PEAK = {"float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class ComputeTime:
    """Forward and backward seconds of one node on one device."""

    fwd_seconds: float
    bwd_seconds: float

    @property
    def total_seconds(self) -> float:
        return self.fwd_seconds + self.bwd_seconds


def roofline_seconds(flops: float, nbytes: float, peak_flops: float, efficiency: float,
                     hbm_bandwidth_Bps: float, hbm_efficiency: float = 1.0,
                     launch_seconds: float = 0.0) -> float:
    """One kernel: limited by arithmetic or by memory traffic, whichever is slower, plus launch.

    No work means no kernel, so zero FLOPs and zero bytes cost nothing (not even a launch).
    """
    if flops <= 0 and nbytes <= 0:
        return 0.0
    compute = flops / (peak_flops * efficiency) if flops > 0 else 0.0
    memory = nbytes / (hbm_bandwidth_Bps * hbm_efficiency) if nbytes > 0 else 0.0
    return max(compute, memory) + launch_seconds


def peak_dtype(node: Node, graph: Graph, allow_tf32: bool = False) -> str:
    """Which catalog peak applies to ``node`` (see the module docstring)."""
    dtype = graph.meta(node.outputs[0]).dtype if node.outputs else "float32"
    peak = _DTYPE_PEAK.get(dtype, "fp32")
    if peak == "fp32" and allow_tf32 and uses_tensor_cores(op_class(node.op)):
        return "tf32"
    return peak


def node_seconds(node: Node, graph: Graph, device: Device, cluster: Cluster,
                 fraction: float = 1.0) -> ComputeTime:
    """Forward and backward time of ``node`` on ``device`` when it does ``fraction`` of the work.

    ``fraction`` = 0 (an empty shard) costs nothing; views cost nothing at any fraction.
    """
    cls = op_class(node.op)
    if cls == "view" or fraction <= 0:
        return ComputeTime(0.0, 0.0)
    table = cluster.op_table
    if table is not None and device.type == table.device:
        measured = table.lookup_seconds(node, graph, fraction)
        if measured is not None:
            return ComputeTime(*measured)
    peak = device.flops(peak_dtype(node, graph, cluster.allow_tf32))
    eff = cluster.efficiency[cls]
    hbm_eff = cluster.efficiency["hbm"]
    launch = cluster.launch_latency_seconds
    c = node.cost
    fwd = roofline_seconds(c.fwd_flops * fraction, c.fwd_bytes * fraction, peak, eff,
                           device.hbm_bandwidth_Bps, hbm_eff, launch)
    bwd = roofline_seconds(c.bwd_flops * fraction, c.bwd_bytes * fraction, peak, eff,
                           device.hbm_bandwidth_Bps, hbm_eff, launch)
    return ComputeTime(fwd, bwd)


def graph_seconds(graph: Graph, cluster: Cluster, rank: int = 0) -> ComputeTime:
    """The whole graph on one device, unsharded: the single-device reference time."""
    fwd = bwd = 0.0
    device = cluster.devices[rank]
    for node in graph.nodes:
        t = node_seconds(node, graph, device, cluster)
        fwd += t.fwd_seconds
        bwd += t.bwd_seconds
    return ComputeTime(fwd, bwd)


def lower_bound_seconds(graph: Graph, cluster: Cluster) -> float:
    """Total FLOPs over total effective cluster FLOPS: no plan under this model is faster.

    Each node's FLOPs (forward + backward) are divided by the summed effective FLOPS of all
    devices for that node's class and dtype, i.e. the node spread over the whole cluster in
    proportion to speed, with no memory traffic, launch latency or communication. The
    per-node division keeps the bound valid when efficiencies differ per class.
    """
    return _spread_seconds(graph, cluster, at_peak=False)


def peak_seconds(graph: Graph, cluster: Cluster) -> float:
    """The step's FLOPs at the cluster's summed *peak* (no efficiency factor), each node at the
    peak of its dtype: over a plan's step time, its model-FLOPs utilisation (MFU), the figure
    Megatron-LM and PaLM report (40-55% for large LLMs on A100s)."""
    return _spread_seconds(graph, cluster, at_peak=True)


def _spread_seconds(graph: Graph, cluster: Cluster, at_peak: bool) -> float:
    total = 0.0
    peak_sum: dict[str, float] = {}      # the cluster's summed peak per dtype, once each
    for node in graph.nodes:
        cls = op_class(node.op)
        flops = node.cost.fwd_flops + node.cost.bwd_flops
        if cls == "view" or flops <= 0:
            continue
        dtype = peak_dtype(node, graph, cluster.allow_tf32)
        if dtype not in peak_sum:
            peak_sum[dtype] = sum(d.flops(dtype) for d in cluster.devices)
        cluster_flops = peak_sum[dtype] * (1.0 if at_peak else cluster.efficiency[cls])
        total += flops / cluster_flops
    return total
