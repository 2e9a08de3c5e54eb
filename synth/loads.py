"""From a fixed program to the ratio LP's coefficients: time and memory per device, affine in
that device's share.

Time: a ``Compute`` whose strategy shards something costs device ``r`` (its share) x (the
whole node's time on ``r``); one that shards nothing costs the whole node on every device.
Communication, gradient synchronisation and the optimizer are taken from a simulation at
the current shares and held fixed — a first-order model the alternation with the search
corrects. Memory is measured at two share vectors and interpolated, which is exact for the
parts that scale with a device's share and for those that do not.
"""

from __future__ import annotations

import numpy as np

from costmodel.cluster import Cluster
from costmodel.memory import program_memory
from costmodel.simcache import SimulationCache
from costmodel.simulator import SimResult
from hapc.ir.layout import Shard
from hapc.ir.program import Compute, DistProgram
from synth.ratios import ShareProblem


def share_problem(program: DistProgram, sim: SimResult, cluster: Cluster,
                  optimizer: str | int = "adamw", cache: SimulationCache | None = None) -> ShareProblem:
    """``cache`` (the simulations' :class:`SimulationCache` for this graph and cluster) lends
    its node times: the repeated layers of a transformer are priced once, not per layer."""
    # Whole-node times depend on the device alone: summed once per kind of device, then
    # spread over the ranks (the same additions, in the same order, as rank by rank).
    kind_of = list(cluster.device_kinds())
    first = {k: r for r, k in reversed(list(enumerate(kind_of)))}
    a_kind = np.zeros(len(first))
    b_kind = np.zeros(len(first))
    if cache is None or not cache.serves(program.graph, cluster):
        cache = SimulationCache(program.graph, cluster)
    nodes = cache.nodes
    kinds = [(k, r, cache.device_key(r)) for k, r in first.items()]
    for step in program.steps:
        if not isinstance(step, Compute):
            continue
        node = nodes[step.node]
        node_key = cache.node_key(node)
        sharded = any(isinstance(x, Shard) for x in step.strategy.inputs + step.strategy.outputs)
        for k, r, device_key in kinds:
            t = cache.node_time(node, node_key, r, device_key, 1.0)
            (a_kind if sharded else b_kind)[k] += t.fwd_seconds + t.bwd_seconds
    a = a_kind[kind_of]
    b = b_kind[kind_of] + np.asarray(sim.comm_seconds)
    m, c = _memory_coefficients(program, cluster, optimizer, sim.memory.totals)
    return ShareProblem(a=a, b=b, m=m, c=c, capacity=np.asarray(cluster.memory_bytes(), dtype=float),
                        device_names=[f"{d.type}#{d.index}" for d in cluster.devices])


def _memory_coefficients(program: DistProgram, cluster: Cluster, optimizer: str | int,
                         totals_at_shares: list[float]):
    """Bytes per device as ``m * share + c``, from two evaluations of the memory model (the
    one at the program's own shares is the simulation's, ``totals_at_shares``)."""
    world = program.world
    s1 = np.asarray(program.shares, dtype=float)
    s2 = np.full(world, 1.0 / world) if not np.allclose(s1, 1.0 / world) else _tilted(world)
    m1 = np.asarray(totals_at_shares, dtype=float)
    m2 = np.asarray(program_memory(with_shares(program, s2), cluster, optimizer).totals)
    ds = s1 - s2
    m = np.where(np.abs(ds) > 1e-12, (m1 - m2) / np.where(np.abs(ds) > 1e-12, ds, 1.0), 0.0)
    m = np.maximum(m, 0.0)
    c = np.maximum(m1 - m * s1, 0.0)
    return m, c


def _tilted(world: int) -> np.ndarray:
    """Shares away from even for every device (odd ranks 0.8, even ranks 1.2, normalised), with
    two values only: identical devices stay in a few classes for the memory model and the LP
    (a ramp 1..world gave every device its own share, hence its own LP variable)."""
    w = np.where(np.arange(world) % 2 == 0, 1.2, 0.8)
    return w / w.sum()


def with_shares(program: DistProgram, shares) -> DistProgram:
    """The same steps at other shares. Steps never depend on shares (a builder only records
    them), and neither do the block counts of sharded dimensions, so the copy takes the
    original's, found once (a union-find over every step: a fifth of a simulation)."""
    return DistProgram(program.graph, tuple(float(x) for x in shares), dict(program.source_layouts),
                       list(program.steps), _blocks=program.blocks())
