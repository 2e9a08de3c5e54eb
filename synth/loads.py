"""From a fixed program to the ratio LP's coefficients: time and memory per device, affine in
that device's share.

Time: a ``Compute`` whose strategy shards something costs device ``r`` (its share) x (the
whole node's time on ``r``); one that shards nothing costs the whole node on every device.
Communication, gradient synchronisation and the optimizer are taken from a simulation at
the current shares and held fixed — a first-order model the alternation with the search
corrects. Memory is measured at two share vectors and interpolated, which is exact for the
parts that scale with a device's share and for those that do not.

The coefficients are plain floats (:class:`DeviceLoads`), made without numpy: ``hapc replan``
solves its one-segment problems in closed form (:mod:`synth.waterfill`) and never pays numpy's
import (a fifth of a second on a loaded machine). :meth:`DeviceLoads.problem` gives the LP's
:class:`~synth.ratios.ShareProblem`; the arithmetic is numpy's own, operation for operation
(``_pairwise_sum`` is its summation), so the floats are those numpy computed here before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.cluster import Cluster
from costmodel.memory import program_memory
from costmodel.simcache import SimulationCache
from costmodel.simulator import SimResult
from hapc.errors import UserError
from hapc.ir.layout import Shard
from hapc.ir.program import Compute, DistProgram

if TYPE_CHECKING:
    from synth.ratios import ShareProblem


SHARE_DIGITS = 12       # significant digits of a solved share (see round_share)


def round_share(x: float) -> float:
    """A share as the ratio LP answers it (:mod:`synth.ratios`, :mod:`synth.waterfill`): to 12
    significant digits, so that every solver gives the same float whatever its last digits,
    and never ``-0.0``."""
    return float(f"{x:.{SHARE_DIGITS}g}") + 0.0


class MemoryInfeasible(UserError):
    """No shares make the program fit: ``missing_bytes`` says by how much, per device. (Here,
    without numpy, so that a replan can catch it; :mod:`synth.ratios` raises it.)"""

    def __init__(self, message: str, missing_bytes: dict[str, float]) -> None:
        self.missing_bytes = missing_bytes
        super().__init__(message)


@dataclass(frozen=True)
class DeviceLoads:
    """One segment's affine time and memory per device (index = rank): seconds
    ``a[r] * share + b[r]``, bytes ``m[r] * share + c[r]`` within ``capacity[r]``."""

    a: tuple[float, ...]
    b: tuple[float, ...]
    m: tuple[float, ...]
    c: tuple[float, ...]
    capacity: tuple[float, ...]
    device_names: tuple[str, ...]

    def problem(self) -> ShareProblem:
        """The ratio LP's problem (numpy arrays of these floats)."""
        import numpy as np

        from synth.ratios import ShareProblem

        return ShareProblem(a=np.array(self.a), b=np.array(self.b), m=np.array(self.m), c=np.array(self.c),
                            capacity=np.array(self.capacity), device_names=list(self.device_names))


def share_problem(program: DistProgram, sim: SimResult, cluster: Cluster,
                  optimizer: str | int = "adamw", cache: SimulationCache | None = None) -> ShareProblem:
    """The ratio LP's problem for ``program`` at its shares (see :func:`device_loads`)."""
    return device_loads(program, sim, cluster, optimizer, cache).problem()


def device_loads(program: DistProgram, sim: SimResult, cluster: Cluster,
                 optimizer: str | int = "adamw", cache: SimulationCache | None = None) -> DeviceLoads:
    """``program``'s per-device loads, affine in the shares, from its simulation ``sim`` at its
    own shares. ``cache`` (the simulations' :class:`SimulationCache` for this graph and cluster)
    lends its node times: the repeated layers of a transformer are priced once, not per layer."""
    # Whole-node times depend on the device alone: summed once per kind of device, then
    # spread over the ranks (the same additions, in the same order, as rank by rank).
    kind_of = list(cluster.device_kinds())
    first = {k: r for r, k in reversed(list(enumerate(kind_of)))}
    a_kind = [0.0] * len(first)
    b_kind = [0.0] * len(first)
    if cache is None or not cache.serves(program.graph, cluster):
        cache = SimulationCache(program.graph, cluster)
    nodes = cache.nodes
    kinds = [(k, r, cache.device_key(r)) for k, r in first.items()]
    for step in program.steps:
        if not isinstance(step, Compute):
            continue
        node = nodes[step.node]
        node_key = cache.node_key(node)
        sums = a_kind if any(isinstance(x, Shard) for x in step.strategy.inputs + step.strategy.outputs) else b_kind
        for k, r, device_key in kinds:
            t = cache.node_time(node, node_key, r, device_key, 1.0)
            sums[k] += t.fwd_seconds + t.bwd_seconds
    a = tuple(a_kind[k] for k in kind_of)
    b = tuple(b_kind[k] + float(comm) for k, comm in zip(kind_of, sim.comm_seconds, strict=True))
    m, c = memory_coefficients(program, sim.memory.totals,
                               lambda other: program_memory(other, cluster, optimizer).totals)
    return DeviceLoads(a, b, m, c, tuple(float(x) for x in cluster.memory_bytes()),
                       tuple(f"{d.type}#{d.index}" for d in cluster.devices))


def memory_coefficients(program: DistProgram, totals_at_shares: Sequence[float],
                        totals_of: Callable[[DistProgram], Sequence[float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Bytes per device as ``m * share + c``, from two evaluations of a memory model: at the
    program's own shares (``totals_at_shares``, already known) and ``totals_of`` the same steps
    at other shares (one step's memory, or a micro-batched step's)."""
    world = program.world
    even = 1.0 / world
    s1 = [float(x) for x in program.shares]
    # np.allclose(s1, even): |x - even| <= atol + rtol * |even|
    s2 = _tilted(world) if all(abs(x - even) <= 1e-08 + 1e-05 * abs(even) for x in s1) else [even] * world
    m2 = totals_of(with_shares(program, s2))
    m: list[float] = []
    c: list[float] = []
    for x1, x2, t1, t2 in zip(s1, s2, totals_at_shares, m2, strict=True):
        ds = x1 - x2
        slope = (float(t1) - float(t2)) / ds if abs(ds) > 1e-12 else 0.0
        slope = _non_negative(slope)
        m.append(slope)
        c.append(_non_negative(float(t1) - slope * x1))
    return tuple(m), tuple(c)


def _non_negative(x: float) -> float:
    """``np.maximum(x, 0.0)`` (which gives ``0.0``, not ``-0.0``, for a negative zero)."""
    return x if x > 0.0 else 0.0


def _tilted(world: int) -> list[float]:
    """Shares away from even for every device (odd ranks 0.8, even ranks 1.2, normalised), with
    two values only: identical devices stay in a few classes for the memory model and the LP
    (a ramp 1..world gave every device its own share, hence its own LP variable)."""
    w = [1.2 if r % 2 == 0 else 0.8 for r in range(world)]
    total = _pairwise_sum(w, 0, world)
    return [x / total for x in w]


def _pairwise_sum(values: Sequence[float], start: int, n: int) -> float:
    """``values[start:start + n]`` summed as numpy's ``sum`` of a float64 array does (pairwise,
    eight accumulators per block of up to 128), so the floats are numpy's to the last bit."""
    if n < 8:
        total = 0.0
        for i in range(start, start + n):
            total += values[i]
        return total
    if n <= 128:
        acc = list(values[start:start + 8])
        i = 8
        while i < n - n % 8:
            for j in range(8):
                acc[j] += values[start + i + j]
            i += 8
        total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
        for k in range(start + i, start + n):
            total += values[k]
        return total
    half = n // 2
    half -= half % 8
    return _pairwise_sum(values, start, half) + _pairwise_sum(values, start + half, n - half)


def with_shares(program: DistProgram, shares: Sequence[float]) -> DistProgram:
    """The same steps at other shares. Steps never depend on shares (a builder only records
    them), and neither do the block counts of sharded dimensions, so the copy takes the
    original's, found once (a union-find over every step: a fifth of a simulation). The state
    shares (ZeRO, :mod:`synth.zero`) are kept: they do not follow the work."""
    return DistProgram(program.graph, tuple(float(x) for x in shares), dict(program.source_layouts),
                       list(program.steps), program.state_shares, program.recompute, _blocks=program.blocks())


def snapped_to_blocks(program: DistProgram, shares: Sequence[float]) -> tuple[float, ...]:
    """``shares`` with every share worth less than half a block of the program's coarsest
    sharded dimension set to zero and the rest scaled up to sum to one. Rounding
    (:func:`hapc.ir.shards.largest_remainder`) gives any positive share at least one block, so
    a sliver the share LP meant as "almost nothing" becomes a whole block of work; at zero the
    device computes none. The shares unchanged when nothing is that small or all would be."""
    blocks = program.blocks()
    if not blocks:
        return tuple(shares)
    units = min(blocks.values())
    kept = [s if s * units >= 0.5 else 0.0 for s in shares]
    total = sum(kept)
    if total <= 0 or all(k == s for k, s in zip(kept, shares)):
        return tuple(shares)
    return tuple(k / total for k in kept)
