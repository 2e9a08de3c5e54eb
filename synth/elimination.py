"""Exact solution of one segment by variable elimination, for segments the A* cannot finish.

A mixture-of-experts layer keeps up to eleven activations live at once (gate probabilities,
two routing masks, their cumulative sums, capacity masks, gate weights...). The A* state is
the tuple of their layout sets, and its heuristic (the dearest single value's relaxation, see
:class:`synth.bounds.ValueBound`) cannot see that several of them must each be moved: the
frontier fills with equal-cost mixtures and the search exhausts any budget. The beam that
then finishes the segment is fast but can be far from optimal.

The same problem has a structure the A* does not use: the cost of a segment is a **sum of
small terms**, each over a few nodes' strategy choices.

* every node pays its strategy's own price (compute, parameter reads): a term over that node;
* every activation pays for the layouts it is moved into: its copies start as its producer's
  output layout (or the entry state's layouts) and each use, in graph order, converts from the
  cheapest copy held so far when it wants a layout not yet held. That cost depends only on
  the strategies of its producer and its readers: a term over those few nodes.

So the segment is a min-sum problem over one variable per node (its strategy), solved exactly
by bucket elimination: eliminate the nodes one at a time (fewest-entries first), each time
adding the terms that mention it and minimising it away, remembering the argmin to read the
choices back. Its cost is exponential only in the width of the elimination order, which for
these layers is small (every activation is read by a handful of nearby nodes), not in the
number of live values. The entry state and each exit value's final layout set are kept as
variables to the end, so the result is the optimum to *every* exit state from every entry
state, exactly what :meth:`synth.search.Searcher.solve_segment` returns from its A*.

The choices are replayed through the searcher's own move generator, so the plan's cost and
sources are the search's, and the replayed cost is checked against the eliminated optimum.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # numpy is imported by the functions that use it: a transformer's search never eliminates,
    # and numpy is a fifth of hapc replan's imports (see hapc.elastic.replan._lp_tools).
    import numpy as np
    from synth.search import Searcher, State
    from synth.space import Segment

# Largest table (entries) one elimination step may build; wider segments are left to the beam.
MAX_TABLE_ENTRIES = 1 << 21
# A segment that keeps this many activations live at some point is eliminated before the A*
# tries it: a mixture-of-experts gate keeps 10-11 (and exhausts any A* budget), a transformer
# block at most 5 (which the A* finishes in a few thousand expansions).
WIDE_LIVE = 6
# So is a segment entered in this many states: the A* works through every one of them (after a
# MoE layer, the next attention block starts from 8), the elimination only keeps one more small
# variable to the end.
WIDE_ENTRY = 6
# And so is a segment whose entry states the A* has already solved this many times, each with
# other relative costs: the memo keeps missing it. Where that goes on forever (a running
# auxiliary loss held both replicated and partial drifts by a fraction of a microsecond per
# layer), elimination then serves every later layer. A transformer block's entry costs settle
# within three layers, where the A* (its later runs memo hits) is the faster of the two.
REPEATED_MISSES = 3

# Elimination orders by (segment structure, variable sizes); a few hundred at most are kept.
_ORDERS: dict[tuple, list[int]] = {}
_ORDERS_KEPT = 512

_ENTRY = -1   # the variable of the entry state (one of the frontier's states)


@dataclass
class _Factor:
    """A cost term: ``table[a, b, ...]`` over the variables ``scope`` (node offsets in the
    segment, :data:`_ENTRY`, or ``exit_var(slot)``)."""

    scope: tuple[int, ...]
    table: np.ndarray


class SegmentTooWide(Exception):
    """The elimination would build a table larger than :data:`MAX_TABLE_ENTRIES`."""


class SegmentEliminator:
    """One searcher's elimination solver: which segments it takes, and their transfers.

    A segment's optimum from a frontier is a min-plus product: the frontier's costs plus the
    segment's *transfer* (the cheapest way from each entry state to each exit state), which
    does not depend on those costs. The A* memo is keyed by the frontier's relative costs,
    and they can drift by a fraction of a microsecond per layer forever (a running auxiliary
    loss held both replicated and partial: neither state ever dominates the other), so the
    A* solves every layer again. A transfer is eliminated once per set of entry states and
    then serves every layer with a product and the choices of a few (entry, exit) pairs.

    It takes a segment that keeps :data:`WIDE_LIVE` activations live or is entered in
    :data:`WIDE_ENTRY` states, one that the A* cannot finish (in the searcher's hard set, or
    reaching the beam), and one whose entry states repeat with other relative costs (the memo
    missed it :data:`REPEATED_MISSES` times before), unless its elimination is too wide.
    """

    def __init__(self, searcher: Searcher) -> None:
        # Weak: the searcher holds this solver, and a cycle would keep a finished search's
        # memos alive until the cyclic collector runs (synthesize() pauses it).
        self._searcher = weakref.ref(searcher)
        self.transfers: dict[tuple, _Transfer | None] = {}
        self.misses: dict[tuple, int] = {}     # (segment, entry states) -> A* runs so far
        self.eliminations = 0       # transfers built (each one elimination)

    @property
    def searcher(self) -> Searcher:
        return self._searcher()

    def solve(self, seg: Segment, frontier: dict, base: float, *, hard: bool = False) -> dict | None:
        """The useful exits of ``seg`` from ``frontier`` as ``{exit state: (seconds past base,
        entry state, choices)}``, or None to leave the segment to the A* (or the beam)."""
        key = (seg.signature, tuple(sorted(frontier)))
        if key not in self.transfers:
            deadline = self.searcher.deadline
            if deadline is not None and time.perf_counter() > deadline:
                return None
            missed = self.misses.get(key, 0)
            if not (hard or seg.signature in self.searcher._hard or missed >= REPEATED_MISSES
                    or self._wide(seg, len(frontier))):
                self.misses[key] = missed + 1
                return None
            try:
                self.transfers[key] = _SegmentProblem(self.searcher, seg, key[1]).transfer()
                self.eliminations += 1
            except SegmentTooWide:
                self.transfers[key] = None
        transfer = self.transfers[key]
        return None if transfer is None else transfer.apply(frontier, base)


    def _wide(self, seg: Segment, entries: int) -> bool:
        live = self.searcher._live
        return entries >= WIDE_ENTRY or max(len(live[i]) for i in range(seg.start, seg.stop + 1)) >= WIDE_LIVE


def solve_by_elimination(searcher: Searcher, seg: Segment, frontier: dict, base: float) -> dict | None:
    """The optimum from ``frontier`` to every useful exit state of ``seg`` (see
    :meth:`SegmentEliminator.solve`), by one elimination; None when too wide."""
    try:
        return _SegmentProblem(searcher, seg, tuple(sorted(frontier))).transfer().apply(frontier, base)
    except SegmentTooWide:
        return None


class _Transfer:
    """A solved segment: ``seconds[e, x1, x2, ...]``, the cheapest way from entry state ``e``
    to the exit state whose values hold layout sets ``x1, x2, ...``; the elimination's argmin
    tables read the choices of any pair back."""

    def __init__(self, problem: _SegmentProblem, seconds: np.ndarray, steps: list) -> None:
        import numpy as np

        self.problem = problem
        self.seconds = seconds
        self.steps = steps
        self.exit_states = {index: problem.exit_state(index) for index in np.ndindex(*seconds.shape[1:])}
        self.paths: dict[tuple[int, tuple[int, ...]], tuple[State, float, list]] = {}

    def apply(self, frontier: dict, base: float) -> dict:
        import numpy as np

        entry_seconds = np.array([frontier[e][0] - base for e in self.problem.entries])
        total = self.seconds + entry_seconds.reshape((-1,) + (1,) * (self.seconds.ndim - 1))
        best_entry = np.argmin(total, axis=0)
        best = np.min(total, axis=0)
        useful = {self.exit_states[index]: (float(best[index]), index)
                  for index in zip(*np.nonzero(np.isfinite(best)))} if best.ndim else {(): (float(best), ())}
        useful = self.problem.searcher._prune_frontier(self.problem.seg, useful)
        result = {}
        for state, (seconds, index) in useful.items():
            index = tuple(int(i) for i in index)
            e = int(best_entry[index]) if best.ndim else int(best_entry)
            end, path_seconds, path = self._path(e, index)
            if end != state or abs(path_seconds + entry_seconds[e] - seconds) > 1e-9 * max(1.0, abs(seconds)):
                raise AssertionError(f"segment {self.problem.seg.signature}: the replayed choices "
                                     f"reach {end} for {path_seconds + entry_seconds[e]} s, not {state} "
                                     f"for {seconds} s")
            result[state] = (seconds, self.problem.entries[e], path)
        return result

    def _path(self, e: int, exits: tuple[int, ...]) -> tuple[State, float, list]:
        """(exit state, seconds, choices) of the cheapest way from entry ``e`` to ``exits``,
        replayed through the searcher's own moves."""
        hit = self.paths.get((e, exits))
        if hit is None:
            hit = self.paths[(e, exits)] = self.problem.replay(self.problem.read_back(self.steps, e, exits),
                                                                self.problem.entries[e])
        return hit


class _SegmentProblem:
    def __init__(self, searcher: Searcher, seg: Segment, entries: tuple[State, ...]) -> None:
        # Weak, as SegmentEliminator's: the searcher's transfers keep their problems.
        self._searcher = weakref.ref(searcher)
        self.seg = seg
        self.entries = entries
        self.n = seg.stop - seg.start
        self.tables = searcher._tables[seg.start:seg.stop]
        self.domain: dict[int, int] = {j: len(t) for j, t in enumerate(self.tables)}
        self.domain[_ENTRY] = len(self.entries)
        self.exit_live = searcher._live[seg.stop]
        self.exit_masks: dict[int, list[int]] = {}      # exit variable -> its masks, by index

    @property
    def searcher(self) -> Searcher:
        return self._searcher()

    def exit_var(self, slot: int) -> int:
        return self.n + slot

    def exit_state(self, index: tuple[int, ...]) -> State:
        return tuple(self.exit_masks[self.exit_var(slot)][i] for slot, i in enumerate(index))

    # ---- the terms -----------------------------------------------------------------------
    def factors(self) -> list[_Factor]:
        import numpy as np

        out = []
        for j, table in enumerate(self.tables):
            out.append(_Factor((j,), np.array([row[0] for row in table])))
        for vid, (start_var, start_masks), uses in self._values():
            out.append(self._value_factor(vid, start_var, start_masks, uses))
        return out

    def _values(self):
        """Per tracked activation: (vid, (variable its first copy depends on, mask per value
        of it), [(node offset, wanted code per strategy), ...] in the order the search pays)."""
        import numpy as np

        searcher, seg = self.searcher, self.seg
        starts: dict[int, tuple[int, np.ndarray]] = {}
        uses: dict[int, list[tuple[int, np.ndarray]]] = {}
        for slot, vid in enumerate(searcher._live[seg.start]):
            starts[vid] = (_ENTRY, np.array([state[slot] for state in self.entries], dtype=np.int64))
        for j, table in enumerate(self.tables):
            ns = searcher.space.nodes[seg.start + j]
            for pos_index, (_, _, _, vid) in enumerate(table[0][1]):
                wants = np.array([row[1][pos_index][2] for row in table], dtype=np.int64)
                uses.setdefault(vid, []).append((j, wants))
            after = set(searcher._live[seg.start + j + 1])
            for out_index, name in enumerate(ns.node.outputs):
                vid = searcher._vid[name]
                if vid in after:
                    codes = [searcher.code(strat.outputs[out_index]) for strat in ns.options]
                    starts[vid] = (j, np.left_shift(1, np.array(codes, dtype=np.int64)))
        for vid, start in starts.items():
            yield vid, start, uses.get(vid, [])

    def _value_factor(self, vid: int, start_var: int, start_masks: np.ndarray,
                      uses: list[tuple[int, np.ndarray]]) -> _Factor:
        """The seconds ``vid`` spends on layout changes, over its producer (or the entry) and
        its readers, replaying the search's rule: a wanted layout not held is converted from
        the cheapest copy held, and then held too. At the exit, its final layout set becomes
        a variable of its own."""
        import numpy as np

        scope = [start_var]
        mask = start_masks
        seconds = np.zeros(len(start_masks))
        entries = len(start_masks)
        for var, wants in uses:
            if var in scope:
                axis = scope.index(var)
            else:
                # A value read by many nodes (a state-space scan unrolled over the sequence reads
                # its parameters at every step) makes a term over all its readers: left to the
                # A* and the beam before the table is built, not after (4**14 entries is 2 GiB).
                entries *= self.domain[var]
                if entries > MAX_TABLE_ENTRIES:
                    raise SegmentTooWide(f"segment {self.seg.signature}: a value read by {len(uses)} nodes")
                scope.append(var)
                axis = len(scope) - 1
                mask = mask[..., None]
                seconds = seconds[..., None]
            want = wants.reshape([-1 if a == axis else 1 for a in range(len(scope))])
            seconds = seconds + _conversion_seconds(self.searcher, vid, mask, wants, want)
            mask = mask | (1 << want)
        shape = tuple(self.domain[v] for v in scope)
        seconds = np.broadcast_to(seconds, shape)
        if vid in self.exit_live:
            slot = self.exit_live.index(vid)
            mask = np.broadcast_to(mask, shape)
            masks = sorted(set(np.unique(mask).tolist()))
            var = self.exit_var(slot)
            self.exit_masks[var] = masks
            self.domain[var] = len(masks)
            index = np.searchsorted(np.array(masks), mask)
            table = np.full(shape + (len(masks),), math.inf)
            np.put_along_axis(table, index[..., None], seconds[..., None], axis=-1)
            return _Factor(tuple(scope) + (var,), table)
        return _Factor(tuple(scope), np.ascontiguousarray(seconds))

    # ---- elimination ---------------------------------------------------------------------
    def transfer(self) -> _Transfer:
        """Eliminate every node; what is left is the transfer over (entry, exit layouts)."""
        import numpy as np

        factors = self.factors()
        kept = (_ENTRY,) + tuple(self.exit_var(s) for s in range(len(self.exit_live)))
        if any(v not in self.domain for v in kept):
            raise AssertionError(f"segment {self.seg.signature}: an exit value has no term")
        steps: list[tuple[int, tuple[int, ...], np.ndarray]] = []
        for var in self._order(factors):
            touching = [f for f in factors if var in f.scope]
            factors = [f for f in factors if var not in f.scope]
            joined = self._join(touching)
            axis = joined.scope.index(var)
            rest = joined.scope[:axis] + joined.scope[axis + 1:]
            steps.append((var, rest, np.argmin(joined.table, axis=axis)))
            factors.append(_Factor(rest, np.min(joined.table, axis=axis)))
        final = self._join(factors + [_Factor(kept, np.zeros([self.domain[v] for v in kept]))], kept)
        return _Transfer(self, final.table, steps)

    def _order(self, factors: list[_Factor]) -> list[int]:
        """Node variables in greedy order: next, the one whose elimination builds the smallest
        table (ties: the earliest node). It depends on the segment's structure and the sizes of
        its variables only, so it is found once for every search of that shape."""
        key = (self.seg.signature, tuple(sorted(self.domain.items())), MAX_TABLE_ENTRIES)
        order = _ORDERS.get(key)
        if order is None:
            if len(_ORDERS) >= _ORDERS_KEPT:
                _ORDERS.clear()
            order = _ORDERS[key] = self._greedy_order(factors)
        if not order:
            raise SegmentTooWide(f"segment {self.seg.signature}: too wide to eliminate")
        return order

    def _greedy_order(self, factors: list[_Factor]) -> list[int]:
        """:meth:`_order`'s search; empty when some step would exceed :data:`MAX_TABLE_ENTRIES`."""
        neighbours: dict[int, set[int]] = {j: set() for j in range(self.n)}
        for f in factors:
            for v in f.scope:
                if v in neighbours:
                    neighbours[v].update(f.scope)
        for j in neighbours:
            neighbours[j].discard(j)
        order = []
        left = set(neighbours)
        while left:
            def size(j: int) -> int:
                return math.prod(self.domain[v] for v in neighbours[j]) * self.domain[j]
            var = min(left, key=lambda j: (size(j), j))
            if size(var) > MAX_TABLE_ENTRIES:
                return []
            order.append(var)
            left.discard(var)
            for a in neighbours[var]:
                if a in neighbours:
                    neighbours[a].update(neighbours[var])
                    neighbours[a].discard(a)
                    neighbours[a].discard(var)
            del neighbours[var]
        return order

    def _join(self, factors: list[_Factor], scope: tuple[int, ...] | None = None) -> _Factor:
        """The sum of ``factors`` as one table over the union of their scopes."""
        import numpy as np

        if scope is None:
            scope = tuple(dict.fromkeys(v for f in factors for v in f.scope))
        shape = [self.domain[v] for v in scope]
        total = np.zeros(shape)
        for f in factors:
            order = sorted(range(len(f.scope)), key=lambda a: scope.index(f.scope[a]))
            table = np.transpose(f.table, order)
            present = {f.scope[a] for a in order}
            total = total + table.reshape([self.domain[v] if v in present else 1 for v in scope])
        return _Factor(scope, total)

    # ---- reading the choices back --------------------------------------------------------
    def read_back(self, steps: list, entry: int, exits: tuple[int, ...]) -> list[int]:
        """Each node's strategy on the cheapest way from entry ``entry`` to exit ``exits``."""
        assignment = {_ENTRY: entry}
        for slot, index in enumerate(exits):
            assignment[self.exit_var(slot)] = index
        for var, rest, argmin in reversed(steps):
            assignment[var] = int(argmin[tuple(assignment[v] for v in rest)])
        return [assignment[j] for j in range(self.n)]

    def replay(self, options: list[int], entry: State) -> tuple[State, float, list]:
        """(exit state, seconds, choices) of taking ``options`` from ``entry``, move by move
        with the searcher's own prices and rules (sources included)."""
        from synth.search import Choice

        nodes = self.searcher.space.nodes
        state, seconds, path = entry, 0.0, []
        for j, k in enumerate(options):
            state, cost, k, sources = self.searcher._expand(nodes[self.seg.start + j], state)[k]
            seconds += cost
            path.append(Choice(k, sources))
        return state, seconds, path


def _conversion_seconds(searcher: Searcher, vid: int, mask: np.ndarray, codes: np.ndarray,
                        want: np.ndarray) -> np.ndarray:
    """Seconds to get layout ``want`` (one of ``codes``) from the copies in ``mask``,
    elementwise (0 where held), by the searcher's own cached conversion rule: priced once per
    distinct (held mask, wanted layout) pair."""
    import numpy as np

    held, inverse = np.unique(mask, return_inverse=True)
    wanted = np.unique(codes).tolist()
    table = np.zeros((len(held), max(wanted) + 1))
    convert = searcher._convert
    for row, m in enumerate(held.tolist()):
        for w in wanted:
            if not m >> w & 1:
                table[row, w] = convert(vid, m, w)[0]
    return table[inverse.reshape(mask.shape), want]
