"""Helpers for the cost-model tests: small graphs and programs built by hand.

Kept apart from the tests so that each test reads as the numbers it checks. The data-parallel
builder here is a test aid (layouts chosen by a simple rule, never executed), not the
``dp-even`` baseline, which belongs to synth/.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from hapc.ir.graph import Cost, Graph, Node, Ref, TensorMeta, Value
from hapc.ir.layout import Layout, P, R, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute, Strategy


def custom_cluster(devices: Sequence[tuple[float, float, float]] = ((1.0, 10.0, 100.0),) * 2,
                   nodes: int = 1, bandwidth_GBps: float = 10.0, latency_us: float = 10.0,
                   network_GBps: float = 1.0, network_latency_us: float = 50.0,
                   efficiency: dict | None = None, launch_latency_us: float = 0.0) -> dict:
    """A cluster dict: ``nodes`` identical nodes, each holding ``devices`` given as
    (tflops, memory_GB, hbm_GBps), one device group per entry."""
    groups = [{"name": f"dev{t:g}", "tflops": t, "memory_GB": m, "hbm_GBps": h, "count": 1}
              for t, m, h in devices]
    out = {"nodes": [{"count": nodes, "devices": groups,
                      "intra_link": {"bandwidth_GBps": bandwidth_GBps, "latency_us": latency_us}}],
           "efficiency": efficiency or {}, "launch_latency_us": launch_latency_us}
    if nodes > 1:
        out["network"] = {"bandwidth_GBps": network_GBps, "latency_us": network_latency_us}
    return out


def chain_graph(batch: int = 8, widths: Sequence[int] = (4, 4), flops_per_layer: float = 1e9,
                dtype: str = "float32") -> Graph:
    """x[batch, w0] -> linear(w1) -> ... -> sum -> loss, with round, hand-set costs.

    Each linear has ``flops_per_layer`` forward and twice that backward (input and weight
    gradients), no memory traffic; the final sum is free. Weights are ``w{i}``.
    """
    values = {"x": Value("x", TensorMeta((batch, widths[0]), dtype), "input")}
    nodes, params = [], []
    prev = "x"
    for i, (k, n) in enumerate(pairwise(widths)):
        w, out = f"w{i}", f"y{i}"
        values[w] = Value(w, TensorMeta((n, k), dtype), "param", f"layer{i}.weight", True)
        values[out] = Value(out, TensorMeta((batch, n), dtype), "activation", requires_grad=True)
        nodes.append(Node(f"linear{i}", "aten.linear.default", (Ref(prev), Ref(w)), {}, (out,),
                          Cost(flops_per_layer, 2 * flops_per_layer, 0.0, 0.0)))
        params.append(w)
        prev = out
    values["loss"] = Value("loss", TensorMeta((), dtype), "activation", requires_grad=True)
    nodes.append(Node("sum", "aten.sum.default", (Ref(prev),), {}, ("loss",), Cost()))
    return Graph(values, nodes, ["x"], params, [], "loss")


def data_parallel(graph: Graph, shares: Sequence[float]) -> DistProgram:
    """Data parallel by a simple rule: inputs ``S(0)``, parameters and constants ``R``; an op
    reading a sharded value shards its outputs on dim 0, and scalars become ``P``."""
    source: dict[str, Layout] = {p: R for p in graph.params + graph.buffers}
    source.update({v.name: R for v in graph.values.values() if v.kind == "constant"})
    source.update({x: Shard(0) for x in graph.inputs})
    prog = DistProgram(graph, tuple(shares), source)
    layouts = dict(source)
    for node in graph.nodes:
        refs = node.input_refs()
        ins = tuple(layouts[r] for r in refs)
        batched = any(not isinstance(x, type(R)) for x in ins)
        outs: list[Layout] = []
        for o in node.outputs:
            shape = graph.meta(o).shape
            if not batched:
                outs.append(R)
            elif len(shape) == 0 or graph.meta(o).numel == 1:
                outs.append(P)
            else:
                outs.append(Shard(0))
        for o, lay in zip(node.outputs, outs):
            layouts[o] = lay
        prog.steps.append(Compute(node.name, Strategy(ins, tuple(outs)), tuple(refs)))
    return prog


def zero3(graph: Graph, shares: Sequence[float]) -> DistProgram:
    """Data parallel with every parameter stored sharded on dim 0 and gathered before use."""
    prog = data_parallel(graph, shares)
    steps = []
    for step in prog.steps:
        if isinstance(step, Compute):
            inputs = list(step.inputs)
            for j, name in enumerate(inputs):
                if name in graph.params:
                    out = f"{name}@full"
                    if not any(isinstance(s, Redistribute) and s.out == out for s in steps):
                        steps.append(Redistribute(name, out, Shard(0), R))
                    inputs[j] = out
            step = Compute(step.node, step.strategy, tuple(inputs))
        steps.append(step)
    prog.steps = steps
    for p in graph.params:
        prog.source_layouts[p] = Shard(0)
    prog.invalidate()
    return prog
