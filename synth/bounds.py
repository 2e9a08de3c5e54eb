"""The lower bounds the A* of :mod:`synth.search` steers by, per segment.

:class:`ValueBound` is the heuristic: each live value's relaxed problem (the rest of the
segment with only that value's layouts tracked, handing on to the outputs of the nodes that
read it), solved exactly and kept per segment structure, so every later A* run of a repeated
segment looks its values up. :class:`TargetBound` is the same relaxation with the segment's
last node limited to the strategies that give one exit layout: once the exits a state could
still reach are all beaten, the A* stops expanding it. Both read the searcher's move tables
and conversion prices; tests/synth/test_search_bounds.py checks admissibility and consistency in
every reachable state of small models.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synth.search import Searcher, State
    from synth.space import Segment


class ValueBound:
    """An admissible, consistent heuristic for one segment that sees communication.

    The plain bound (every remaining node at its cheapest strategy's own price) ignores that
    a value held in the wrong layout must be moved before it is used. Here each live value
    gets its own relaxed problem: the rest of the segment solved exactly with *only that
    value's* layouts tracked (every other input is had for free, in any layout), handing on,
    at each node that reads it, to the outputs that node gives birth to (see :meth:`_solve`).
    Its optimum is a lower bound on the real cost to go, so the largest over the state's
    values is too; each step of it is bounded by the relaxations of the next state's values,
    so their maximum is consistent and A* still settles states in order. The tables are small
    (a value's layout sets times the segment's nodes) and built lazily, only for the masks
    states actually hold. tests/synth/test_search_bounds.py checks both properties in every
    reachable state of small models.
    """

    def __init__(self, searcher: Searcher, seg: Segment) -> None:
        self.searcher = searcher
        self.start, self.stop = seg.start, seg.stop
        nodes = searcher.space.nodes
        # floor[j]: every node from j to the segment's end at its cheapest own price.
        floor = [0.0] * (seg.stop - seg.start + 1)
        for j in range(seg.stop - 1, seg.start - 1, -1):
            floor[j - seg.start] = floor[j - seg.start + 1] + searcher._node_floor(nodes[j])
        self.floor = floor
        self.live = searcher._live
        self.live_sets = [set(searcher._live[j]) for j in range(seg.start, seg.stop + 1)]
        # Values by position in the segment (entry slot, then each node's outputs in order),
        # not by name: every instance of a repeated segment has the same relaxations, so one
        # memo per segment structure serves all of them (and every A* run of each).
        self.sid: dict[int, int] = {vid: k for k, vid in enumerate(searcher._live[seg.start])}
        for j in range(seg.start, seg.stop):
            for o in nodes[j].node.outputs:
                self.sid.setdefault(searcher._vid[o], len(self.sid))
        self.live_sids = [[self.sid[v] for v in searcher._live[j]] for j in range(seg.start, seg.stop + 1)]
        self.shared = searcher._relaxations.setdefault(seg.signature, {})
        self.memo: dict[tuple[int, int, int], float] = self.shared.setdefault("any", {})
        # Per node of the segment: state -> the heuristic's value there, filled by the A*.
        self.known: list[dict[State, float]] = self.shared.setdefault(
            "known", [{} for _ in range(seg.start, seg.stop + 1)])

    def of(self, i: int, state: State) -> float:
        """Lower bound on the cost from ``state`` before node ``i`` to any exit of the segment."""
        if i == self.stop:
            return 0.0
        at = i - self.start
        best = self.floor[at]
        memo = self.memo
        for slot, (sid, mask) in enumerate(zip(self.live_sids[at], state)):
            h = memo.get((sid, at, mask))
            if h is None:
                h = self._solve(self.live[i][slot], i, mask)
            if h > best:
                best = h
        return best

    def _solve(self, vid: int, i: int, mask: int, memo: dict | None = None,
               last_options: frozenset[int] | None = None, floor: list[float] | None = None) -> float:
        """Cost to go of the relaxation that tracks ``vid``, from ``mask`` before node ``i``.

        Only ``vid``'s layouts are tracked, and at each node that reads it, also the layouts
        the node's outputs are born in: after a move, the cost to go is at least the relaxation
        of ``vid`` (if still live) and of each output, from the masks the move leaves them in,
        so the larger of these is taken. Communication a value's readers pass on (a partial
        sum carried through a dropout to the residual add) is thus seen where it starts.
        Every term is a lower bound on the real cost to go, so the result is one too, and each
        term is the value a live value's own relaxation has in the next state: the heuristic
        stays consistent.

        ``last_options`` restricts the segment's last node to those strategies (with ``floor``
        and ``memo`` to match): the cost to reach an exit of a given layout, see
        :class:`TargetBound`.

        Iterative (segments can be long): a stack of (value, node, mask) still to price; a
        triple is priced once every successor it needs is in the memo."""
        memo = self.memo if memo is None else memo
        floor = self.floor if floor is None else floor
        rows_of = self.searcher._relaxation_rows
        conversion_miss = self.searcher._conversion_miss
        sid, start, stop, live_sets = self.sid, self.start, self.stop, self.live_sets
        stack = [(vid, i, mask)]
        while stack:
            v, j, m = stack[-1]
            sv = sid[v]
            key = (sv, j - start, m)
            if key in memo:
                stack.pop()
                continue
            last = j + 1 == stop
            after = j + 1 - start
            alive_after = not last and v in live_sets[after]
            floor_after = 0.0 if last else floor[after]
            best = math.inf
            missing = []
            for base, wants, born in rows_of(j, v, last_options if last else None):
                cost, m2 = base, m
                for bit, want, table in wants:
                    if not m2 & bit:
                        c = table.get(m2)
                        cost += conversion_miss(table, v, m2, want) if c is None else c
                        m2 |= bit
                rest = floor_after
                if not last:
                    if alive_after:
                        r = memo.get((sv, after, m2))
                        if r is None:
                            missing.append((v, j + 1, m2))
                        elif r > rest:
                            rest = r
                    for w, m3 in born:
                        r = memo.get((sid[w], after, m3))
                        if r is None:
                            missing.append((w, j + 1, m3))
                        elif r > rest:
                            rest = r
                if cost + rest < best:
                    best = cost + rest
            if missing:
                stack.extend(missing)
                continue
            memo[key] = best if best < math.inf else floor[j - start]
            stack.pop()
        return memo[(sid[vid], i - start, mask)]


class TargetBound:
    """Lower bounds on the cost to reach an exit of a *given* layout, to stop expanding states
    once the exits they could still reach are beaten.

    After the first exit of a segment, the A* keeps going only to find exits in other layouts
    (a replicated copy of the residual, say) that a settled exit cannot be converted into
    more cheaply. Its heuristic bounds the cost to *any* exit, so it keeps every state whose
    cost is below the dearest such conversion. Here the relaxation of :class:`ValueBound`
    is solved with the last node limited to the strategies that produce each target layout;
    a state whose bound to every target exceeds that target's limit reaches no exit that
    matters, and is dropped. Used where one value leaves the segment, born at its last node
    (a transformer block's residual), which is where the hardest segments end.
    """

    def __init__(self, vb: ValueBound, producers: dict[int, frozenset[int]]) -> None:
        self.vb = vb
        self.producers = producers          # target layout code -> strategies of the last node
        self.memos: dict[int, dict] = {code: vb.shared.setdefault(("exit", code), {}) for code in producers}
        # Per target layout and node of the segment: state -> _bound there (kept per structure).
        self.known: dict[int, list[dict[State, float]]] = {
            code: vb.shared.setdefault(("known", code), [{} for _ in vb.floor]) for code in producers}
        searcher = vb.searcher
        last = vb.stop - 1
        own = searcher._node_floor(searcher.space.nodes[last])
        self.floors: dict[int, list[float]] = {}
        for code, options in producers.items():
            cheapest = min(searcher._tables[last][k][0] for k in options)
            self.floors[code] = [f - own + cheapest for f in vb.floor[:-1]] + [0.0]

    @staticmethod
    def of_segment(searcher: Searcher, seg: Segment, vb: ValueBound) -> TargetBound | None:
        exit_values = searcher._live[seg.stop]
        last = seg.stop - 1
        if len(exit_values) != 1 or seg.stop - seg.start < 2:
            return None
        ns = searcher.space.nodes[last]
        outputs = [searcher._vid[o] for o in ns.node.outputs]
        if exit_values[0] not in outputs:
            return None
        pos = outputs.index(exit_values[0])
        producers: dict[int, set[int]] = {}
        for k, strat in enumerate(ns.options):
            producers.setdefault(searcher.code(strat.outputs[pos]), set()).add(k)
        return TargetBound(vb, {code: frozenset(ks) for code, ks in producers.items()})

    def useless(self, i: int, state: State, g: float, limits: dict[tuple[int, ...], float],
                h_any: float = 0.0) -> bool:
        """Does every exit reachable from ``state`` (before node ``i``, cost ``g`` so far) cost
        more than its layout's limit? ``h_any`` is the state's bound to any exit, which no
        bound to a given layout is below: a layout whose limit it already passes is not priced."""
        at = i - self.vb.start
        for (code,), limit in limits.items():
            known = self.known.get(code)
            if known is None or g + h_any > limit + 1e-15:
                continue                         # the last node cannot produce this layout, or beaten
            h = known[at].get(state)
            if h is None:
                h = known[at][state] = self._bound(code, i, state)
            if h <= limit + 1e-15 - g:
                return False
        return True

    def _bound(self, code: int, i: int, state: State) -> float:
        """Lower bound on the cost from ``state`` before node ``i`` to an exit in layout ``code``."""
        memo, options, floor = self.memos[code], self.producers[code], self.floors[code]
        vb = self.vb
        at = i - vb.start
        best = floor[at]
        for slot, (sid, mask) in enumerate(zip(vb.live_sids[at], state)):
            h = memo.get((sid, at, mask))
            if h is None:
                h = vb._solve(vb.live[i][slot], i, mask, memo, options, floor)
            if h > best:
                best = h
        return best
