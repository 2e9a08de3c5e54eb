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
torch), the re-balance's LP is solved in closed form (:mod:`synth.waterfill`: one segment
is water-filling; the LP itself, on ``highspy``, only where that cannot settle it), so a
replan imports no numpy, and only the leading candidate is re-balanced. Simulations of the
1066-node program of a 48-layer GPT are most of what is left, so a replan avoids them where
a cheaper fact decides:

* the old program's collectives alone (:mod:`costmodel.comm_floor`, no timeline) often
  settle both ``auto``'s question and whether it could beat a searched program; it is then
  never simulated (dropping one of HAP's 8 devices: a floor of 1123 ms against 745 expected
  and 681 searched);
* both overlaps' searches run one after the other in a forked child when a core is spare
  (:mod:`hapc.process.fork`), each program sent back as soon as it is simulated, with the
  figures ranking and the LP read (:class:`Figures`: not the timeline). Meanwhile this
  process prepares the writing of the plan (``while_searching``) and then re-balances the
  first search's program, which usually leads, while the child makes the second;
* whether a program fits is asked only of one that could win on time, and a searched
  program that cannot lead comes back from the child as its time only;
* the cyclic garbage collector is paused (:func:`hapc.process.collector.gc_paused`), and the
  searches after the first share its prices (only the gradient all-reduce's depends on the
  overlap: :meth:`synth.costs.Prices.with_overlap`);
* the CLI checks the strategy cache against plan.json's SHA-256 rather than by hashing the
  graph again (:mod:`synth.reuse`), and hashes the graph for the new plan.json and imports
  the program emitter while it would otherwise wait for the child (``while_searching``).

That search replan runs two searches and three simulations (both searches' programs in the
child, the re-balanced winner here), against four before the floor; plan.json is the same
either way, and the same with ``HAPC_SERIAL=1`` (no child).

Whichever simulates fastest and fits wins; a tie keeps the old program.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from costmodel.cluster import Cluster
from costmodel.comm_floor import blocking_comm_floor_seconds
from costmodel.simcache import SimulationCache
from costmodel.simulator import SimResult, ahead, simulate
from hapc.errors import UserError
from hapc.process.fork import BesideEach
from hapc.ir.graph import Graph
from hapc.ir.program import DistProgram
from hapc.plan.plan import Plan
from synth.costs import Prices
from hapc.process.collector import gc_paused
from synth.loads import MemoryInfeasible, device_loads, with_shares
from synth.search import SearchResult, search, to_program
from synth.space import SearchSpace
from synth.waterfill import fill_shares

if TYPE_CHECKING:
    from costmodel.memory import MemoryReport

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
    old_cost_seconds: float        # the old plan's predicted iteration time on its own cluster (as plan.json recorded it)
    carried_cost_seconds: float    # the old program on the new cluster, re-balanced when it led (inf: did not fit)
    carried_cost_is_floor: bool = False  # not simulated: carried_cost_seconds is its collectives' floor
    simulations: int = 0           # of whole programs, by this replan (children's included, the full effort's not)
    searches: int = 0              # A* searches of the whole graph
    share_lps: int = 0             # share LPs solved (one per re-balance)


def carry_shares(old: Sequence[float], survivors: Sequence[int] | None, cluster: Cluster,
                 old_cluster: Cluster | None = None) -> tuple[float, ...]:
    """Starting shares on the new cluster: the survivors' old shares (``survivors`` gives each
    new rank's old rank), each scaled by how much its device's FLOPS changed (a slowed device
    starts with less) when ``old_cluster`` is given, renormalised; or the new devices' FLOPS
    shares when the devices are new. Plain floats: a replan imports no numpy (see :func:`rebalance`)."""
    if survivors is None or len(survivors) != cluster.world:
        return tuple(cluster.flops_shares())
    kept = [float(old[r]) for r in survivors]
    if old_cluster is not None:
        kept = [x * (_flops(cluster.devices[i]) / max(_flops(old_cluster.devices[r]), 1e-30))
                for i, (x, r) in enumerate(zip(kept, survivors))]
    total = 0.0
    for x in kept:          # left to right (sum() compensates from Python 3.12 on)
        total += x
    if total <= 0:
        return tuple(cluster.flops_shares())
    return tuple(x / total for x in kept)


@functools.cache
def _lp_tools():
    """The ratio LP, for the re-balances the closed form does not settle
    (:func:`synth.waterfill.fill_shares`: a share at a 12-digit rounding boundary, say):
    imported on first use, since ``synth.ratios`` and HiGHS bring numpy, a fifth of a second
    of imports that most replans never make. Returns ``(solve_shares, LP backend)``; the backend is HiGHS through
    ``highspy`` when it is there, not through scipy.optimize, whose import alone is a third of
    replan's second (the shares are the same; see synth.lp_highspy)."""
    from synth import lp_highspy
    from synth.ratios import solve_shares

    return solve_shares, "highspy" if lp_highspy.available() else "highs"


def rebalance(program: DistProgram, shares: Sequence[float], cluster: Cluster,
              optimizer: str, start_sim: SimResult | Figures | None = None
              ) -> tuple[DistProgram, SimResult | Figures]:
    """``program`` at the shares the LP finds best for it on ``cluster`` (or at ``shares``
    when those simulate faster), and its simulation (``start_sim`` when ``shares`` won).
    ``start_sim`` is ``program``'s simulation at ``shares``, or its :class:`Figures`, when
    the caller has it. Raises MemoryInfeasible when it cannot fit at any shares."""
    start = with_shares(program, shares)
    if start_sim is None:
        start_sim = _simulate(start, cluster, optimizer)
    loads = device_loads(start, start_sim, cluster, optimizer, cache=_prices(program.graph, cluster))
    solved = fill_shares(loads)
    if solved is None:          # the closed form cannot tell: the LP decides
        solve_shares, backend = _lp_tools()
        solution = solve_shares(loads.problem(), backend)
        solved = solution.device_shares(cluster.world)
    moved = with_shares(program, solved)
    sim: SimResult | Figures = _simulate(moved, cluster, optimizer)
    if _faster(start_sim, sim):
        moved, sim = start, start_sim
    if not sim.memory.all_fit:
        raise MemoryInfeasible("the program does not fit on the new cluster", {})
    return moved, sim


@dataclass(frozen=True)
class Figures:
    """What ranking and re-balancing a program read of its simulation: the time, each device's
    communication and the memory report, without the timeline. A search child sends these
    back (a whole ``SimResult`` pickles to twice the program's size and is slow to read)."""

    iteration_seconds: float
    comm_seconds: list[float]
    memory: MemoryReport

    @staticmethod
    def of(sim: SimResult) -> Figures:
        return Figures(sim.iteration_seconds, list(sim.comm_seconds), sim.memory)


# The prices of the last (graph, cluster) simulated: a replan's simulations and re-balances
# share one graph and one cluster, so they share node times and collective prices
# (costmodel.simcache: the same floats, bit for bit).
_PRICES: list[SimulationCache] = []


def _prices(graph: Graph, cluster: Cluster) -> SimulationCache:
    if not (_PRICES and _PRICES[0].serves(graph, cluster)):
        _PRICES[:] = [SimulationCache(graph, cluster)]
    return _PRICES[0]


def _simulate(program: DistProgram, cluster: Cluster, optimizer: str) -> SimResult:
    return simulate(program, cluster, optimizer=optimizer, cache=_prices(program.graph, cluster))


def _flops(device) -> float:
    return device.flops("fp32")


def _total_flops(cluster: Cluster) -> float:
    return sum(_flops(d) for d in cluster.devices)


def _faster(a: SimResult | Figures, b: SimResult | Figures) -> bool:
    """Fitting beats not fitting; then the shorter iteration."""
    if a.memory.all_fit != b.memory.all_fit:
        return a.memory.all_fit
    return a.iteration_seconds < b.iteration_seconds * (1 - 1e-9)


def searched(graph: Graph, shares: Sequence[float], cluster: Cluster, optimizer: str,
             overlap: float, prices: Prices | None = None) -> tuple[DistProgram, SimResult, SearchResult]:
    """One A* search on the new cluster at ``shares`` (segments of repeated layers solved once)
    and its program simulated there, not yet re-balanced. ``prices``, when given, are those
    of ``graph``, ``cluster`` and ``shares`` under ``overlap`` (see :class:`_SearchRound`)."""
    if prices is None:
        prices = Prices(graph, cluster, tuple(shares), grad_sync_overlap=overlap)
    space = SearchSpace.build(graph, prices)
    result = search(space)
    program = to_program(space, result, tuple(shares))
    return program, _simulate(program, cluster, optimizer), result


@dataclass
class _Candidate:
    """A program competing to be the new plan, with its simulation at the carried shares: in
    full, or its :class:`Figures` (from a search child, or a re-balance that kept the carried
    shares), which are all that ranking and re-balancing read. ``simulate_here`` makes the
    full simulation (the timeline) for the one that becomes the plan, if it has only figures."""

    name: str                       # "kept" (the old program) or "searched"
    program: DistProgram
    sim: SimResult | Figures
    info: dict[str, object] | None = None
    simulate_here: Callable[[DistProgram], SimResult] | None = field(default=None, repr=False)

    @property
    def seconds(self) -> float:
        return self.sim.iteration_seconds

    @property
    def fits(self) -> bool:
        """Whether it fits (the memory model: made on first use for a full simulation, so a
        program that loses on time alone never pays for it; see costmodel.simulator.ahead)."""
        return self.sim.memory.all_fit

    def simulation(self) -> SimResult:
        """The full simulation (timeline, memory), made here the first time for a program
        known by its figures only."""
        if not isinstance(self.sim, SimResult):
            assert self.simulate_here is not None
            self.sim = self.simulate_here(self.program)
        return self.sim


def _first(candidates: Sequence[_Candidate]) -> _Candidate:
    """The fastest candidate that fits (ties: the old program, the user already knows it),
    else the fastest; fits asked in order of speed, only until one does."""
    ranked = sorted(candidates, key=lambda c: (c.seconds, c.name != "kept"))
    return next((c for c in ranked if c.fits), ranked[0])


def _search_info(result: SearchResult) -> dict[str, object]:
    return {"exact": result.exact, "gap": result.gap, "segments": result.segments,
            "distinct_segments": result.distinct_segments, "states_expanded": result.states_expanded}


class _SearchRound:
    """:func:`searched` under each of ``SEARCH_OVERLAPS`` at the same shares. When there is a
    spare core they start at once, one after the other in a forked child (see hapc.process.fork),
    before the caller knows whether it will want them: ``auto`` may decide from a simulation
    of the old program, which then runs beside them instead of before; :meth:`cancel` stops
    them when the answer is no. Meanwhile this process does the caller's ``while_searching``
    work and then re-balances the first search's program while the child makes the second.
    What crosses the pipe is a program's steps, its :class:`Figures` and the search's
    figures: not the graph, and not the simulation's timeline (only the plan's own program
    needs one, and that is re-balanced, hence simulated again, here). A program
    that cannot lead the searched ones (:func:`costmodel.simulator.ahead` of the leader so
    far says no, as the caller's would) comes back as its time only (:class:`_Behind`): its
    memory is never worked out, nor its steps sent, and the last search ends sooner."""

    def __init__(self, graph: Graph, shares: Sequence[float], cluster: Cluster, optimizer: str,
                 simulate_here: Callable[[DistProgram], SimResult]) -> None:
        self._args = (graph, tuple(shares), cluster, optimizer)
        self._simulate_here = simulate_here
        self._leader: _Candidate | None = None        # of the searches run in this process so far
        self._prices: Prices | None = None              # of the first search run in this process
        self._searches = BesideEach([functools.partial(self._job, overlap) for overlap in SEARCH_OVERLAPS])

    @property
    def forked(self) -> bool:
        """Whether the searches run in a child, beside this process."""
        return self._searches.forked

    def _job(self, overlap: float) -> tuple[list, dict, Figures, dict[str, object]] | _Behind:
        # Only the gradient all-reduce's price depends on the overlap: the searches after the
        # first price no node or layout change again (synth.costs.Prices.with_overlap).
        graph, shares, cluster, _ = self._args
        if self._prices is None:
            self._prices = prices = Prices(graph, cluster, shares, grad_sync_overlap=overlap)
        else:
            prices = self._prices.with_overlap(overlap)
        program, sim, result = searched(*self._args, overlap, prices)
        here = _Candidate("searched", program, sim)
        if self._leader is not None and not ahead(here, self._leader):
            return _Behind(sim.iteration_seconds, _search_info(result))
        self._leader = here
        return program.steps, program.source_layouts, Figures.of(sim), _search_info(result)

    def ready(self, index: int = len(SEARCH_OVERLAPS) - 1) -> bool:
        """Whether the search of ``SEARCH_OVERLAPS[index]`` (by default the last, hence every
        one) has finished: its result waits in the pipe."""
        return self._searches.ready(index)

    def candidate(self, index: int) -> _Candidate | _Behind:
        """The program of ``SEARCH_OVERLAPS[index]``'s search (received from the child, or
        searched here without a spare core), with its figures; or, when it cannot lead the
        searches before it, its time only."""
        got = self._searches.result(index)
        if isinstance(got, _Behind):
            return got
        steps, layouts, figures, info = got
        graph, shares = self._args[0], self._args[1]
        return _Candidate("searched", DistProgram(graph, shares, dict(layouts), list(steps)), figures, info,
                          simulate_here=self._simulate_here)

    def cancel(self) -> None:
        self._searches.cancel()


@dataclass(frozen=True)
class _Behind:
    """A searched program that cannot lead: no faster than one searched before it, which fits."""

    seconds: float
    info: dict[str, object]


@dataclass
class _Counts:
    """What a replan ran, for the record and the benchmark (a loaded machine's seconds say little)."""

    simulations: int = 0
    searches: int = 0
    share_lps: int = 0


def replan(old: Plan, cluster: Cluster, *, survivors: Sequence[int] | None = None, effort: str = "auto",
           progress: Progress | None = None, while_searching: Callable[[], object] | None = None) -> Replanned:
    """The best plan for ``cluster`` among the old plan's program and, by ``effort``:
    ``"quick"`` nothing else; ``"search"`` one search round on the new cluster; ``"full"``
    everything ``hapc compile`` tries (every round, the baselines); ``"auto"`` (default)
    searches only when the old program at the carried shares lost more than the devices did
    (see ``DEGRADED``). The leading candidate is re-balanced by the LP.

    The old program is simulated only when its collectives alone
    (:func:`costmodel.comm_floor.blocking_comm_floor_seconds`) do not already settle both
    questions, whether to search and whether it could win; the answer is the same either way.

    ``while_searching``: work the caller will do after planning anyway (the CLI: importing the
    program emitter), done here if this process would otherwise wait for the child's first
    search."""
    # A replan keeps most of what it allocates (search states, simulations, the LP's arrays) to
    # its end, so the cyclic collector's passes over them were overhead: a seventh of the
    # command's CPU (hapc replan of GPT-48 --drop 7 with the collector off throughout: 2.04 ->
    # 1.76 s CPU, loaded machine, peak memory the same to 1 MB). The child inherits the pause.
    with gc_paused():
        return _replan(old, cluster, survivors, effort, progress, while_searching)


def _replan(old: Plan, cluster: Cluster, survivors: Sequence[int] | None, effort: str,
            progress: Progress | None, while_searching: Callable[[], object] | None) -> Replanned:
    if effort not in EFFORTS:
        raise ValueError(f"unknown effort {effort!r}; expected one of {', '.join(EFFORTS)}")
    say = progress or (lambda msg: None)
    started = time.perf_counter()
    optimizer = old.model.get("optimizer", "adamw")
    graph = old.graph
    counts = _Counts()
    shares = carry_shares(old.program.shares, survivors, cluster, old.cluster)
    kept_program = DistProgram(graph, shares, dict(old.program.source_layouts), list(old.program.steps))

    def simulate_here(program: DistProgram) -> SimResult:
        counts.simulations += 1
        return _simulate(program, cluster, optimizer)

    # The searches start first, in a child, so that they run beside whatever this process does
    # next (the comm floor, the caller's while_searching); "auto" may still cancel them.
    round_ = _SearchRound(graph, shares, cluster, optimizer, simulate_here) if effort in ("auto", "search") else None
    kept: _Candidate | None = None
    floor = 0.0
    try:
        floor = blocking_comm_floor_seconds(kept_program, cluster)
        if effort == "auto":
            expected = old.recorded_seconds * _total_flops(old.cluster) / _total_flops(cluster)
            if floor > expected * (1 + DEGRADED):
                effort = "search"
                say(f"the old program lost more than the devices did (its collectives alone take "
                    f"{floor * 1e3:.3f} ms/iter against {expected * 1e3:.3f} expected): searching")
            else:
                kept = _simulate_kept(kept_program, cluster, optimizer, shares, counts, say)
                slower = kept.seconds > expected * (1 + DEGRADED)
                effort = "search" if slower or not kept.fits else "quick"    # (not fitting: slower than anything)
                said = f"{kept.seconds * 1e3:.3f} ms/iter" if slower or kept.fits else "does not fit"
                say(f"the old program {'lost more' if effort == 'search' else 'lost no more'} than the devices did "
                    f"({said}, against {expected * 1e3:.3f} ms/iter expected): "
                    + ("searching" if effort == "search" else "no search"))
        elif effort in ("quick", "full"):
            kept = _simulate_kept(kept_program, cluster, optimizer, shares, counts, say)
    except BaseException:
        if round_ is not None:
            round_.cancel()
        raise
    if round_ is not None and effort != "search":
        round_.cancel()
    baselines: dict[str, float] = {}
    shortfall: dict[str, float] = {}
    info: dict[str, object] = {}
    candidates: dict[str, _Candidate] = {}
    if kept is not None:
        candidates["kept"] = kept
    if effort == "search":
        assert round_ is not None
        try:
            if round_.forked and while_searching is not None and not round_.ready(0):
                while_searching()   # while the child searches (after auto decided: a cancelled child stops sooner)
            candidates, info = _search_round(round_, kept, kept_program, floor, cluster, optimizer, shares,
                                             counts, say)
        finally:
            round_.cancel()             # a child still searching (an error here) is not left behind
        kept = candidates.get("kept", kept)
    elif effort == "quick":
        assert kept is not None
        candidates["kept"], note = _rebalanced(kept, shares, cluster, optimizer, counts)
        say(note)
    if effort == "full":
        from synth.synthesize import synthesize_program

        assert kept is not None
        candidates["kept"], _ = _rebalanced(kept, shares, cluster, optimizer, counts)
        result = synthesize_program(graph, cluster, optimizer=optimizer, progress=say)
        candidates["searched"] = _Candidate("searched", result.best.program, result.best.sim)
        baselines = {k: c.seconds for k, c in result.baselines.items()}
        shortfall = result.baseline_shortfall
        counts.searches += result.searches
        if result.best.search is not None:
            info = dict(_search_info(result.best.search), rounds=len(result.rounds))
    chosen = _first(list(candidates.values()))
    if not chosen.fits:
        raise UserError(f"no plan fits in memory on the new cluster {cluster.name}".rstrip())
    name = old.name if chosen.name == "kept" else (result.best.name if effort == "full" else "hapc")
    if chosen.name == "kept":
        info = dict(old.search)           # the program is the old search's
    info["replan"] = {"from": old.cluster.name or f"{old.cluster.world} devices",
                      "kept_program": chosen.name == "kept", "effort": effort}
    # The old plan's numerics carry over (the graph is already autocast to them); TF32 is as the
    # new cluster file says, as hapc compile records it (hapc.api._assumed).
    precision = dataclasses.replace(old.precision, allow_tf32=cluster.allow_tf32)
    plan = Plan(chosen.program, cluster, chosen.simulation(), name, baselines, info, dict(old.model), precision,
                baseline_shortfall=shortfall)
    # The old program's time on the new cluster: re-balanced when it led, a floor when it was not simulated.
    carried = min(_carried(c) for c in (kept, candidates.get("kept")) if c is not None) if kept is not None else floor
    return Replanned(plan, chosen.name == "kept", effort, time.perf_counter() - started, old.recorded_seconds, carried,
                     carried_cost_is_floor=kept is None, simulations=counts.simulations,
                     searches=counts.searches, share_lps=counts.share_lps)


def _carried(kept: _Candidate) -> float:
    """The old program's time on the new cluster, infinite when it does not fit."""
    return kept.seconds if kept.fits else float("inf")


def _simulate_kept(program: DistProgram, cluster: Cluster, optimizer: str, shares: Sequence[float],
                   counts: _Counts, say: Progress) -> _Candidate:
    sim = _simulate(program, cluster, optimizer)
    counts.simulations += 1
    say(f"the old program at the carried shares: {sim.iteration_seconds * 1e3:.3f} ms/iter, shares "
        + "/".join(f"{x:.3f}" for x in shares))
    return _Candidate("kept", program, sim)


def _rebalanced(cand: _Candidate, shares: Sequence[float], cluster: Cluster, optimizer: str,
                counts: _Counts) -> tuple[_Candidate, str]:
    """``cand`` re-balanced by the LP (:func:`rebalance`, from its figures), or as it was when
    it fits at no shares; and a progress line saying which."""
    who = "old" if cand.name == "kept" else "new"
    counts.share_lps += 1
    try:
        program, sim = rebalance(cand.program, shares, cluster, optimizer, cand.sim)
    except MemoryInfeasible:
        return cand, f"the {who} program does not fit on the new cluster at any shares"
    counts.simulations += 1
    return (_Candidate(cand.name, program, sim, cand.info, cand.simulate_here),
            f"the {who} program re-balanced: {sim.iteration_seconds * 1e3:.3f} ms/iter, shares "
            + "/".join(f"{x:.3f}" for x in program.shares))


def _search_round(round_: _SearchRound, kept: _Candidate | None, kept_program: DistProgram, floor: float,
                  cluster: Cluster, optimizer: str, shares: Sequence[float], counts: _Counts,
                  say: Progress) -> tuple[dict[str, _Candidate], dict[str, object]]:
    """One round of hapc compile on the new cluster (each overlap assumption searched at the
    carried shares, the strategies from synth.reuse's cache when the CLI found one) against
    the old program; the leading candidate is re-balanced by the LP, the others stay at the
    carried shares. Returns the candidates by name and the best search's figures.

    The old program (``kept``, None when not simulated yet) is simulated only if its
    collectives alone (``floor``) are not slower than a searched program that fits: else it
    can neither lead nor win. While the child still searches the other overlaps, this process
    does what will most likely be wanted next: it simulates the old program when the first
    search has not ruled it out, else re-balances the first search's program when that
    leads so far (usually the winner; wasted only when a later search's program beats it)."""
    first = round_.candidate(0)
    assert isinstance(first, _Candidate)        # nothing searched before it to be behind
    counts.searches += 1
    counts.simulations += 1
    say(f"search on the new cluster (overlap {SEARCH_OVERLAPS[0]:g}): {first.seconds * 1e3:.3f} ms/iter")
    if kept is None and not (first.fits and floor > first.seconds * (1 + 1e-9)) and round_.forked:
        kept = _simulate_kept(kept_program, cluster, optimizer, shares, counts, say)
    early = None
    if round_.forked and not round_.ready() and (kept is None or _first([first, kept]) is first):
        early = _rebalanced(first, shares, cluster, optimizer, counts)
    best = first
    for index, overlap in enumerate(SEARCH_OVERLAPS[1:], 1):
        cand = round_.candidate(index)
        counts.searches += 1
        counts.simulations += 1
        say(f"search on the new cluster (overlap {overlap:g}): {cand.seconds * 1e3:.3f} ms/iter")
        if isinstance(cand, _Candidate) and ahead(cand, best):
            best = cand
    if kept is None:
        if best.fits and floor > best.seconds * (1 + 1e-9):
            say(f"the old program's collectives alone take {floor * 1e3:.3f} ms/iter: it cannot win "
                "(not simulated)")
        else:
            kept = _simulate_kept(kept_program, cluster, optimizer, shares, counts, say)
    lead = _first([best] if kept is None else [kept, best])
    if lead is first and early is not None:
        rebalanced, note = early
    else:
        rebalanced, note = _rebalanced(lead, shares, cluster, optimizer, counts)
    say(note)
    candidates = {"searched": best} | ({"kept": kept} if kept is not None else {})
    candidates[lead.name] = rebalanced
    return candidates, dict(best.info or {})
