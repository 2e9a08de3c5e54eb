"""A* search for the cheapest distributed program under fixed shares.

The state after node ``i`` is the set of layouts each live activation is held in; a move
chooses a strategy for node ``i + 1`` and pays its compute plus every layout change its
inputs need (the move tables of :mod:`synth.moves`, priced by :mod:`synth.costs`). States
reached twice are merged (only the cheaper survives), so the frontier stays small.

**Heuristic.** The floor of a state before node ``i`` is the sum over the segment's remaining
nodes of each one's cheapest strategy price. That ignores communication, which is most of
what separates plans, so each live value also gets a relaxed problem solved exactly: the rest
of the segment with only that value's layouts tracked (every other input free in any
layout), and, at each node that reads it, the layouts that node's outputs are born in, whose
own relaxations continue from there. A partial sum that must be reduced before the residual
add is thus priced while the attention that makes it is still to come. The heuristic is the
largest of these; each is a lower bound and consistent, so A* stays exact and pops states in
order of their *excess* over it (see :class:`synth.bounds.ValueBound`). The bounds are cached per segment
structure and state, so every later A* run of a repeated segment looks them up.

**Segments.** The graph is cut where few activations are live (see :mod:`synth.space`).
Each distinct segment is solved once per entry state: A* runs until it has settled every
exit state that could still matter — one whose cost is within the boundary values' most
expensive conversion of the best exit, since any other exit can be had from the best one by
that conversion. An exact DP then chains the segments, dropping boundary states that a
cheaper one converts into. The result is the optimum under the search's cost model.

**Elimination.** A wide segment (a mixture-of-experts gate keeps ten values live), one the
A* runs out of ``segment_budget`` expansions on, and one whose memo misses repeat, is solved
exactly instead by variable elimination over its nodes' strategies (see
:mod:`synth.elimination`): the plan stays proven optimal.

**Budgets.** A segment too wide to eliminate whose A* needs more than ``segment_budget``
expansions is finished by a beam search, and so is everything once ``deadline`` passes; the
plan is then marked inexact and its lower bound is the sum of the per-node floors, so the gap
is known.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

from hapc.ir.layout import Layout
from hapc.ir.program import DistProgram
from synth.bounds import TargetBound, ValueBound
from synth.elimination import SegmentEliminator
from hapc.process.collector import gc_paused
from synth.moves import MoveTables, State, _bits
from synth.space import PARAM, SearchSpace, Segment

Frontier = dict  # State -> (seconds paid so far, choices made so far)


@dataclass(frozen=True)
class Choice:
    """The decision for one node: a strategy and, per input, the layout it is taken from
    (an activation's existing copy, or a parameter's storage layout)."""

    option: int
    sources: tuple[Layout | None, ...]


@dataclass
class SearchResult:
    choices: list[Choice]
    cost_seconds: float
    lower_bound_seconds: float
    exact: bool
    states_expanded: int
    segments: int
    distinct_segments: int
    seconds: float
    param_storage: dict[str, Layout] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        if self.cost_seconds <= 0:
            return 0.0
        return max(0.0, (self.cost_seconds - self.lower_bound_seconds) / self.cost_seconds)


class Searcher(MoveTables):
    """The A* over one search space's segments, chained by an exact DP (see the module)."""

    def __init__(self, space: SearchSpace, deadline: float | None = None) -> None:
        super().__init__(space)
        self.deadline = deadline
        self.expanded = 0
        self.exact = True
        self._memo: dict[tuple, dict[int, tuple[float, list[Choice]]]] = {}
        self._survivors: dict[tuple, tuple[State, ...]] = {}     # see _prune_frontier
        self._targets: dict[tuple, list[tuple[int, ...]] | None] = {}
        # Per segment structure: the memos of its heuristic's relaxations (see ValueBound).
        self._relaxations: dict[str, dict] = {}
        # Expansions one segment may use before it is finished by a beam (and marked inexact).
        # A transformer block needs at most a few hundred; a mixture-of-experts layer runs out at
        # any budget, so a smaller one wastes less before the beam (or elimination) takes over.
        self.segment_budget = 5_000
        self._hard = space.hard_segments
        self._timed_out: set[str] = set()
        # Exact solver of the segments the A* cannot finish or solves again every layer.
        self.elimination = SegmentEliminator(self)

    # ---- one segment ----------------------------------------------------------------------
    def solve_segment(self, seg: Segment, frontier: Frontier) -> Frontier:
        """The best cost and choices to every useful exit state of ``seg``, starting from all
        ``frontier`` states at once (each with the cost already paid to reach it).

        Results are memoised by the segment's structure and the frontier's costs *relative to
        its cheapest state*: from the third or fourth transformer layer on, that key repeats
        and a layer costs a dictionary lookup.
        """
        base = min(g for g, _ in frontier.values())
        key = (seg.signature, tuple(sorted((st, round(g - base, 13)) for st, (g, _) in frontier.items())))
        hit = self._memo.get(key)
        if hit is None:
            hit = self.elimination.solve(seg, frontier, base)
        if hit is None:
            beam = seg.signature in self._hard or seg.signature in self._timed_out
            hit = self._beam_segment(seg, frontier, base) if beam else \
                self._astar_segment(seg, frontier, base)
            self._memo[key] = hit
        return {st: (base + g_rel, frontier[entry][1] + sub) for st, (g_rel, entry, sub) in hit.items()}

    def _astar_segment(self, seg: Segment, frontier: Frontier, base: float) -> dict:
        value_bound = ValueBound(self, seg)
        heuristic = value_bound.of
        # The heuristic depends on the node and state alone, so its values are kept per segment
        # structure: later A* runs of the segment (other frontiers, other layers) look them up.
        h_known = value_bound.known
        towards = TargetBound.of_segment(self, seg, value_bound)
        limits: dict[tuple[int, ...], float] | None = None
        start = seg.start
        # Per node of the segment: state -> best cost so far, and state -> (previous state,
        # strategy) of the move that reached it (its sources are worked out for the path only).
        best_g: list[dict[State, float]] = [{} for _ in range(seg.start, seg.stop + 1)]
        parent: list[dict[State, tuple[State, int]]] = [{} for _ in range(seg.start, seg.stop + 1)]
        counter = itertools.count()
        heap = []
        for entry, (g, _) in sorted(frontier.items()):
            best_g[0][entry] = g - base
            h0 = heuristic(seg.start, entry)
            heap.append((g - base + h0, next(counter), seg.start, entry, h0))
        heapq.heapify(heap)
        exits: dict[State, float] = {}
        exit_limits: dict[tuple[int, ...], float] | None = None      # of the exits settled so far
        bound = math.inf
        budget = self.segment_budget
        tables, conversion_miss = self._tables, self._conversion_miss
        heappush, heappop, inf = heapq.heappush, heapq.heappop, math.inf
        while heap:
            f, _, i, state, h_state = heappop(heap)
            if f > bound + 1e-15:
                break
            layer = best_g[i - start]
            g = layer[state]
            if g + h_state < f - 1e-15:
                continue                              # a stale entry of a state since improved
            if i == seg.stop:
                if state not in exits:
                    exits[state] = g
                    # Other exits matter only while dearer to convert the settled ones into.
                    exit_limits = self._exit_limits(seg.stop, {state: g}, exit_limits)
                    bound = self._exit_bound(seg.stop, exits, bound, exit_limits)
                    if towards is not None:
                        limits = exit_limits
                continue
            if limits is not None and towards.useless(i, state, g, limits, h_state):
                continue                  # reaches no exit that a settled one does not beat
            if i > start and self._dominated(i, state, g, layer):
                continue
            budget -= 1
            if budget < 0 or (self.deadline is not None and time.perf_counter() > self.deadline):
                # Out of time or states: finish with a beam, and say the plan is not proven optimal.
                # Running out of states is the segment's nature (remembered for every search of
                # this graph); running out of time is this search's.
                (self._hard if budget < 0 else self._timed_out).add(seg.signature)
                return self._beam_segment(seg, frontier, base)
            self.expanded += 1
            after = i + 1 - start
            next_g, next_parent, next_h = best_g[after], parent[after], h_known[after]
            # Every strategy of node i: _expand's moves without their sources (inlined: this
            # loop is most of the search's time).
            for k, (cost, _, _, _, carried, conversions) in enumerate(tables[i]):
                masks = list(state)
                for slot, bit, table, vid, want in conversions:
                    mask = masks[slot]
                    if not mask & bit:
                        c = table.get(mask)
                        cost += conversion_miss(table, vid, mask, want) if c is None else c
                        masks[slot] = mask | bit
                new_state = carried(masks)
                g2 = g + cost
                if g2 < next_g.get(new_state, inf) - 1e-18:
                    next_g[new_state] = g2
                    next_parent[new_state] = (state, k)
                    h2 = next_h.get(new_state)
                    if h2 is None:
                        h2 = next_h[new_state] = heuristic(i + 1, new_state)
                    heappush(heap, (g2 + h2, next(counter), i + 1, new_state, h2))
        result = {}
        for state, g in exits.items():
            entry, path = self._path(seg, parent, state)
            result[state] = (g, entry, path)
        return result

    def _beam_segment(self, seg: Segment, frontier: Frontier, base: float, width: int = 24) -> dict:
        """The segment with at most ``width`` states per node (cheapest first): fast, not exact.
        Out of states rather than time, it is first solved exactly by elimination if narrow enough."""
        if seg.signature not in self._timed_out:
            exact = self.elimination.solve(seg, frontier, base, hard=True)
            if exact is not None:
                return exact
        self.exact = False
        nodes = self.space.nodes
        layer = {st: (g - base, st, []) for st, (g, _) in frontier.items()}
        for i in range(seg.start, seg.stop):
            nxt: dict[State, tuple[float, State, list[Choice]]] = {}
            for state, (g, entry, path) in layer.items():
                self.expanded += 1
                for new_state, cost, k, sources in self._expand(nodes[i], state):
                    if g + cost < nxt.get(new_state, (math.inf,))[0]:
                        nxt[new_state] = (g + cost, entry, path + [Choice(k, sources)])
            layer = dict(sorted(nxt.items(), key=lambda kv: (kv[1][0], kv[0]))[:width])
        return layer

    def _path(self, seg: Segment, parent: list[dict[State, tuple[State, int]]],
              state: State) -> tuple[State, list[Choice]]:
        """Walk back from an exit ``state`` to the entry state; return it and the choices made
        (each move's sources priced again by :meth:`_expand`, for this path only)."""
        steps = []
        for i in range(seg.stop - 1, seg.start - 1, -1):
            state, k = parent[i + 1 - seg.start][state]
            steps.append((i, state, k))
        path = [Choice(k, self._sources(self.space.nodes[i], before, k)) for i, before, k in reversed(steps)]
        return state, path


    def _dominated(self, i: int, state: State, g: float, layer: dict[State, float]) -> bool:
        """Is there a state at ``i`` that differs in one value's layouts and is cheaper even
        after converting that value to these layouts? Then this one can be dropped: every
        continuation from here is at most as cheap from there (merging equivalent frontiers)."""
        live = self._live[i]
        for slot, mask in enumerate(state):
            single = mask & (mask - 1) == 0
            for alt, extra in self._alternatives(live[slot], mask):
                if extra > g:
                    break                       # sorted by extra; costs paid so far are >= 0
                other = state[:slot] + (alt,) + state[slot + 1:]
                g_other = layer.get(other)
                if g_other is None:
                    continue
                if g_other + extra <= g - 1e-15 or (single and g_other + extra <= g and other < state):
                    return True
        return False


    def _exit_bound(self, i: int, exits: dict[State, float], previous: float,
                    limits: dict[tuple[int, ...], float] | None) -> float:
        """Cost above which no further exit of a segment (values live at node ``i``) matters.

        An exit that holds each value in one layout matters only while it is cheaper than
        converting some settled exit into it; once every such target has a settled exit that
        converts into it for less than the search's current cost, the rest is dominated. The
        bound is the dearest target's cheapest conversion, over single-layout targets (as
        :meth:`_conversion_bound` is); with many exit values it is that bound of the best exit.
        ``limits`` are :meth:`_exit_limits` of ``exits``.
        """
        if len(exits) == 1:
            (state, g), = exits.items()
            return g + self._conversion_bound(i, state)
        return previous if limits is None else min(max(limits.values()), previous)

    def _exit_limits(self, i: int, exits: dict[State, float],
                     known: dict[tuple[int, ...], float] | None = None) -> dict[tuple[int, ...], float] | None:
        """Per single-layout target of the exit values (live at ``i``): the cheapest settled
        exit converted into it. A later exit holding the target matters only below this.
        ``known`` are the limits of the exits settled before ``exits``: new exits can only
        lower them, so the A* passes each exit once, not all of them again per new one."""
        targets = self._exit_targets(i)
        if targets is None:
            return None
        live = self._live[i]
        limits = {}
        for target in targets:
            cheapest = math.inf if known is None else known[target]
            for state, g in exits.items():
                extra = g
                for vid, mask, want in zip(live, state, target):
                    if not mask >> want & 1:
                        extra += self._convert(vid, mask, want)[0]
                        if extra >= cheapest:
                            break
                if extra < cheapest:
                    cheapest = extra
            limits[target] = cheapest
        return limits

    def _exit_targets(self, i: int) -> list[tuple[int, ...]] | None:
        """Every way to hold each value live at ``i`` in one layout (None when too many)."""
        key = ("targets", i)
        hit = self._targets.get(key, False)
        if hit is False:
            codes = [self._codes_of(vid) for vid in self._live[i]]
            count = math.prod(len(c) for c in codes)
            hit = list(itertools.product(*codes)) if count <= 64 else None
            self._targets[key] = hit
        return hit

    def _conversion_bound(self, i: int, state: State) -> float:
        """The most it costs to turn the values live at ``i``, held as in ``state``, into any layouts."""
        total = 0.0
        for vid, mask in zip(self._live[i], state):
            total += max((self._convert(vid, mask, b)[0] for b in self._codes_of(vid)), default=0.0)
        return total


    # ---- the whole graph ------------------------------------------------------------------
    def run(self) -> SearchResult:
        started = time.perf_counter()
        frontier: Frontier = {(): (0.0, [])}
        for seg in self.space.segments:
            frontier = self._prune_frontier(seg, self.solve_segment(seg, frontier))
        finals = {k: v for k, v in frontier.items() if k and k[-1] & 0b11}   # the loss ends R or P
        if not finals:
            raise RuntimeError("no plan ends with a Replicate or Partial loss")
        _, (cost, choices) = min(finals.items(), key=lambda kv: (kv[1][0], kv[0]))
        # Exact: the optimum itself. Otherwise every move pays at least its node's floor.
        lb = cost if self.exact else min(cost, sum(self._node_floor(ns) for ns in self.space.nodes))
        storage = self._param_storage(choices)
        distinct = len({s.signature for s in self.space.segments})
        return SearchResult(choices, cost, lb, self.exact, self.expanded, len(self.space.segments),
                            distinct, time.perf_counter() - started, storage)

    def _prune_frontier(self, seg: Segment, frontier: Frontier) -> Frontier:
        """Drop boundary states that are dearer than converting a cheaper one into them.

        Which survive depends on the costs relative to the cheapest, so it is remembered by
        them as :meth:`solve_segment`'s results are: repeated layers decide it once."""
        if len(frontier) <= 1:
            return frontier
        base = min(g for g, _ in frontier.values())
        key = (seg.signature, tuple(sorted((st, round(g - base, 13)) for st, (g, _) in frontier.items())))
        survivors = self._survivors.get(key)
        if survivors is None:
            survivors = self._survivors[key] = tuple(self._undominated(seg, frontier))
        return {state: frontier[state] for state in survivors}

    def _undominated(self, seg: Segment, frontier: Frontier) -> Frontier:
        live = self._live[seg.stop]
        kept = {}
        for state, (g, path) in frontier.items():
            dominated = False
            for other, (g2, _) in frontier.items():
                if other == state or g2 > g:
                    continue
                extra = sum(self._convert(vid, o, b)[0] for vid, o, m in
                            zip(live, other, state) for b in _bits(m) if not o >> b & 1)
                if g2 + extra < g - 1e-15 or (g2 + extra <= g and other < state):
                    dominated = True
                    break
            if not dominated:
                kept[state] = (g, path)
        return kept

    def _param_storage(self, choices: list[Choice]) -> dict[str, Layout]:
        """Each parameter is stored in the layout its first use chose."""
        storage: dict[str, Layout] = {}
        for ns, choice in zip(self.space.nodes, choices):
            for (value, kind), src in zip(ns.inputs, choice.sources):
                if kind == PARAM and value not in storage and src is not None:
                    storage[value] = src
        return storage


def search(space: SearchSpace, time_budget_seconds: float | None = None) -> SearchResult:
    deadline = time.perf_counter() + time_budget_seconds if time_budget_seconds else None
    # The search allocates many small tuples and frees them by reference counting; none is in
    # a cycle, so the cyclic collector only costs time while it runs (10-20% of a search).
    with gc_paused():
        return Searcher(space, deadline).run()


def to_program(space: SearchSpace, result: SearchResult, shares) -> DistProgram:
    """Turn the search's choices into a :class:`DistProgram` (redistributions inserted)."""
    from synth.builder import ProgramBuilder

    builder = ProgramBuilder(space.graph, shares)
    for name, layout in sorted(result.param_storage.items()):
        builder.store(name, layout)
    for ns, choice in zip(space.nodes, result.choices):
        builder.compute(ns.node, ns.options[choice.option], choice.sources)
    return builder.build()


