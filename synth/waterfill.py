"""The ratio LP's answer for one segment, in closed form and without numpy.

With one segment, device ``r``'s time is ``a[r] * s[r] + b[r]``, its memory ``m[r] * s[r] +
c[r]`` must stay within its capacity, which caps its share at some ``u[r]``, and the shares
sum to 1. The leximin optimum :func:`synth.ratios.solve_shares` finds is then water-filling:
there is one level ``T`` such that each device gets ``(T - b[r]) / a[r]`` clamped to ``[0,
u[r]]``, ``T`` being where those shares sum to 1 (a device whose fixed time ``b[r]`` exceeds
``T`` gets none, a capped one its cap). That point is unique, and it is the one the LP's
polishing step recomputes from the constraints it meets (:func:`synth.ratios._polish`) before
rounding every share to 12 significant digits; here it is computed in exact rational
arithmetic from the LP's own scaled rows, then rounded the same way.

The LP's polished point is exact only to its solver's accuracy (a relative 1e-14 at worst in
our replans, 1e-11 in contrived problems), so where the exact share lies within ``BOUNDARY``
of halfway between two 12-digit values its rounding could go either way, and this declines.
It also declines where the reasoning above does not hold cleanly: a device with no sharded
work beside ones with some (the LP's tie-break decides), memory that fits at no shares, a
bound or limit nearly active without being active (the LP's tolerances, ``1e-6``, would
treat it as active), a share at or near 1. The caller then solves the LP. ``hapc replan``
re-balances with this, so a replan need not import numpy and HiGHS (a fifth of a second).
"""

from __future__ import annotations

import math
from fractions import Fraction

from synth.loads import DeviceLoads, round_share

# Clear of the LP's own tolerances (synth.ratios: bounds and memory rows within 1e-6 count as
# active), so that whatever this accepts, the LP's polishing reproduces exactly.
MARGIN = Fraction(1, 10**5)
# How far the LP's polished shares may stray from the exact point before rounding: relative,
# plus a floor for tiny shares, each times _conditioning. Four times the worst seen in replans
# of the golden models and GPT-48 (5e-15 relative, 8.5e-16 absolute, at conditioning 1);
# contrived problems (identical devices split by their capacities) can exceed it.
BOUNDARY = 2e-14
ERROR_FLOOR = 1e-15


def fill_shares(loads: DeviceLoads) -> tuple[float, ...] | None:
    """The shares :func:`synth.ratios.solve_shares` gives ``loads.problem()`` (see the module
    docstring), or None when the closed form does not settle them."""
    a, b = loads.a, loads.b
    n = len(a)
    # What ShareProblem would reject: the LP then says why.
    if n == 0 or not all(math.isfinite(x) and x >= 0 for x in (*a, *b, *loads.m, *loads.c)) or \
            any(math.isnan(x) or x < 0 for x in loads.capacity):
        return None
    rows = _MemoryRows(loads)
    if rows.room is None or not rows.caps_clear_of_zero():
        return None
    if max(a) == 0:
        # Nothing scales with the shares: every share is optimal, and the LP's tie-break keeps
        # its reference, even shares (synth.ratios._closest_to_reference).
        exact: list[Fraction] | None = [Fraction(1, n)] * n
        capped: set[int] = set()
    elif min(a) > 0:
        exact, capped = _levelled(a, b, rows.caps())
    else:           # some devices' work does not scale: the tie-break decides among many optima
        return None
    if exact is None or any(not MARGIN < x < 1 - MARGIN for x in exact if x):
        return None
    if not rows.clear(exact, capped):
        return None
    shares = [float(x) for x in exact]
    if any(x and _near_rounding_boundary(x, _conditioning(a, b)) for x in shares):     # (a 0 is exact)
        return None
    return tuple(round_share(x) for x in shares)


class _MemoryRows:
    """The LP's memory rows (:class:`synth.ratios._Rows`): per device with a finite capacity,
    ``used = m / unit * share <= room = (capacity - c) / unit``, in units of the largest
    capacity, from the same float operations, then exact. ``room`` is None when some device
    has no room at all (nothing fits: the LP says how much is missing)."""

    def __init__(self, loads: DeviceLoads) -> None:
        limited = [r for r, cap in enumerate(loads.capacity) if math.isfinite(cap)]
        unit = max((loads.capacity[r] for r in limited if loads.capacity[r] > 0), default=1e9)
        self.slope = {r: Fraction(loads.m[r] / unit) for r in limited}
        room = {r: Fraction((loads.capacity[r] - loads.c[r]) / unit) for r in limited}
        self.room = None if any(x < 0 for x in room.values()) else room
        self._devices = len(loads.a)

    def caps(self) -> list[Fraction | None]:
        """Each device's largest share within its memory (None: no cap below 1, where the
        share's own bound, which no accepted answer comes near, takes over)."""
        assert self.room is not None
        out: list[Fraction | None] = []
        for r in range(self._devices):
            slope = self.slope.get(r, Fraction(0))
            cap = self.room[r] / slope if slope > 0 else None
            out.append(cap if cap is not None and cap < 1 else None)
        return out

    def caps_clear_of_zero(self) -> bool:
        """Whether every cap leaves a device a share clear of 0 (a zero cap would make two
        bounds of its share active at once)."""
        return all(cap is None or cap > MARGIN for cap in self.caps())

    def clear(self, shares: list[Fraction], capped: set[int]) -> bool:
        """Whether each row holds with room to spare, save those of the ``capped`` devices,
        which hold exactly."""
        assert self.room is not None
        return all(room - self.slope[r] * shares[r] > MARGIN * max(1, room)
                   for r, room in self.room.items() if r not in capped)


def _levelled(a: tuple[float, ...], b: tuple[float, ...], caps: list[Fraction | None]
              ) -> tuple[list[Fraction] | None, set[int]]:
    """The exact water-filling shares (each ``a`` positive) under ``caps`` and the devices at
    their cap; None for the shares when nothing fits, or when a device is so near the level at
    the edge of its range (no work, or its cap) that the LP could take either side."""
    # The LP's rows (synth.ratios._Rows): times scaled so that the largest coefficient is 1.
    scale = max(max(a), max(b)) or 1.0
    ta = [Fraction(x / scale) for x in a]
    tb = [Fraction(x / scale) for x in b]
    n = len(a)
    full = [None if caps[r] is None else tb[r] + ta[r] * caps[r] for r in range(n)]    # the level it caps at

    def total(level: Fraction) -> Fraction:
        return sum((_clamp((level - tb[r]) / ta[r], caps[r]) for r in range(n)), Fraction(0))

    # The shares' sum grows with the level, piecewise linearly between these points.
    points = sorted({*tb, *(x for x in full if x is not None)})
    above = next((p for p in points if total(p) >= 1), None)
    if above is None and all(x is not None for x in full):
        return None, set()                  # even every device at its cap holds less than all
    # On the piece that ends at ``above``, the devices with work but not capped set the slope.
    below = max((p for p in points if above is None or p < above), default=points[0])
    moving = [r for r in range(n) if tb[r] <= below and (full[r] is None or full[r] > below)]
    level = below + (1 - total(below)) / sum(1 / ta[r] for r in moving)
    capped = {r for r in range(n) if full[r] is not None and full[r] <= level}
    if any(abs(level - tb[r]) <= MARGIN or (full[r] is not None and abs(level - full[r]) <= MARGIN)
           for r in range(n)):
        return None, set()
    return [_clamp((level - tb[r]) / ta[r], caps[r]) for r in range(n)], capped


def _clamp(share: Fraction, cap: Fraction | None) -> Fraction:
    return max(Fraction(0), share if cap is None else min(share, cap))


def _conditioning(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    """How much the LP's least squares lose to the smallest scaled time coefficient (1 when it
    is 1): the polished shares' error grows as it shrinks."""
    scale = max(max(a), max(b)) or 1.0
    return scale / min((x for x in a if x > 0), default=scale)


def _near_rounding_boundary(x: float, conditioning: float) -> bool:
    """Whether ``x`` is so close to halfway between two 12-digit values that the LP's answer,
    which is ``x`` only to its solver's accuracy, could round to the other one."""
    error = (BOUNDARY * x + ERROR_FLOOR) * conditioning
    return round_share(x - error) != round_share(x + error)
