"""A* search for the cheapest distributed program under fixed shares.

The state after node ``i`` is the set of layouts each live activation is held in; a move
chooses a strategy for node ``i + 1`` and pays its compute plus every layout change its
inputs need (see :mod:`synth.costs`). States reached twice are merged (only the cheaper
survives), so the frontier stays small.

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
import operator
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from hapc.ir.layout import Layout, Partial, Replicate, Shard
from hapc.ir.program import DistProgram
from synth.bounds import TargetBound, ValueBound
from synth.elimination import SegmentEliminator
from hapc.process.collector import gc_paused
from synth.space import FREE, PARAM, NodeSpace, SearchSpace, Segment, layout_order

State = tuple  # layout bitmasks, one per activation live at that point (see Searcher._live)
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


class Searcher:
    def __init__(self, space: SearchSpace, deadline: float | None = None) -> None:
        self.space = space
        self.prices = space.prices
        self.graph = space.graph
        self.deadline = deadline
        self.expanded = 0
        self.exact = True
        self._memo: dict[tuple, dict[int, tuple[float, list[Choice]]]] = {}
        self._survivors: dict[tuple, tuple[State, ...]] = {}     # see _prune_frontier
        self._param_cache: dict[tuple, tuple[float, Layout]] = {}
        # Layouts are small ints in the hot loop (R=0, P=1, S(d)=2+d); sets of them are bitmasks.
        self.layouts: list[Layout] = [Replicate(), Partial()] + [Shard(d) for d in range(16)]
        # Value ids and signatures, and every table below up to _relax_rows, depend on the graph
        # and the layout-change prices alone: searches at the same prices (the outer loop's
        # overlap assumptions) share them through the Prices object.
        memos = self.prices.search_memos
        if not memos:
            sigs: dict[tuple, int] = {}
            memos.update(vid={name: i for i, name in enumerate(self.graph.values)}, names=list(self.graph.values),
                         sig=[sigs.setdefault((v.meta, v.requires_grad), len(sigs))
                              for v in self.graph.values.values()],
                         move={}, conv={}, conv_seconds={}, codes={}, alt={})
        self._vid: dict[str, int] = memos["vid"]
        self._names: list[str] = memos["names"]
        self._sig: list[int] = memos["sig"]
        self._move_cache: dict[tuple[int, int, int], float] = memos["move"]
        self._conv_cache: dict[tuple[int, int, int], tuple[float, int]] = memos["conv"]
        # Per (value signature, wanted layout): held mask -> seconds to get it (the hot loop's
        # view of _conv_cache, one dict lookup per input instead of a tuple key and a call).
        self._conv_seconds: dict[tuple[int, int], dict[int, float]] = memos["conv_seconds"]
        self._codes_cache: dict[int, list[int]] = memos["codes"]
        self._alt_cache: dict[tuple[int, int], list[tuple[int, float]]] = memos["alt"]
        # Per (node, value, allowed strategies of a segment's last node or None): the relaxation
        # rows of ValueBound._solve, see _relaxation_rows (they carry parameter prices: per search).
        self._relax_rows: dict[tuple, list[tuple]] = {}
        self._templates: dict[tuple, list[tuple]] = {}
        self._targets: dict[tuple, list[tuple[int, ...]] | None] = {}
        # Per segment structure: the memos of its heuristic's relaxations (see ValueBound).
        self._relaxations: dict[str, dict] = {}
        # Expansions one segment may use before it is finished by a beam (and marked inexact).
        # The transformer segments of the benchmarks need at most ~100 on HAP-8 (ViT-24 93,
        # GPT-48 49, BERT-24 32; ~3,000 before values passed their bound on to their readers'
        # outputs); a mixture-of-experts layer runs out at any budget tried (150,000), so a
        # smaller one wastes less before the beam takes over.
        self.segment_budget = 5_000
        self._hard = space.hard_segments
        self._timed_out: set[str] = set()
        self._live = [[self._vid[v] for v in live] for live in space.live]
        self._tables = _Tables(self)
        # Exact solver of the segments the A* cannot finish or solves again every layer.
        self.elimination = SegmentEliminator(self)

    @staticmethod
    def code(layout: Layout) -> int:
        if isinstance(layout, Replicate):
            return 0
        if isinstance(layout, Partial):
            return 1
        return 2 + layout.dim

    # ---- prices of one move ----------------------------------------------------------------
    def _move_seconds(self, vid: int, src: int, dst: int) -> float:
        key = (self._sig[vid], src, dst)
        hit = self._move_cache.get(key)
        if hit is None:
            v = self.graph.values[self._names[vid]]
            hit = self.prices.move(v.meta, v.requires_grad, self.layouts[src], self.layouts[dst]).seconds
            self._move_cache[key] = hit
        return hit

    def _factor_price(self, ns: NodeSpace, strat) -> float:
        """Sufficient factor broadcasting replaces the weight's all-reduce by two gathers; it
        needs the weight stored whole, so it is out when replicated storage is."""
        if not self.space.allow_replicated_params:
            return math.inf
        x = self.graph.values[ns.inputs[0][0]].meta
        y = self.graph.values[ns.node.outputs[0]].meta
        return self.prices.factor_gather_seconds(x, strat.inputs[0], y, strat.outputs[0])

    def _convert(self, vid: int, mask: int, want: int) -> tuple[float, int]:
        """Cheapest (seconds, source layout) to get layout ``want`` from the copies in ``mask``."""
        key = (self._sig[vid], mask, want)
        hit = self._conv_cache.get(key)
        if hit is None:
            hit = min((self._move_seconds(vid, src, want), src) for src in _bits(mask))
            self._conv_cache[key] = hit
        return hit

    def _param_price(self, name: str, want: Layout) -> tuple[float, Layout]:
        """Cheapest (seconds, storage layout) for reading parameter ``name`` as ``want``."""
        v = self.graph.values[name]
        uses = self.space.param_uses.get(name, 1)
        key = (v.meta, v.requires_grad, want, uses, self.space.allow_replicated_params)
        hit = self._param_cache.get(key)
        if hit is not None:
            return hit
        options: list[tuple[float, Layout]] = []
        if isinstance(want, Shard):
            options.append((0.0, want))
        if self.space.allow_replicated_params or not v.requires_grad:
            sync = self.prices.grad_sync_seconds(v.meta) / uses if v.requires_grad else 0.0
            move = self.prices.move(v.meta, v.requires_grad, Replicate(), want).seconds
            options.append((sync + move, Replicate()))
        if not isinstance(want, Shard):          # ZeRO-3: stored sharded, gathered for use
            dims = [d for d, n in enumerate(v.meta.shape) if n > 1]
            if dims:
                d = max(dims, key=lambda k: (v.meta.shape[k], -k))
                gather = self.prices.move(v.meta, v.requires_grad, Shard(d), Replicate()).seconds
                options.append((gather, Shard(d)))
        if not options:
            options.append((self.prices.move(v.meta, v.requires_grad, Replicate(), want).seconds, Replicate()))
        best = min(options, key=lambda o: (o[0], layout_order(o[1])))
        self._param_cache[key] = best
        return best

    def _compile(self, ns: NodeSpace) -> list[tuple]:
        """Per strategy: (state-independent seconds, activation inputs, fixed sources, carry,
        carrier, conversions).

        States are tuples of layout masks aligned with the (static) list of activations live
        before each node, so a move is index arithmetic. Parameter and free inputs cost the
        same in every state, so they are priced here once. ``carry`` says, for each value live
        after the node, which slot before it holds its layouts, or which mask it is born with;
        ``carrier`` applies it. ``conversions`` is the activation inputs as the hot loop reads
        them: (slot, wanted layout bit, that layout's conversion table, value id, layout code).
        Repeated layers have the same table up to which activations they read, so the table is
        built once per shape and only the value ids are filled in.
        """
        i = ns.index
        before = {vid: k for k, vid in enumerate(self._live[i])}
        shape: list = []
        act_vids: dict[int, int] = {}
        for pos, (value, kind) in enumerate(ns.inputs):
            if kind == PARAM:
                v = self.graph.values[value]
                shape.append((v.meta, v.requires_grad, self.space.param_uses.get(value, 1)))
            elif kind == FREE:
                shape.append(None)
            else:
                act_vids[pos] = vid = self._vid[value]
                shape.append(before[vid])
        born_at = {self._vid[o]: k for k, o in enumerate(ns.node.outputs)}
        carry_shape = tuple(before[vid] if vid in before else -1 - born_at[vid] for vid in self._live[i + 1])
        key = (ns.signature, len(before), tuple(shape), carry_shape)
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = self._compile_template(ns, shape, carry_shape)
        return [(base, tuple((pos, slot, want, act_vids[pos]) for pos, slot, want in acts), fixed, carry, carried,
                 tuple((slot, 1 << want, self._conversions(act_vids[pos], want), act_vids[pos], want)
                       for pos, slot, want in acts))
                for base, acts, fixed, carry, carried in template]

    def _conversions(self, vid: int, want: int) -> dict[int, float]:
        """The (lazily filled) table ``held mask -> seconds`` to get ``vid`` in layout ``want``,
        shared by every value of the same signature."""
        key = (self._sig[vid], want)
        table = self._conv_seconds.get(key)
        if table is None:
            table = self._conv_seconds[key] = {}
        return table

    def _conversion_miss(self, table: dict[int, float], vid: int, mask: int, want: int) -> float:
        """Price a conversion a :meth:`_conversions` table does not hold yet, and keep it there."""
        seconds = table[mask] = self._convert(vid, mask, want)[0]
        return seconds

    def _compile_template(self, ns: NodeSpace, shape: list, carry_shape: tuple[int, ...]) -> list[tuple]:
        """:meth:`_compile`'s table with activation inputs as (position, slot, layout code)."""
        table = []
        for k, strat in enumerate(ns.options):
            base = ns.compute_seconds[k]
            sfb = strat.local == "linear_sfb"
            if sfb:
                base += self._factor_price(ns, strat)
            fixed: list[Layout | None] = []
            acts = []
            for pos, ((value, kind), want) in enumerate(zip(ns.inputs, strat.inputs)):
                if kind == FREE:
                    fixed.append(None)
                elif kind == PARAM and sfb:       # complete gradients on every rank: no sync
                    fixed.append(Replicate())
                elif kind == PARAM:
                    c, storage = self._param_price(value, want)
                    base += c
                    fixed.append(storage)
                else:
                    fixed.append(None)
                    acts.append((pos, shape[pos], self.code(want)))
            born = [1 << self.code(lay) for lay in strat.outputs]
            carry = tuple((slot, 0) if slot >= 0 else (-1, born[-1 - slot]) for slot in carry_shape)
            table.append((base, tuple(acts), tuple(fixed), carry, _carrier(carry, len(self._live[ns.index]))))
        return table

    def _expand(self, ns: NodeSpace, state: State) -> list[tuple[State, float, int, tuple]]:
        """(new state, seconds, strategy index, sources) for every strategy of node ``ns``.

        The hot loop of the search: plain tuples, no objects (a :class:`Choice` is made only
        for moves that improve a state)."""
        convert = self._convert
        layouts = self.layouts
        out = []
        for k, (base, acts, fixed, _, carried, _) in enumerate(self._tables[ns.index]):
            if not acts:
                out.append((carried(list(state)), base, k, fixed))
                continue
            cost = base
            masks = list(state)
            sources = list(fixed)
            for pos, slot, want, vid in acts:
                mask = masks[slot]
                bit = 1 << want
                if mask & bit:
                    sources[pos] = layouts[want]
                    continue
                c, src = convert(vid, mask, want)
                cost += c
                sources[pos] = layouts[src]
                masks[slot] = mask | bit
            out.append((carried(masks), cost, k, tuple(sources)))
        return out

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

    def _sources(self, ns: NodeSpace, state: State, k: int) -> tuple[Layout | None, ...]:
        """The sources :meth:`_expand` gives strategy ``k`` of node ``ns`` from ``state``,
        worked out for that strategy alone (a path needs one move per node, not all of them)."""
        _, acts, fixed, *_ = self._tables[ns.index][k]
        layouts = self.layouts
        masks = list(state)
        sources = list(fixed)
        for pos, slot, want, vid in acts:
            mask = masks[slot]
            bit = 1 << want
            if mask & bit:
                sources[pos] = layouts[want]
                continue
            sources[pos] = layouts[self._convert(vid, mask, want)[1]]
            masks[slot] = mask | bit
        return tuple(sources)

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

    def _alternatives(self, vid: int, mask: int) -> list[tuple[int, float]]:
        """(single-layout mask, seconds to convert it into every layout of ``mask``) for each
        other layout ``vid`` can take, cheapest first: the candidates :meth:`_dominated` looks up."""
        key = (self._sig[vid], mask)
        hit = self._alt_cache.get(key)
        if hit is None:
            hit = []
            for code in self._codes_of(vid):
                alt = 1 << code
                if alt != mask:
                    hit.append((alt, sum(self._move_seconds(vid, code, c) for c in _bits(mask) if c != code)))
            hit.sort(key=lambda a: a[1])
            self._alt_cache[key] = hit
        return hit

    def _relaxation_rows(self, j: int, vid: int, options: frozenset[int] | None) -> list[tuple]:
        """Node ``j``'s strategies as the relaxation tracking ``vid`` sees them (see
        :meth:`ValueBound._solve`): (seconds, the (bit, code, conversion table) of each
        layout it wants ``vid`` in,
        the (value, mask) of each output born live), the cheapest strategy per distinct wish
        (the others cannot be better there), restricted to ``options`` when given. Outputs
        count only at nodes that read ``vid``."""
        key = (j, vid, options)
        hit = self._relax_rows.get(key)
        if hit is None:
            cheapest: dict[tuple, float] = {}
            after = self._live[j + 1]
            for k, (base, acts, _, carry, *_) in enumerate(self._tables[j]):
                if options is not None and k not in options:
                    continue
                wants = tuple(want for _, _, want, v in acts if v == vid)
                reads = any(v == vid for _, _, _, v in acts)
                born = tuple((after[n], bit) for n, (slot, bit) in enumerate(carry) if slot < 0) if reads else ()
                if base < cheapest.get((wants, born), math.inf):
                    cheapest[(wants, born)] = base
            hit = self._relax_rows[key] = [
                (base, tuple((1 << want, want, self._conversions(vid, want)) for want in wants), born)
                for (wants, born), base in cheapest.items()]
        return hit

    def _codes_of(self, vid: int) -> list[int]:
        hit = self._codes_cache.get(vid)
        if hit is None:
            shape = self.graph.values[self._names[vid]].meta.shape
            hit = [0, 1] + [2 + d for d, n in enumerate(shape) if n > 1]
            self._codes_cache[vid] = hit
        return hit

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

    def _node_floor(self, ns: NodeSpace) -> float:
        """No move at this node costs less than its cheapest strategy's own price."""
        return min(t[0] for t in self._tables[ns.index]) if ns.options else 0.0

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


class _Tables:
    """Each node's move table (see :meth:`Searcher._compile`), built on first use: the A* and
    its bounds visit the first instances of each repeated segment, the rest are memo hits."""

    def __init__(self, searcher: Searcher) -> None:
        # A weak reference: the searcher holds these tables, and a cycle would keep its memos
        # alive until the cyclic collector runs (the search pauses it).
        self._searcher = weakref.ref(searcher)
        self._nodes = searcher.space.nodes
        self._rows: list[list[tuple] | None] = [None] * len(self._nodes)

    def __getitem__(self, index: int | slice) -> list:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._rows)))]
        rows = self._rows[index]
        if rows is None:
            rows = self._rows[index] = self._searcher()._compile(self._nodes[index])
        return rows

    def __len__(self) -> int:
        return len(self._rows)


def _carrier(carry: tuple[tuple[int, int], ...], slots_before: int) -> Callable[[list[int]], State]:
    """A fast ``masks before -> state after`` for one strategy: an itemgetter over the masks
    before the node followed by the masks its outputs are born with (the search's hot loop)."""
    born = [bit for slot, bit in carry if slot < 0]
    picks, n_born = [], 0
    for slot, _ in carry:
        if slot >= 0:
            picks.append(slot)
        else:
            picks.append(slots_before + n_born)
            n_born += 1
    if not picks:
        return lambda masks: ()
    getter = operator.itemgetter(*picks)
    if len(picks) == 1:
        return lambda masks: (getter(masks + born),)
    if not born:
        return getter
    return lambda masks: getter(masks + born)


def _bits(mask: int) -> list[int]:
    return [c for c in range(mask.bit_length()) if mask >> c & 1]
