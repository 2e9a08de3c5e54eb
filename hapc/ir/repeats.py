"""Tandem repeats: the longest stretch of a sequence that is one piece repeated back to back.

Both the program's layers (:mod:`hapc.ir.blocks`) and the per-layer rows of its tables
(:mod:`hapc.codegen.indexed`) are such stretches. Only the periods at which some token recurs
can be periods of a repeat, so the search tries the most frequent gaps between equal tokens
rather than every period: linear in the sequence per candidate, not quadratic.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

CANDIDATE_PERIODS = 24      # most frequent recurrence gaps tried


@dataclass(frozen=True)
class Repeat:
    """``tokens[start:stop]`` has period ``period`` (and so holds ``(stop - start) // period`` copies)."""

    start: int
    stop: int
    period: int

    @property
    def copies(self) -> int:
        return (self.stop - self.start) // self.period

    @property
    def saved(self) -> int:
        """Tokens a reader no longer reads when the repeat is written once."""
        return (self.copies - 1) * self.period


def longest_repeat(tokens: Sequence[Hashable], *, min_period: int = 1, min_copies: int = 2) -> Repeat | None:
    """The repeat that saves most tokens (ties: the shorter period, then the earlier start)."""
    ids = _intern(tokens)
    gaps: Counter[int] = Counter()
    last: dict[int, int] = {}
    for i, t in enumerate(ids):
        if t in last and i - last[t] >= min_period:
            gaps[i - last[t]] += 1
        last[t] = i
    best: Repeat | None = None
    for period, _ in gaps.most_common(CANDIDATE_PERIODS):
        for found in _runs(ids, period):
            if found.copies < min_copies:
                continue
            if best is None or (found.saved, -found.period, -found.start) > (best.saved, -best.period, -best.start):
                best = found
    return best


_SAME_RUN = re.compile(b"\x01+")


def _runs(ids: list[int], period: int) -> list[Repeat]:
    """Maximal stretches of period ``period``: runs of ``ids[i] == ids[i + period]`` (found by
    the regex engine in a byte per ``i``: this is the inner loop of every repeat search)."""
    same = bytes(map(operator.eq, ids, ids[period:]))
    return [Repeat(m.start(), m.end() + period, period) for m in _SAME_RUN.finditer(same)]


def _intern(tokens: Sequence[Hashable]) -> list[int]:
    table: dict[Hashable, int] = {}
    return [table.setdefault(t, len(table)) for t in tokens]
