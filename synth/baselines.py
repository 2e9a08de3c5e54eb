"""The standard strategies a user would pick by hand, as programs in the same representation,
so every synthesized plan is scored against them by the same cost model.

* ``dp-even``     — data parallelism, equal batch shares (PyTorch DDP);
* ``dp-flops``    — data parallelism, batch shares proportional to each device's peak FLOPS;
* ``zero3``       — data parallelism with every parameter stored sharded and gathered before
  use (ZeRO-3 / FSDP), equal shares;
* ``megatron-tp`` — tensor parallelism over all devices with the batch replicated, equal
  shares: the best such program our search finds (at least as fast as Megatron's fixed
  column/row/vocabulary-parallel pattern under the same cost model). Megatron across nodes
  usually adds data parallelism between nodes; with one device group we model TP over all
  devices, which is what one flat group allows.
"""

from __future__ import annotations

from collections.abc import Sequence

from costmodel.cluster import Cluster
from hapc.ir.batch import batch_values
from hapc.ir.graph import Graph
from hapc.ir.layout import Layout, Replicate, Shard
from hapc.ir.program import DistProgram
from hapc.ir.shards import storage_dim
from synth.builder import greedy_score, propagate
from synth.costs import Prices
from synth.loads import with_shares
from synth.search import search, to_program
from synth.space import SearchSpace

BASELINES = ("dp-even", "dp-flops", "megatron-tp", "zero3")


def even_shares(world: int) -> tuple[float, ...]:
    return tuple(1.0 / world for _ in range(world))


def _batch_sharded(graph: Graph, world: int) -> dict[str, Layout]:
    """Inputs split along the batch, as DDP splits them: only a batch with a sample for every
    device (DDP cannot give a rank an empty batch; the search does not either)."""
    return {name: Shard(0) for name in graph.inputs
            if graph.meta(name).shape and graph.meta(name).shape[0] >= max(2, world)}


def baseline_program(name: str, graph: Graph, cluster: Cluster) -> DistProgram:
    world = cluster.world
    if name in ("dp-even", "dp-flops"):
        shares = even_shares(world) if name == "dp-even" else cluster.flops_shares()
        score, situation = _data_parallel_score(graph)
        return propagate(graph, shares, _batch_sharded(graph, world), score=score, situation=situation)
    if name == "zero3":
        layouts: dict[str, Layout] = dict(_batch_sharded(graph, world))
        for p in graph.params:
            d = storage_dim(graph.meta(p).shape)
            if d is not None and graph.values[p].requires_grad and graph.meta(p).shape[d] >= world:
                layouts[p] = Shard(d)
        return propagate(graph, even_shares(world), layouts, score=_gather_params_score,
                         situation=_gather_params_situation)
    if name == "megatron-tp":
        shares = even_shares(world)
        space = SearchSpace.build(graph, Prices(graph, cluster, shares), free_layouts=(Replicate(),))
        return to_program(space, search(space), shares)
    raise ValueError(f"unknown baseline {name!r}; expected one of {', '.join(BASELINES)}")


def baseline_programs(names: Sequence[str], graph: Graph, cluster: Cluster) -> dict[str, DistProgram]:
    """:func:`baseline_program` for each of ``names``; ``dp-even`` and ``dp-flops`` are the
    same steps at other shares (propagation does not look at shares), so data parallelism
    is propagated once."""
    out: dict[str, DistProgram] = {}
    for name in names:
        other = {"dp-even": "dp-flops", "dp-flops": "dp-even"}.get(name)
        if other in out:
            shares = even_shares(cluster.world) if name == "dp-even" else tuple(cluster.flops_shares())
            out[name] = with_shares(out[other], shares)
        else:
            out[name] = baseline_program(name, graph, cluster)
    return out


def _data_parallel_score(graph: Graph):
    """Data parallelism as DDP runs it: what does not depend on the batch is computed whole on
    every rank. Greedy propagation alone would shard, say, the position ids of a GPT (less work
    per rank) and pay a reduce-scatter where their embedding meets the batch; no hand-written
    data-parallel program does that, and the baseline must be the one users would write.

    Returns the score and its situation for :func:`propagate`: whether the node's results
    depend on the batch."""
    batch = batch_values(graph)

    def on_batch(node) -> bool:
        return any(o in batch for o in node.outputs)

    def score(node, strategy, builder) -> float:
        base = greedy_score(node, strategy, builder)
        if on_batch(node):
            return base
        return base + (0.0 if all(isinstance(o, Replicate) for o in strategy.outputs) else 1.0)

    return score, lambda node, builder: on_batch(node)


def _gather_params_situation(node, builder) -> tuple[bool, ...]:
    """What :func:`_gather_params_score` reads besides layouts: which inputs are parameters."""
    return tuple(builder.graph.values[v].kind == "param" for v in builder.refs(node))


def _gather_params_score(node, strategy, builder) -> float:
    """ZeRO-3 computes like data parallelism: parameters are gathered whole, never sharded."""
    from synth.builder import redistribution_penalty

    cost = 0.0
    for value, lay in zip(builder.refs(node), strategy.inputs):
        if builder.graph.values[value].kind == "param":
            cost += 0.0 if isinstance(lay, Replicate) else 10.0
        else:
            cost += redistribution_penalty(builder.layouts_of(value), lay)
    return cost - (0.05 if any(isinstance(o, Shard) for o in strategy.outputs) else 0.0)
