"""A plan for a changed cluster, from the old plan rather than from scratch.

When a device is lost, added or slows down, the program the search found (which op runs in
which layout, which collectives move what) does not depend on how many devices there are or
how fast each is: layouts are ``Shard``/``Replicate``/``Partial`` and the per-device part is
only the shares. So the old plan's program is still a valid program on the new cluster, and
re-balancing it is one small LP (:func:`synth.ratios.solve_shares`), not a search. ``replan``
works from ``plan.json`` alone (it holds the graph: nothing is traced) and, by effort:

* ``quick``: the old program at the LP's shares for the new devices, nothing else;
* ``search``: that, and one round of the search on the new cluster (both overlap
  assumptions, at the carried shares); the fastest of the old and the new programs is then
  re-balanced by the LP. The collectives' prices change with the world size and the nodes'
  shapes, so the old program can become a poor one: dropping one of the HAP 8-GPU cluster's
  devices left a 48-layer GPT's old program at 1182 ms/iter where a new search found 680;
* ``auto`` (default): ``search`` only if the old program at the carried shares (the survivors'
  old shares scaled by their devices' change in speed) lost more than the cluster's FLOPS
  did (as in that example), else ``quick``;
* ``full``: everything ``hapc compile`` tries, baselines included.

**Time.** ``hapc replan`` has a second. The search gets each node's strategies from the
cache the compile wrote beside plan.json (:mod:`synth.reuse`: the sharding rules would import
torch), the LP runs on ``highspy`` (:mod:`synth.lp_highspy`: not scipy.optimize), and only
the leading candidate is re-balanced, and the second overlap's search runs in a forked child
when a core is spare (:mod:`hapc.forked`), beside the old program's simulation and the first
search. A search replan simulates the
1066-node program of a 48-layer GPT four times (the old program, two searched ones, the
re-balanced winner) besides the one :meth:`Plan.load` makes: most of what is left.

Whichever simulates fastest and fits wins; a tie keeps the old program.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from costmodel.cluster import Cluster
from costmodel.simulator import SimResult, simulate
from hapc.errors import UserError
from hapc.forked import Beside
from hapc.ir.graph import Graph
from hapc.ir.program import DistProgram
from hapc.plan import Plan
from synth import lp_highspy
from synth.costs import Prices
from synth.loads import share_problem
from synth.ratios import MemoryInfeasible, solve_shares
from synth.search import SearchResult, search, to_program
from synth.space import SearchSpace

Progress = Callable[[str], None]
EFFORTS = ("auto", "quick", "search", "full")
# "auto" searches when the old program at the carried shares is slower than the old plan's time scaled
# by the change in the cluster's total FLOPS by more than this: the change hurt it beyond the
# devices' loss, so another program may win.
DEGRADED = 0.05
# Fractions of the gradient all-reduce the search assumes hidden behind backward: as in one
# round of hapc compile, both are searched and the simulator picks. Neither alone is enough:
# for a 48-layer GPT on 7 of the HAP 8-GPU devices, 0 found 680 ms/iter and 0.75 found 1313.
SEARCH_OVERLAPS = (0.0, 0.75)


@dataclass(frozen=True)
class Replanned:
    plan: Plan
    kept_program: bool             # the old program, re-balanced, won
    effort: str                    # what ran: "quick", "search" or "full" (see replan)
    seconds: float                 # wall time of the replan (loaded machines: see the report)
    old_cost_seconds: float        # the old plan's predicted iteration time on its own cluster
    carried_cost_seconds: float    # the old program on the new cluster, re-balanced when it led (inf: did not fit)


def carry_shares(old: Sequence[float], survivors: Sequence[int] | None, cluster: Cluster,
                 old_cluster: Cluster | None = None) -> tuple[float, ...]:
    """Starting shares on the new cluster: the survivors' old shares (``survivors`` gives each
    new rank's old rank), each scaled by how much its device's FLOPS changed (a slowed device
    starts with less) when ``old_cluster`` is given, renormalised; or the new devices' FLOPS
    shares when the devices are new."""
    if survivors is None or len(survivors) != cluster.world:
        return tuple(cluster.flops_shares())
    kept = np.asarray([old[r] for r in survivors], dtype=float)
    if old_cluster is not None:
        kept *= [_flops(cluster.devices[i]) / max(_flops(old_cluster.devices[r]), 1e-30)
                 for i, r in enumerate(survivors)]
    if kept.sum() <= 0:
        return tuple(cluster.flops_shares())
    return tuple(float(x) for x in kept / kept.sum())


def rebalance(program: DistProgram, shares: Sequence[float], cluster: Cluster,
              optimizer: str, start_sim: SimResult | None = None) -> tuple[DistProgram, SimResult]:
    """``program`` at the shares the LP finds best for it on ``cluster`` (or at ``shares``
    when those simulate faster), and its simulation. ``start_sim`` is ``program``'s
    simulation at ``shares`` when the caller has it. Raises MemoryInfeasible when it cannot
    fit at any shares."""
    start = DistProgram(program.graph, tuple(shares), dict(program.source_layouts), list(program.steps))
    if start_sim is None:
        start_sim = simulate(start, cluster, optimizer=optimizer)
    solution = solve_shares(share_problem(start, start_sim, cluster, optimizer), _lp_backend())
    solved = tuple(float(x) for x in np.asarray(solution.shares).reshape(-1)[:cluster.world])
    moved = DistProgram(program.graph, solved, dict(program.source_layouts), list(program.steps))
    sim = simulate(moved, cluster, optimizer=optimizer)
    if _faster(start_sim, sim):
        moved, sim = start, start_sim
    if not sim.memory.all_fit:
        raise MemoryInfeasible("the program does not fit on the new cluster", {})
    return moved, sim


@functools.cache
def _lp_backend() -> str:
    """HiGHS without importing scipy.optimize when highspy is there: that import alone is a
    third of replan's second (the shares are the same; see synth.lp_highspy)."""
    return "highspy" if lp_highspy.available() else "highs"


def _flops(device) -> float:
    return device.flops("fp32")


def _total_flops(cluster: Cluster) -> float:
    return sum(_flops(d) for d in cluster.devices)


def _faster(a: SimResult, b: SimResult) -> bool:
    """Fitting beats not fitting; then the shorter iteration."""
    if a.memory.all_fit != b.memory.all_fit:
        return a.memory.all_fit
    return a.iteration_seconds < b.iteration_seconds * (1 - 1e-9)


def searched(graph: Graph, shares: Sequence[float], cluster: Cluster, optimizer: str,
             overlap: float) -> tuple[DistProgram, SimResult, SearchResult]:
    """One A* search on the new cluster at ``shares`` (segments of repeated layers solved once)
    and its program simulated there, not yet re-balanced."""
    space = SearchSpace.build(graph, Prices(graph, cluster, tuple(shares), grad_sync_overlap=overlap))
    result = search(space)
    program = to_program(space, result, tuple(shares))
    return program, simulate(program, cluster, optimizer=optimizer), result


class _SearchRound:
    """:func:`searched` under each of ``SEARCH_OVERLAPS`` at the same shares. The overlaps after
    the first start at once in forked children when there is a spare core (see hapc.forked),
    before the caller knows whether it will want them: ``auto`` decides from a simulation of
    the old program, which then runs beside them instead of before; :meth:`cancel` stops them
    when the answer is no. What crosses the pipe is a program's steps, its simulation and the
    search's figures, not the graph."""

    def __init__(self, graph: Graph, shares: Sequence[float], cluster: Cluster, optimizer: str) -> None:
        self._args = (graph, tuple(shares), cluster, optimizer)
        self._beside = [Beside(functools.partial(self._job, overlap)) for overlap in SEARCH_OVERLAPS[1:]]

    def _job(self, overlap: float) -> tuple[list, dict, SimResult, dict[str, object]]:
        program, sim, result = searched(*self._args, overlap)
        info = {"exact": result.exact, "gap": result.gap, "segments": result.segments,
                "distinct_segments": result.distinct_segments, "states_expanded": result.states_expanded}
        return program.steps, program.source_layouts, sim, info

    def results(self) -> list[tuple[DistProgram, SimResult, dict[str, object]]]:
        """One (program, simulation, search figures) per overlap, in ``SEARCH_OVERLAPS`` order:
        the first searched here, the others collected from their children."""
        outcomes = [self._job(SEARCH_OVERLAPS[0])] + [b.result() for b in self._beside]
        graph, shares = self._args[0], self._args[1]
        return [(DistProgram(graph, shares, dict(layouts), list(steps)), sim, info)
                for steps, layouts, sim, info in outcomes]

    def cancel(self) -> None:
        for b in self._beside:
            b.cancel()


def replan(old: Plan, cluster: Cluster, *, survivors: Sequence[int] | None = None, effort: str = "auto",
           progress: Progress | None = None) -> Replanned:
    """The best plan for ``cluster`` among the old plan's program and, by ``effort``:
    ``"quick"`` nothing else; ``"search"`` one search round on the new cluster; ``"full"``
    everything ``hapc compile`` tries (every round, the baselines); ``"auto"`` (default)
    searches only when the old program at the carried shares lost more than the devices did
    (see ``DEGRADED``). The leading candidate is re-balanced by the LP."""
    if effort not in EFFORTS:
        raise ValueError(f"unknown effort {effort!r}; expected one of {', '.join(EFFORTS)}")
    say = progress or (lambda msg: None)
    started = time.perf_counter()
    optimizer = old.model.get("optimizer", "adamw")
    graph = old.graph
    shares = carry_shares(old.program.shares, survivors, cluster, old.cluster)
    # The old program at the carried shares: one simulation decides whether to search, and is a
    # candidate of its own; only the fastest candidate pays for the LP (a share problem and a
    # second simulation), as in a round of hapc compile. Simulations are most of a replan's time.
    round_ = _SearchRound(graph, shares, cluster, optimizer) if effort in ("auto", "search") else None
    kept = DistProgram(graph, shares, dict(old.program.source_layouts), list(old.program.steps))
    try:
        kept_sim = simulate(kept, cluster, optimizer=optimizer)
    except BaseException:
        if round_ is not None:
            round_.cancel()
        raise
    carried_cost = kept_sim.iteration_seconds if kept_sim.memory.all_fit else float("inf")
    say(f"the old program at the carried shares: {kept_sim.iteration_seconds * 1e3:.3f} ms/iter"
        + ("" if kept_sim.memory.all_fit else " (does not fit)") + ", shares " + "/".join(f"{x:.3f}" for x in shares))
    candidates: dict[str, tuple[DistProgram, SimResult]] = {"kept": (kept, kept_sim)}
    baselines: dict[str, float] = {}
    info: dict[str, object] = {}
    if effort == "auto":
        expected = old.cost * _total_flops(old.cluster) / _total_flops(cluster)
        effort = "search" if carried_cost > expected * (1 + DEGRADED) else "quick"
        say(f"the old program {'lost more' if effort == 'search' else 'lost no more'} than the devices did "
            f"({carried_cost * 1e3:.3f} ms/iter against {expected * 1e3:.3f} expected): "
            + ("searching" if effort == "search" else "no search"))
    if round_ is not None and effort != "search":
        round_.cancel()
    if effort == "search":
        # As one round of hapc compile: search under each overlap assumption at the same shares
        # (the strategies come from synth.reuse's cache when the CLI found one) and simulate each.
        assert round_ is not None
        best: tuple[DistProgram, SimResult] | None = None
        for overlap, (program, sim, found) in zip(SEARCH_OVERLAPS, round_.results()):
            say(f"search on the new cluster (overlap {overlap:g}): {sim.iteration_seconds * 1e3:.3f} ms/iter")
            if best is None or _faster(sim, best[1]):
                best, info = (program, sim), found
        assert best is not None
        candidates["searched"] = best
    if effort in ("quick", "search"):
        # Re-balance the fastest candidate (ties: the old program); the rest stay at the carried shares.
        lead = min(candidates, key=lambda k: (not candidates[k][1].memory.all_fit,
                                              candidates[k][1].iteration_seconds, k != "kept"))
        try:
            candidates[lead] = rebalance(candidates[lead][0], shares, cluster, optimizer, candidates[lead][1])
            say(f"the {'old' if lead == 'kept' else 'new'} program re-balanced: "
                f"{candidates[lead][1].iteration_seconds * 1e3:.3f} ms/iter, shares "
                + "/".join(f"{x:.3f}" for x in candidates[lead][0].shares))
        except MemoryInfeasible:
            say(f"the {'old' if lead == 'kept' else 'new'} program does not fit on the new cluster at any shares")
        if lead == "kept" and candidates["kept"][1].memory.all_fit:
            carried_cost = min(carried_cost, candidates["kept"][1].iteration_seconds)
    if effort == "full":
        try:
            candidates["kept"] = rebalance(kept, shares, cluster, optimizer, kept_sim)
            carried_cost = candidates["kept"][1].iteration_seconds
        except MemoryInfeasible:
            pass
        from synth.synthesize import synthesize_program

        result = synthesize_program(graph, cluster, optimizer=optimizer, progress=say)
        candidates["searched"] = (result.best.program, result.best.sim)
        baselines = {k: c.seconds for k, c in result.baselines.items()}
        if result.best.search is not None:
            s = result.best.search
            info = {"exact": s.exact, "gap": s.gap, "segments": s.segments,
                    "distinct_segments": s.distinct_segments, "states_expanded": s.states_expanded,
                    "rounds": len(result.rounds)}
    fitting = {k: v for k, v in candidates.items() if v[1].memory.all_fit}
    if not fitting:
        raise UserError(f"no plan fits in memory on the new cluster {cluster.name}".rstrip())
    # Ties keep the old program: same speed, and the user already knows it.
    chosen = min(fitting, key=lambda k: (fitting[k][1].iteration_seconds, k != "kept"))
    program, sim = fitting[chosen]
    name = old.name if chosen == "kept" else (result.best.name if effort == "full" else "hapc")
    if chosen == "kept":
        info = dict(old.search)           # the program is the old search's
    info["replan"] = {"from": old.cluster.name or f"{old.cluster.world} devices", "kept_program": chosen == "kept",
                      "effort": effort}
    plan = Plan(program, cluster, sim, name, baselines, info, dict(old.model))
    return Replanned(plan, chosen == "kept", effort, time.perf_counter() - started, old.cost, carried_cost)
