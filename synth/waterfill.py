"""The ratio LP's answer for one segment, in closed form and without numpy.

With one segment, device ``r``'s time is ``a[r] * s[r] + b[r]`` and the shares sum to 1. The
leximin optimum :func:`synth.ratios.solve_shares` finds is then water-filling: every device
that gets work ends at one level ``T``, with ``s[r] = (T - b[r]) / a[r]``, and a device whose
fixed time ``b[r]`` already exceeds ``T`` gets none. ``T`` follows from the shares' sum. That
point is unique, and it is the one the LP's polishing step recomputes from the constraints it
meets (:func:`synth.ratios._polish`) before rounding every share to 12 significant digits;
here it is computed in exact rational arithmetic from the LP's own scaled coefficients, then
rounded the same way. The shares agree with the LP's to the last bit except where the exact
value lies within a few units in the last place of a 12-digit rounding boundary, where the
polished float can round either way and this one is the correctly rounded one.

This answers only where that reasoning holds cleanly: every time coefficient positive, no
memory limit binding or nearly binding, no share at or near 0 or 1, and no device with no
work at a time near the level (the LP's tolerances, ``1e-6``, would treat a nearly active
bound as active). Elsewhere it returns None and the caller solves the LP. ``hapc replan``
re-balances with it, so a replan need not import numpy and HiGHS (a fifth of a second).
"""

from __future__ import annotations

import math
from fractions import Fraction

from synth.loads import DeviceLoads

# Clear of the LP's own tolerances (synth.ratios: bounds and memory rows within 1e-6 count as
# active), so that whatever this accepts, the LP's polishing reproduces exactly.
MARGIN = 1e-5
_DIGITS = 12          # as synth.ratios rounds its shares
# How far (relative) the LP's polished shares may stray from the exact point before rounding.
BOUNDARY = 1e-13


def fill_shares(loads: DeviceLoads) -> tuple[float, ...] | None:
    """The shares :func:`synth.ratios.solve_shares` gives ``loads.problem()`` (see the module
    docstring), or None when the closed form does not settle them."""
    a, b = loads.a, loads.b
    n = len(a)
    # What ShareProblem would reject: the LP then says why.
    if n == 0 or not all(math.isfinite(x) and x >= 0 for x in (*a, *b, *loads.m, *loads.c)) or \
            any(math.isnan(x) or x < 0 for x in loads.capacity):
        return None
    if max(a) == 0:
        # Nothing scales with the shares: every share is optimal, and the LP's tie-break keeps
        # its reference, even shares (synth.ratios._closest_to_reference).
        exact = [Fraction(1, n)] * n
    elif min(a) > 0:
        exact = _levelled(a, b)
    else:           # some devices' work does not scale: the tie-break decides among many optima
        return None
    margin = Fraction(MARGIN)
    if exact is None or any(not margin < x < 1 - margin for x in exact if x):
        return None
    if not _memory_clear(loads, exact, margin):
        return None
    shares = [float(x) for x in exact]
    if any(_near_rounding_boundary(x) for x in shares):
        return None
    return tuple(_rounded(x) for x in shares)


def _levelled(a: tuple[float, ...], b: tuple[float, ...]) -> list[Fraction] | None:
    """The exact shares that bring every device with work to one level (each ``a`` positive),
    or None when a device without work has a fixed time too near that level to tell."""
    # The LP's rows (synth.ratios._Rows): times scaled so that the largest coefficient is 1.
    scale = max(max(a), max(b)) or 1.0
    ta = [Fraction(x / scale) for x in a]
    tb = [Fraction(x / scale) for x in b]
    working = list(range(len(a)))
    while True:
        level = (1 + sum(tb[r] / ta[r] for r in working)) / sum(1 / ta[r] for r in working)
        idle = [r for r in working if tb[r] >= level]
        if not idle:
            break
        working = [r for r in working if r not in idle]
    if any(tb[r] - level <= MARGIN for r in range(len(a)) if r not in working):
        return None
    return [(level - tb[r]) / ta[r] if r in working else Fraction(0) for r in range(len(a))]


def _rounded(x: float) -> float:
    return float(f"{x:.{_DIGITS}g}") + 0.0


def _near_rounding_boundary(x: float) -> bool:
    """Whether ``x`` is so close to halfway between two 12-digit values that the LP's answer,
    which is ``x`` only to its solver's accuracy (a relative 1e-13 in all but rare cases;
    see the tests), could round to the other one."""
    return _rounded(x * (1 - BOUNDARY)) != _rounded(x * (1 + BOUNDARY))


def _memory_clear(loads: DeviceLoads, shares: list[Fraction], margin: Fraction) -> bool:
    """Whether every device's memory row (the LP's, in units of the largest capacity) holds
    with room to spare at ``shares``."""
    limited = [r for r, cap in enumerate(loads.capacity) if math.isfinite(cap)]
    unit = max((loads.capacity[r] for r in limited if loads.capacity[r] > 0), default=1e9)
    for r in limited:
        room = Fraction((loads.capacity[r] - loads.c[r]) / unit)
        used = Fraction(loads.m[r] / unit) * shares[r]
        if room - used <= margin * max(1, room):
            return False
    return True
