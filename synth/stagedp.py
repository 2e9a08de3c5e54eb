"""The stage planner's exact search: which stages, on which device groups, between which cuts.

:mod:`synth.stages` turns one device order at one micro-batch count into a
:class:`StageProblem`: an :class:`Arc` per group at each device position, priced for every
pair of cuts. This module finds the fastest stage list over all problems and proves it, under
the cost model of :func:`costmodel.pipeline.schedule_cost`:

    T = (m - 1) * B + W + H,   B = max(w ∪ x),  W = sum(w) + sum(x),  H = max_s (e_s - sum_{t<s} d_t)

**Caps, bisected.** For a cap on the slowest step ``B``, a DP over (stages left, first device
position, first cut) gives the least ``W + e_0``: a lower bound on ``W + H`` for every plan
under the cap (``H >= e_0``), each stage's memory checked for the micro-batches it holds. Caps
are the distinct step values: an interval of caps ``[lo, hi]`` solved at ``hi`` proves
``(m - 1) * cap_lo + bound`` for all its plans and is dropped when that reaches the incumbent;
the plan found at ``hi`` closes the caps from its own bottleneck up. Since ``W >= B`` and
``H >= 0``, no plan takes less than ``m * B``: caps from ``incumbent / m`` up are never solved.

**Best first, over every problem.** The open cap intervals of all problems wait in one
order, least bound first, and each DP run takes up to :data:`CAP_BATCH` of the problem that
holds the least: so no interval is solved whose bound an incumbent found later would have
closed, whichever problem that incumbent comes from.

**Stage counts collapsed.** The DP keeps the number of stages from a state on only while it
matters: 1F1B holds ``min(m, k)`` micro-batches on a stage with ``k`` stages from it on, and a
plan needs two stages, so all ``k >= max(m, 2)`` share one layer (with a self-loop, solved in
decreasing device positions) whenever the stage limit is implied by the positions and cuts.
Where memory is ample the counts collapse further: when no stage that could run has room for
fewer than ``min(m, max_stages)`` micro-batches but at least ``t``, every ``k >= t`` closes the
same stages and shares the top layer (BERT-24 and ViT-24 on HAP-8: 2 layers, not up to 8).
The stages short of memory are the big, slow ones, so a DP run under a cap sees only the
stages whose step is under it (:meth:`StageProblem.under`): GPT-48 on HAP-8 keeps 8 layers for
the whole problem but 2 in every run after the first.

**Exact where the tail decides.** Where a later stage's tail ends the iteration (``H > e_0``)
and the bound is still under the incumbent, a DP over Pareto fronts of ``(W, V = W + H)`` per
state prices that cap instead (``V = max(w + x + e + W_rest, f + x_f + V_rest)``, monotone in
both). Before it, :func:`tail_bound` (that recursion with ``W_rest`` and ``V_rest`` each at
their least) shows in one cheap pass whether it could find anything under the incumbent.
A search reports its gap to the least bound left open: non-zero only when
:data:`DP_RUN_LIMIT`, :data:`FRONT_RUN_LIMIT` or a front wider than :data:`FRONT_WIDTHS` cut
the proof short.

**Groups priced by bounds.** An arc may carry lower bounds for a group that has no program yet
(``bound=True``); a plan that uses one and might win is not priced: the search hands its groups
back, and the caller synthesises them and rebuilds the problem (:func:`solve_pass`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

CAP_BATCH = 8            # step caps solved together by one (vectorised) DP run
DP_RUN_LIMIT = 400       # DP runs per pass of the search; what is left unexplored then counts in the gap
EXACT_TOLERANCE = 1e-9   # relative gap under which a plan is reported exact
FRONT_WIDTHS = (12, 48)  # (W, V) front sizes tried by the exact DP before it gives up on a cap
FRONT_RUN_LIMIT = 40     # exact front DPs per planning; past it, caps keep their W + e0 bound (a gap)


@dataclass
class Arc:
    """A group at one device position, priced for one micro-batch count: what a stage over
    cuts ``[i, j)`` on it adds to the DP, for every cut pair."""

    group: Any                   # the planner's group (``.key`` names it)
    start: int                   # index of its first device position
    end: int                     # index of the position after it
    cost: np.ndarray             # [c, c] its step w plus its send x, plus its tail e on row 0 (first stage)
    gate: np.ndarray             # [c, c] the slowest pipeline step it adds, max(w, x); inf where no stage
    inflight_max: np.ndarray     # [c, c] micro-batches whose activations fit next to its parameters
    busy: np.ndarray             # [c, c] w + x: what the stage and its send add to the pipeline's sum
    busy_tail: np.ndarray        # [c, c] w + x + e: ... and the end of its own iteration after the pipeline
    ahead: np.ndarray            # [c, c] f + x_f: how far its last backward ends before the next stage's
    bound: bool = False          # priced by lower bounds only: its group has no program yet


Chosen = list[tuple[Arc, int, int]]     # stages as (arc, first cut, stop cut)


@dataclass
class StageProblem:
    """One device order at one micro-batch count."""

    m: int
    n_pos: int
    n_cuts: int
    arcs: list[Arc]
    max_stages: int
    ks: list[int]                # stage counts allowed
    gpipe_memory: bool           # every stage holds all m micro-batches (GPipe), not min(m, k) (1F1B)
    steps: np.ndarray            # sorted distinct step values: the caps worth trying
    gates: dict[int, list[np.ndarray]] = field(default_factory=dict)   # per in-flight count
    ahead: np.ndarray | None = None      # [p, i] least forward time before a state (a bound)
    source: tuple = ()                   # what built it (to build it again once groups are synthesised)

    _top: int | None = field(default=None, repr=False)   # :attr:`top`, found once
    _short: tuple | None = field(default=None, repr=False)   # see _short_stages
    _views: dict = field(default_factory=dict, repr=False)   # see under
    _bottleneck: float | None = field(default=None, repr=False)   # see least_bottleneck

    @property
    def top(self) -> int:
        """The last stage-count layer the DPs keep (module docstring: counts collapsed)."""
        if self._top is None:
            self._top = self._least_top(math.inf)
        return self._top

    def _least_top(self, cap: float) -> int:
        """The top layer for DPs whose steps are all at most ``cap``."""
        if self.ks != list(range(2, self.max_stages + 1)) or \
                self.max_stages < min(self.n_pos - 1, self.n_cuts - 1):
            return self.max_stages        # forced counts, or a stage limit the positions do not imply
        if self.gpipe_memory:
            return min(self.max_stages, 2)
        # Layers t..top hold min(m, t)..min(m, top) micro-batches; they close the same stages,
        # and so are one layer, when no stage that could run has room for a count in between.
        top, gates, held = self._short_stages()
        held = held[gates <= cap]
        return min(top, max(2, math.floor(held.max()) + 1)) if len(held) else 2

    def _short_stages(self) -> tuple[int, np.ndarray, np.ndarray]:
        """The top layer memory alone would keep (``max(m, 2)``), and the step gates and
        in-flight limits of the stages with room for fewer than ``min(m, top)`` micro-batches."""
        if self._short is None:
            top = min(self.max_stages, max(self.m, 2))
            most = min(self.m, top)
            short = [(a.gate < np.inf) & (a.inflight_max < most) for a in self.arcs]
            self._short = (top, np.concatenate([a.gate[s] for a, s in zip(self.arcs, short)] + [np.zeros(0)]),
                           np.concatenate([a.inflight_max[s] for a, s in zip(self.arcs, short)] + [np.zeros(0)]))
        return self._short

    def least_short_gate(self) -> float:
        """The least step of a stage short of memory for some stage count (inf when none is)."""
        gates = self._short_stages()[1]
        return float(gates.min()) if len(gates) else math.inf

    def under(self, cap: float) -> StageProblem:
        """The problem as a DP whose steps are all at most ``cap`` sees it: the stages over the
        cap are closed there, so only the others' memory tells stage counts apart, and the
        layers may collapse further than :attr:`top` (the same values, fewer layers)."""
        top = self._least_top(cap)
        if top >= self.top:
            return self
        if top not in self._views:
            self._views[top] = replace(self, _top=top, _views={}, _bottleneck=None)
        return self._views[top]

    @property
    def looped(self) -> bool:
        """Whether the top layer stands for every count from it up (a self-loop)."""
        return self.top < self.max_stages

    def layers(self) -> list[int]:
        """The layers whose plans from position 0 count (the allowed stage counts)."""
        return sorted({min(k, self.top) for k in self.ks})

    def gates_at(self, k: int) -> list[np.ndarray]:
        """Each arc's step gate with the stages that cannot hold their in-flight micro-batches
        (``min(m, k)`` under 1F1B with ``k`` stages from here on, all ``m`` under GPipe) closed."""
        need = self.m if self.gpipe_memory else min(self.m, k)
        if need not in self.gates:
            self.gates[need] = [np.where(a.inflight_max >= need, a.gate, np.inf) for a in self.arcs]
        return self.gates[need]

    def steps_into(self, k: int) -> list[tuple[int, list[int]]]:
        """Layer ``k``'s arcs (as indices, by decreasing start on the self-looped top layer) and
        the layers their next stage may be on."""
        if k == self.top and self.looped:
            order = sorted(range(len(self.arcs)), key=lambda a: -self.arcs[a].start)
            return [(a, [k - 1, k]) for a in order]
        return [(a, [k - 1]) for a in range(len(self.arcs))]


class StageSearch:
    """The incumbent, the bounds left open and the counts of one planning.

    ``price`` prices one stage list exactly at ``m`` micro-batches (None when it does not fit).
    """

    def __init__(self, bound: float, price: Callable[[Chosen, int], Any]) -> None:
        self.best: Any = None
        self.upper = bound
        self.price = price
        self.lower_bounds: list[float] = []     # bounds of the cap intervals solved (or left unexplored)
        self.priced = 0
        self.dp_runs = 0
        self.pass_runs = 0                      # DP runs in the current pass (each pass has the limit)
        self.pareto_runs = 0
        self.skipped = 0                        # problems the second pass found proven by the first
        self.restarts = 0

    def open(self, lower_bound: float) -> bool:
        return lower_bound < self.upper * (1 - EXACT_TOLERANCE)

    def consider(self, chosen: Chosen, m: int) -> None:
        self.priced += 1
        pipe = self.price(chosen, m)
        if pipe is not None and pipe.iteration_seconds < self.upper * (1 - 1e-12):
            self.best, self.upper = pipe, pipe.iteration_seconds


# ---- one pass over every problem, best first -------------------------------------------------
class _Run:
    """One problem's open cap intervals ``(lower bound, first cap index, last cap index)``."""

    def __init__(self, prob: StageProblem) -> None:
        self.prob = prob
        self.proven: list[float] = []
        self.pending: list[tuple[float, int, int]] = []
        if prob.arcs and len(prob.steps):
            least_step = least_bottleneck(prob)
            if math.isfinite(least_step):                # else nothing fits
                self.pending = [(0.0, int(np.searchsorted(prob.steps, least_step)), len(prob.steps) - 1)]
        self.step_floors = prob.steps * prob.m          # no plan with that slowest step takes less

    def winnable(self, incumbent: float) -> list[tuple[float, int, int]]:
        """The open intervals without the caps at which no plan beats ``incumbent``: with ``m``
        micro-batches a plan whose slowest step is ``B`` takes ``(m - 1) B + W + H >= m B``
        (``W`` sums every step, ``H >= 0``), so caps from ``incumbent / m`` up are not solved."""
        last = int(np.searchsorted(self.step_floors, incumbent, side="left")) - 1
        return [(bound, first, min(hi, last)) for bound, first, hi in self.pending if min(hi, last) >= first]


def solve_pass(problems: Sequence[StageProblem], search: StageSearch, *, fronts: bool,
               synthesise: Callable[[list[Any]], None],
               rebuild: Callable[[StageProblem], StageProblem]) -> list[list[float]]:
    """Solve ``problems`` together, least open bound first; per problem, the lower bounds that
    closed its cap intervals (those dropped as worse than the incumbent of their time are not
    listed: they reach any later incumbent too).

    When the best plan under some cap uses a group priced by bounds only, ``synthesise`` gets
    that problem's such groups and the problem, rebuilt by ``rebuild``, starts again (the
    incumbent kept): a bound alone never closes an interval."""
    runs = [_Run(rebuild(prob)) for prob in problems]
    while True:
        best_at, least = -1, math.inf
        for at, run in enumerate(runs):
            run.pending = [iv for iv in run.pending if search.open(iv[0])]
            if run.pending:
                low = min(iv[0] for iv in run.pending)
                if low < least:
                    best_at, least = at, low
        if best_at < 0:
            break
        if search.pass_runs >= DP_RUN_LIMIT:
            for run in runs:
                run.proven.extend(iv[0] for iv in run.pending)      # unexplored: counted in the gap
            break
        run = runs[best_at]
        run.pending = run.winnable(search.upper)
        if not run.pending:
            continue
        run.pending.sort()
        batch, run.pending = run.pending[:CAP_BATCH], run.pending[CAP_BATCH:]
        missing = _solve_caps(run, batch, search, fronts)
        if missing:
            synthesise(missing)
            search.restarts += 1
            runs[best_at] = _Run(rebuild(run.prob))
    for run in runs:
        search.lower_bounds.extend(run.proven)
    return [run.proven for run in runs]


def _solve_caps(run: _Run, batch: list[tuple[float, int, int]], search: StageSearch, fronts: bool) -> list[Any]:
    """One DP run over a batch of cap intervals: plans priced, intervals closed or split.
    Returns the groups to synthesise first when a bound-priced plan came out best under some
    cap (the problem's run is then void), else none."""
    prob, steps = run.prob, run.prob.steps
    caps = steps[[hi for _, _, hi in batch]]
    dp = prob.under(float(caps.max()))           # fewer layers where only slower stages lack memory
    value, pick_arc, pick_cut, pick_loop = cap_dp(dp, caps)
    search.dp_runs += 1
    search.pass_runs += 1
    layers = dp.layers()
    for b, (_, first, hi) in enumerate(batch):
        totals = [value[k, b, 0, 0] for k in layers]
        least = float(min(totals))
        if not math.isfinite(least):
            continue                          # no plan under this cap, nor under any smaller
        k = layers[int(np.argmin(totals))]
        chosen = _walk(dp, pick_arc, pick_cut, pick_loop, b, k)
        bottleneck = max(float(arc.gate[i, j]) for arc, i, j in chosen)
        t = int(np.searchsorted(steps, bottleneck))
        if not search.open((prob.m - 1) * steps[t] + least):
            pass                                     # it cannot beat the incumbent: not priced
        elif unsynthesised(chosen):
            return unsynthesised(chosen)            # it might win: price it for real
        else:
            search.consider(chosen, prob.m)
        if fronts and search.open((prob.m - 1) * steps[t] + least) and search.pareto_runs < FRONT_RUN_LIMIT and \
                not unsynthesised(chosen) and pipeline_sum(chosen) + tail_excess(chosen) > least * (1 + EXACT_TOLERANCE):
            # A later stage's tail ends the iteration: the bound W + e0 is not tight here.
            # The exact DP over (W, V) fronts prices the cap instead, unless a cheaper bound
            # on V shows it would find nothing under the incumbent.
            limit = search.upper - (prob.m - 1) * steps[first]
            if tail_bound(dp, value, b, float(steps[hi])) >= limit:
                continue
            exact = pareto_dp(prob.under(float(steps[hi])), float(steps[hi]), limit)
            search.pareto_runs += 1
            if exact is not None:
                least, chosen = exact
                if not chosen:
                    continue
                if unsynthesised(chosen):
                    return unsynthesised(chosen)
                bottleneck = max(float(arc.gate[i, j]) for arc, i, j in chosen)
                t = int(np.searchsorted(steps, bottleneck))
                search.consider(chosen, prob.m)
        run.proven.append((prob.m - 1) * steps[t] + least)
        if t > first:
            mid = (first + t - 1) // 2
            run.pending.append(((prob.m - 1) * steps[first] + least, first, mid))
            if mid + 1 <= t - 1:
                run.pending.append(((prob.m - 1) * steps[mid + 1] + least, mid + 1, t - 1))
    return []


# ---- the DPs ---------------------------------------------------------------------------------
def least_bottleneck(prob: StageProblem) -> float:
    """The smallest slowest step of any plan that fits (a min-max DP), found once per problem.

    First with the layers collapsed as if every stage short of memory were closed (its step
    gate is over the cap): when the plan found steps under all of those, it is one of the full
    problem too, and no plan of the full problem has a smaller bottleneck."""
    if prob._bottleneck is None:
        below = float(np.nextafter(prob.least_short_gate(), -np.inf))
        dp = prob.under(below)
        found = _least_bottleneck(dp) if dp is not prob else math.inf
        prob._bottleneck = found if found <= below else _least_bottleneck(prob)
    return prob._bottleneck


def _least_bottleneck(prob: StageProblem) -> float:
    c, top = prob.n_cuts, prob.top
    worst = np.full((top + 1, prob.n_pos, c), np.inf)
    worst[0, :, c - 1] = 0.0
    for k in range(1, top + 1):
        gates = prob.gates_at(k)
        for ai, sources in prob.steps_into(k):
            arc = prob.arcs[ai]
            if arc.end + k > prob.n_pos:
                continue                     # too few device positions left for the stages after it
            nxt = worst[sources[0], arc.end] if len(sources) == 1 else \
                np.minimum(worst[sources[0], arc.end], worst[sources[1], arc.end])
            best = np.maximum(gates[ai], nxt[None, :]).min(axis=1)
            np.minimum(worst[k, arc.start], best, out=worst[k, arc.start])
    return float(min(worst[k, 0, 0] for k in prob.layers()))


def cap_dp(prob: StageProblem, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``value[k, b, p, i]``: the least ``W + e0`` covering cuts ``i..end`` with ``k`` stages (on
    the top layer: ``k`` or more) on the devices from position ``p`` on, every step under
    ``caps[b]``; and the choices (arc, next cut, and on the top layer whether the next stage is
    on it too)."""
    c, n_caps, top = prob.n_cuts, len(caps), prob.top
    shape = (top + 1, n_caps, prob.n_pos, c)
    value = np.full(shape, np.inf)
    value[0, :, :, c - 1] = 0.0
    pick_arc = np.full(shape, -1, dtype=np.int32)
    pick_cut = np.zeros(shape, dtype=np.int32)
    pick_loop = np.zeros((n_caps, prob.n_pos, c), dtype=bool)      # top layer: the next stage on it too
    cap = caps[:, None, None]
    rows = np.arange(n_caps)[:, None]
    for k in range(1, top + 1):
        gates = prob.gates_at(k)
        for ai, sources in prob.steps_into(k):
            arc = prob.arcs[ai]
            if arc.end + k > prob.n_pos:
                continue                     # too few device positions left for the stages after it
            nxt = value[sources[0], :, arc.end]                              # [caps, cuts]
            loop = None
            if len(sources) == 2:
                same = value[k, :, arc.end]
                loop = same < nxt
                nxt = np.where(loop, same, nxt)
            reached = np.flatnonzero(np.isfinite(nxt).any(axis=0))
            if not len(reached):
                continue
            # Only the next cuts some cap reaches, the first cuts before them (a stage ends
            # after it starts), and at the first position only cut 0 (where every plan starts).
            j0, j1 = int(reached[0]), int(reached[-1]) + 1
            i1 = 1 if arc.start == 0 else j1 - 1
            if i1 <= 0:
                continue
            total = np.where(gates[ai][None, :i1, j0:j1] <= cap,
                             arc.cost[None, :i1, j0:j1] + nxt[:, None, j0:j1], np.inf)
            j = total.argmin(axis=2)
            t = total.min(axis=2)
            j += j0
            here = value[k, :, arc.start, :i1]
            better = t < here
            if better.any():
                here[better] = t[better]
                pick_arc[k, :, arc.start, :i1][better] = ai
                pick_cut[k, :, arc.start, :i1][better] = j[better]
                if loop is not None:
                    pick_loop[:, arc.start, :i1][better] = loop[rows, j][better]
    return value, pick_arc, pick_cut, pick_loop


def _walk(prob: StageProblem, pick_arc: np.ndarray, pick_cut: np.ndarray, pick_loop: np.ndarray,
          b: int, k: int) -> Chosen:
    chosen = []
    p = i = 0
    while k > 0:
        arc = prob.arcs[int(pick_arc[k, b, p, i])]
        j = int(pick_cut[k, b, p, i])
        stay = k == prob.top and prob.looped and bool(pick_loop[b, p, i])
        chosen.append((arc, i, j))
        p, i, k = arc.end, j, k if stay else k - 1
    return chosen


def pareto_dp(prob: StageProblem, cap: float, limit: float) -> tuple[float, Chosen] | None:
    """The least exact ``V = W + H`` under one step cap, below ``limit``, and its stages
    (empty when none is below); None when a front outgrew :data:`FRONT_WIDTHS` (the caller
    keeps its bound).

    ``V = max(w + x + e + W_rest, f + x_f + V_rest)`` for a stage followed by the rest, so
    each state keeps its Pareto front of ``(W, V)`` pairs (a pair worse in both can never
    end better). A pair is dropped once the least forward time of any stages before it
    plus its ``V`` reaches ``limit``: the whole plan's ``V`` can only be larger."""
    for width in FRONT_WIDTHS:
        found = _pareto_fronts(prob, cap, width, limit)
        if found is not None:
            return found
    return None


def tail_bound(prob: StageProblem, value: np.ndarray, b: int, cap: float) -> float:
    """A lower bound on ``V = W + H`` of every plan under ``cap`` (caps[b] of a :func:`cap_dp`
    run that gave ``value``): the front DP's ``V = max(w + x + e + W_rest, f + x_f + V_rest)``
    with ``W_rest`` and ``V_rest`` each at their least, which ``value`` holds for ``W_rest``
    (a stage after the first never starts at cut 0, where ``value`` adds ``e0``). Where it
    reaches the incumbent, the front DP would find no plan below it."""
    c, top = prob.n_cuts, prob.top
    least_v = np.full((top + 1, prob.n_pos, c), np.inf)
    least_v[0, :, c - 1] = -np.inf               # no stage after the last: its own end decides
    for k in range(1, top + 1):
        gates = prob.gates_at(k)
        for ai, sources in prob.steps_into(k):      # decreasing starts on a self-looped layer
            arc = prob.arcs[ai]
            if arc.end + k > prob.n_pos:
                continue
            for src in sources:
                rest_w, rest_v = value[src, b, arc.end], least_v[src, arc.end]
                v = np.maximum(arc.busy_tail + rest_w[None, :], arc.ahead + rest_v[None, :])
                v = np.where(gates[ai] <= cap, v, np.inf).min(axis=1)
                np.minimum(least_v[k, arc.start], v, out=least_v[k, arc.start])
    return float(min(least_v[k, 0, 0] for k in prob.layers()))


def least_ahead(prob: StageProblem) -> np.ndarray:
    """``[p, i]``: the least sum of ``f + x_f`` of stages covering cuts ``0..i`` on the
    devices before position ``p`` (caps and memory ignored: a bound)."""
    if prob.ahead is None:
        ahead = np.full((prob.n_pos, prob.n_cuts), np.inf)
        ahead[0, 0] = 0.0
        for arc in sorted(prob.arcs, key=lambda a: a.start):
            reach = np.where(np.isfinite(arc.gate), ahead[arc.start][:, None] + arc.ahead, np.inf).min(axis=0)
            np.minimum(ahead[arc.end], reach, out=ahead[arc.end])
        prob.ahead = ahead
    return prob.ahead


def _pareto_fronts(prob: StageProblem, cap: float, width: int, limit: float) -> tuple[float, Chosen] | None:
    c, n_pos, top = prob.n_cuts, prob.n_pos, prob.top
    before = least_ahead(prob)
    front_w = np.full((top + 1, n_pos, c, width), np.inf)
    front_v = np.full((top + 1, n_pos, c, width), np.inf)
    front_w[0, :, c - 1, 0] = 0.0
    front_v[0, :, c - 1, 0] = -np.inf           # no stage after the last: its own end decides
    pick = np.full((top + 1, n_pos, c, width, 4), -1, dtype=np.int32)   # (arc, next cut, next entry, next layer)
    for k in range(1, top + 1):
        gates = prob.gates_at(k)
        by_start: dict[int, list[tuple[int, list[int]]]] = {}
        for ai, sources in prob.steps_into(k):
            if prob.arcs[ai].end + k <= prob.n_pos:          # else too few positions left after it
                by_start.setdefault(prob.arcs[ai].start, []).append((ai, sources))
        for p, arc_ids in by_start.items():         # decreasing starts on a self-looped layer
            ws, vs, ids = [], [], []
            for ai, sources in arc_ids:
                arc = prob.arcs[ai]
                for src in sources:
                    rest_w, rest_v = front_w[src, arc.end], front_v[src, arc.end]      # [c, width]
                    js, qs = np.nonzero(np.isfinite(rest_w))      # the (next cut, entry) pairs held
                    if not len(js):
                        continue
                    ok = gates[ai][:, js] <= cap                                           # [c, pairs]
                    w = np.where(ok, arc.busy[:, js] + rest_w[js, qs], np.inf)
                    v = np.where(ok, np.maximum(arc.busy_tail[:, js] + rest_w[js, qs],
                                                arc.ahead[:, js] + rest_v[js, qs]), np.inf)
                    v[v + before[p][:, None] >= limit] = np.inf
                    w[np.isinf(v)] = np.inf
                    ws.append(w)
                    vs.append(v)
                    ids.append(np.stack([np.full(len(js), ai), js, qs, np.full(len(js), src)], axis=1))
            if not ws:
                continue
            w_all, v_all, id_all = np.concatenate(ws, axis=1), np.concatenate(vs, axis=1), np.concatenate(ids)
            live = np.isfinite(w_all)
            useful = live.any(axis=0)             # most (next cut, front entry) pairs are empty
            if not useful.all():
                w_all, v_all, id_all, live = w_all[:, useful], v_all[:, useful], id_all[useful], live[:, useful]
            kept = pareto_rows(w_all, v_all, live, width)
            if kept is None:
                return None                       # the front did not fit: a wider one is needed
            at_row, at_col, slot = kept
            front_w[k, p, at_row, slot] = w_all[at_row, at_col]
            front_v[k, p, at_row, slot] = v_all[at_row, at_col]
            pick[k, p, at_row, slot] = id_all[at_col]
    best, where = np.inf, None
    for k in prob.layers():
        q = int(np.argmin(front_v[k, 0, 0]))
        if front_v[k, 0, 0, q] < best:
            best, where = float(front_v[k, 0, 0, q]), (k, q)
    if where is None:
        return math.inf, []
    chosen = []
    (k, q), p, i = where, 0, 0
    while k > 0:
        ai, j, nq, nk = (int(v) for v in pick[k, p, i, q])
        arc = prob.arcs[ai]
        chosen.append((arc, i, j))
        p, i, q, k = arc.end, j, nq, nk
    return best, chosen


def pareto_rows(w: np.ndarray, v: np.ndarray, live: np.ndarray,
                width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each row's Pareto front of its live ``(w, v)`` candidates, least ``v`` first: the
    (row, column, place in the front) of every kept candidate; None when a row keeps more than
    ``width``. In order of ``v`` (then ``w``, then column: the first of equal pairs), a
    candidate is kept when its ``w`` is below every ``w`` before it."""
    if not live.any():
        nothing = np.zeros(0, dtype=np.int64)
        return nothing, nothing, nothing
    w = np.where(live, w, np.inf)
    order = np.lexsort((w, np.where(live, v, np.inf)), axis=1)
    w_sorted = np.take_along_axis(w, order, axis=1)
    least_before = np.minimum.accumulate(w_sorted, axis=1)
    keep = np.empty_like(live)
    keep[:, 0] = np.isfinite(w_sorted[:, 0])
    keep[:, 1:] = w_sorted[:, 1:] < least_before[:, :-1]
    slot = np.cumsum(keep, axis=1) - 1
    if (keep & (slot >= width)).any():
        return None
    at_row, at_sorted = np.nonzero(keep)
    return at_row, order[at_row, at_sorted], slot[at_row, at_sorted]


# ---- facts of a stage list -------------------------------------------------------------------
def unsynthesised(chosen: Chosen) -> list[Any]:
    """The groups of ``chosen`` priced by bounds only, each once, in stage order."""
    out: dict[str, Any] = {}
    for arc, _, _ in chosen:
        if arc.bound:
            out.setdefault(arc.group.key, arc.group)
    return list(out.values())


def pipeline_sum(chosen: Chosen) -> float:
    """W: the stages' steps and sends, summed (one micro-batch through the whole pipeline)."""
    return sum(float(arc.busy[i, j]) for arc, i, j in chosen)


def tail_excess(chosen: Chosen) -> float:
    """H = max over stages s of (tail_s - the backward drain before s): how far past the
    pipeline's end the last stage to finish its gradient sync and optimizer ends."""
    worst, drained = -math.inf, 0.0
    for arc, i, j in chosen:
        worst = max(worst, float(arc.busy_tail[i, j] - arc.busy[i, j]) - drained)
        drained += float(arc.busy[i, j] - arc.ahead[i, j])
    return worst
