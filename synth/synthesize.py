"""The synthesizer's outer loop: search under fixed shares, rebalance shares with the LP,
repeat until the predicted time stops improving; then make sure the plan beats the baselines.

The search prices a program additively (every node at its slowest rank, every collective in
full, gradient all-reduces partly hidden behind backward); the simulator is the judge. So
each candidate is simulated, several overlap assumptions are tried, and the fastest
*simulated* program that fits in memory wins — including the standard baselines, so a plan
is never worse than what a user would write by hand under the same cost model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


from costmodel.cluster import Cluster
from costmodel.memory import program_memory
from costmodel.simcache import SimulationCache
from costmodel.simulator import SimResult, ahead, simulate
from hapc.ir.graph import Graph
from hapc.ir.program import DistProgram
from hapc.process.collector import gc_paused
from synth.baselines import BASELINES, baseline_programs
from synth.costs import Prices
from synth.levers import memory_variants, with_recompute
from synth.loads import share_problem, snapped_to_blocks, with_shares
from synth.ratios import MemoryInfeasible, missing_text, solve_shares
from synth.search import SearchResult, search, to_program
from synth.space import SearchSpace
from synth.zero import shardable, with_sharded_storage, with_state_shares

Progress = Callable[[str], None]


@dataclass
class Candidate:
    name: str
    program: DistProgram
    sim: SimResult
    search: SearchResult | None = None
    space: SearchSpace | None = field(default=None, repr=False)

    @property
    def seconds(self) -> float:
        return self.sim.iteration_seconds

    @property
    def fits(self) -> bool:
        return self.sim.memory.all_fit


@dataclass
class Synthesis:
    best: Candidate
    baselines: dict[str, Candidate]
    rounds: list[dict] = field(default_factory=list)
    search_seconds: float = 0.0
    lp_seconds: float = 0.0
    warm_starts: int = 0       # programs of a round re-simulated at the next round's shares
    searches: int = 0          # A* searches of the loop (the Megatron baseline runs one more)
    states_expanded: int = 0   # over those searches

    @property
    def speedups(self) -> dict[str, float]:
        return {k: c.seconds / self.best.seconds for k, c in self.baselines.items()}

    @property
    def baseline_shortfall(self) -> dict[str, float]:
        """Baselines that do not fit: name -> bytes missing on the device short of most."""
        return {k: max(c.sim.memory.missing_bytes()) for k, c in self.baselines.items() if not c.fits}


def synthesize_program(graph: Graph, cluster: Cluster, *, time_budget: float | None = None,
                       optimizer: str | int = "adamw", max_rounds: int = 6, backend: str = "highs",
                       overlaps: Sequence[float] = (0.0, 0.75), baselines: Sequence[str] = BASELINES,
                       progress: Progress | None = None, require_fit: bool = True) -> Synthesis:
    """The best one-stage program; when none fits in memory, :class:`MemoryInfeasible` (naming what
    is missing where), or with ``require_fit=False`` the fastest of them (for a caller that tries
    pipeline stages next and calls :func:`raise_memory` if those do not fit either)."""
    # The loop makes no reference cycles worth collecting (hapc.process.collector): the cyclic collector
    # would only walk the graph and the price caches again and again.
    with gc_paused():
        return _synthesize(graph, cluster, time_budget=time_budget, optimizer=optimizer, max_rounds=max_rounds,
                           backend=backend, overlaps=overlaps, baselines=baselines, progress=progress,
                           require_fit=require_fit)


def _synthesize(graph: Graph, cluster: Cluster, *, time_budget: float | None, optimizer: str | int,
                max_rounds: int, backend: str, overlaps: Sequence[float], baselines: Sequence[str],
                progress: Progress | None, require_fit: bool = True) -> Synthesis:
    say = progress or (lambda msg: None)
    deadline = time.perf_counter() + time_budget if time_budget else None
    out = Synthesis(best=None, baselines={})  # type: ignore[arg-type]
    prices = SimulationCache(graph, cluster)      # what every simulation below shares

    say("baselines " + ", ".join(baselines))
    for name, prog in baseline_programs(baselines, graph, cluster).items():
        out.baselines[name] = Candidate(name, prog, simulate(prog, cluster, optimizer=optimizer, cache=prices))

    best: Candidate | None = None
    for replicated_params in (True, False):
        shares = tuple(cluster.flops_shares())
        previous = float("inf")
        tried = tuple(overlaps)
        for round_ in range(max_rounds):
            round_best: Candidate | None = None
            round_overlap = None
            at_shares = Prices(graph, cluster, shares)     # priced once for every overlap tried
            for overlap in tried:
                left = None if deadline is None else max(0.0, deadline - time.perf_counter())
                t0 = time.perf_counter()
                space = SearchSpace.build(graph, at_shares.with_overlap(overlap),
                                          allow_replicated_params=replicated_params)
                result = search(space, left / (2 * len(tried)) if left is not None else None)
                out.search_seconds += time.perf_counter() - t0
                out.searches += 1
                out.states_expanded += result.states_expanded
                prog = to_program(space, result, shares)
                cand = _fitted(Candidate("hapc", prog, simulate(prog, cluster, optimizer=optimizer, cache=prices),
                                         result, space), cluster, optimizer, prices)
                if round_best is None or ahead(cand, round_best):
                    round_best, round_overlap = cand, overlap
            assert round_best is not None
            say(f"round {round_ + 1}: {round_best.seconds * 1e3:.3f} ms/iter "
                f"({'fits' if round_best.fits else 'does not fit'}), shares " + _shares_text(shares))
            out.rounds.append({"round": round_ + 1, "seconds": round_best.seconds, "fits": round_best.fits,
                               "shares": list(shares), "replicated_params": replicated_params})
            if best is None or ahead(round_best, best):
                best = round_best
            improvement = (previous - round_best.seconds) / previous if previous < float("inf") else 1.0
            previous = min(previous, round_best.seconds)
            if improvement < 1e-6:
                break       # the round did not improve: whatever shares the LP found, the loop ends
            t0 = time.perf_counter()
            # Shares that make it fit: for a program that fits no way at these shares, those under
            # which its leanest variant fits (the next round's candidates try every variant again).
            basis = round_best if round_best.fits else _leanest(round_best, cluster, optimizer, prices)
            try:
                solution = solve_shares(share_problem(basis.program, basis.sim, cluster, optimizer, prices), backend)
            except MemoryInfeasible:
                out.lp_seconds += time.perf_counter() - t0
                break
            out.lp_seconds += time.perf_counter() - t0
            new_shares = solution.device_shares(cluster.world)
            if _same(new_shares, shares):
                break
            # Warm start: the round's program at the LP's shares is a candidate of its own, and
            # when the simulator does not find it faster than at the old shares, the shares have
            # converged and searching again at them is not worth a round.
            warm = _reshared(round_best, new_shares, cluster, optimizer, prices)
            # The LP's shares are real numbers; the program cuts whole blocks (a batch row), and
            # rounding gives every positive share a block: a device the LP left a sliver of work
            # (a V100 beside A100s under bf16) would compute a whole row. Without it, as a candidate.
            snapped = snapped_to_blocks(round_best.program, new_shares)
            if not _same(snapped, new_shares):
                alt = _reshared(round_best, snapped, cluster, optimizer, prices)
                if alt is not None and (warm is None or ahead(alt, warm)):
                    warm, new_shares = alt, snapped
            out.warm_starts += 1
            if warm is not None and ahead(warm, best):
                best = warm
            if warm is None or not ahead(warm, round_best):
                break
            shares = new_shares
            # Shares the LP moves change prices, not which overlap assumption models this
            # program's gradient synchronisation best: later rounds search with the winner's.
            tried = (round_overlap,)
            if deadline is not None and time.perf_counter() > deadline:
                break
        if best is not None and best.fits:
            break   # sharded parameter storage only when replicated storage cannot fit

    for cand in out.baselines.values():
        if best is None or ahead(cand, best):
            best = cand
    assert best is not None
    if best.search is None and not cluster.is_homogeneous:
        best = _balanced_baseline(best, cluster, optimizer, backend, prices)
    if not best.fits and require_fit:
        raise_memory(best, cluster, optimizer, backend)
    out.best = best
    return out


def _balanced_baseline(best: Candidate, cluster: Cluster, optimizer, backend: str,
                       prices: SimulationCache) -> Candidate:
    """A baseline that beat every searched program (the search gave up proving optimality on a
    wide model and its beam found worse) at the shares the share LP gives it, and at those
    snapped to whole blocks: its steps are in the search space, so balancing them is this
    search's own plan. ``best`` itself when neither is ahead of it."""
    try:
        solution = solve_shares(share_problem(best.program, best.sim, cluster, optimizer, prices), backend)
    except MemoryInfeasible:
        return best
    lp = solution.device_shares(cluster.world)
    for shares in (lp, snapped_to_blocks(best.program, lp)):
        program = with_shares(best.program, shares)
        cand = _fitted(Candidate("hapc", program, simulate(program, cluster, optimizer=optimizer, cache=prices)),
                       cluster, optimizer, prices)
        if ahead(cand, best):
            best = cand
    return best


def _reshared(cand: Candidate, shares: tuple[float, ...], cluster: Cluster, optimizer,
              prices: SimulationCache | None = None) -> Candidate | None:
    """``cand``'s program with the same steps at other shares, simulated (None for a baseline,
    which has no search result to rebuild from)."""
    if cand.search is None or cand.space is None:
        return None
    # What to_program(space, search, shares) builds; the state shares are fitted again.
    prog = with_state_shares(with_shares(cand.program, shares), None)
    return _fitted(Candidate(cand.name, prog, simulate(prog, cluster, optimizer=optimizer, cache=prices),
                             cand.search, cand.space), cluster, optimizer, prices)


def _leanest(cand: Candidate, cluster: Cluster, optimizer, prices: SimulationCache | None = None) -> Candidate:
    """``cand`` with its layers recomputed and either its replicated weights' optimizer state
    in rows (ZeRO-2) shared as the room the weights leave on each device, or those weights
    stored sharded (ZeRO-3), whichever overflows the least (:mod:`synth.levers`): about the
    least memory its way of computing needs, whatever the shares, for the share LP to find
    shares under which something fits, or to say how much is missing when nothing does."""
    recomputed = with_recompute(cand.program) or cand.program
    tries = [_rows_by_room(recomputed, cluster, optimizer), with_sharded_storage(recomputed)]
    best = cand
    for program in (p for p in tries if p is not None and p is not cand.program):
        lean = Candidate(cand.name, program, simulate(program, cluster, optimizer=optimizer, cache=prices),
                         cand.search, cand.space)
        if _overflow(lean, cluster) < _overflow(best, cluster):
            best = lean
    return best


def _rows_by_room(program: DistProgram, cluster: Cluster, optimizer) -> DistProgram:
    """``program`` with its replicated weights' optimizer state in rows shared as the room the
    weights leave on each device (ZeRO-2); itself when it has none."""
    if not shardable(program):
        return program
    weights = [m.params_bytes for m in program_memory(program, cluster, optimizer).devices]
    room = [max(c - w, 0.0) for c, w in zip(cluster.memory_bytes(), weights)]
    rows = [r / sum(room) for r in room] if sum(room) > 0 else [1.0 / program.world] * program.world
    return with_state_shares(program, rows)


def _overflow(cand: Candidate, cluster: Cluster) -> float:
    return sum(max(0.0, t - c) for t, c in zip(cand.sim.memory.totals, cluster.memory_bytes()))


def _fitted(cand: Candidate, cluster: Cluster, optimizer, prices: SimulationCache | None = None) -> Candidate:
    """``cand``, or when it does not fit, the fastest of its memory variants that fits (ZeRO,
    recomputation, :mod:`synth.levers`), if one does."""
    if cand.fits:
        return cand
    best = cand
    for program in memory_variants(cand.program, cluster.memory_bytes(),
                                   lambda other: program_memory(other, cluster, optimizer).totals):
        fitted = Candidate(cand.name, program, simulate(program, cluster, optimizer=optimizer, cache=prices),
                           cand.search, cand.space)
        if fitted.fits and (not best.fits or fitted.seconds < best.seconds):
            best = fitted
    return best


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(abs(x - y) < 1e-9 for x, y in zip(a, b))


def raise_memory(best: Candidate, cluster: Cluster, optimizer, backend: str) -> None:
    """Nothing fits: let the LP say how much memory is missing where, for the leanest variant of
    the best program (layers recomputed, ZeRO's rows): what the memory levers could not close."""
    lean = _leanest(best, cluster, optimizer)
    solve_shares(share_problem(lean.program, lean.sim, cluster, optimizer), backend)
    missing = {f"{d.type}#{d.index}": t - c for d, t, c in zip(cluster.devices, lean.sim.memory.totals,
                                                                 cluster.memory_bytes()) if t > c}
    raise MemoryInfeasible(f"no plan fits in memory: {missing_text(missing)}", missing)


def _shares_text(shares: Sequence[float]) -> str:
    """Shares for a progress line, a run of equal ones written once with its length, so a
    256-device round reads ``0.004 x128/0.003 x128`` rather than 256 numbers."""
    texts = [f"{s:.3f}" for s in shares]
    runs: list[list] = []
    for text in texts:
        if runs and runs[-1][0] == text:
            runs[-1][1] += 1
        else:
            runs.append([text, 1])
    return "/".join(text if n == 1 else f"{text} x{n}" for text, n in runs)
