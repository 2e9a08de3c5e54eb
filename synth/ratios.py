"""The ratio LP: how much of the sharded work each device gets, for a fixed program.

For a fixed program every device's time is affine in its shares, ``T_r = sum_k a[k,r] s[k,r]
+ b[r]`` (``a``: seconds of all sharded work of segment ``k`` at share 1; ``b``: seconds that
do not scale), and so is its memory, ``M_r = sum_k m[k,r] s[k,r] + c[r]`` bytes. The step
time is the slowest device's, so we minimise ``max_r T_r`` subject to ``M_r <= capacity_r``
and each segment's shares summing to 1: a small LP (HAP had no memory rows).

The minimum of ``max_r T_r`` rarely pins the shares down: devices off the critical path
have slack, and with several segments work can move between them at no cost. Plan files
must be byte-identical run to run and backend to backend, so we pick one optimum by rule:
the *leximin* times (after the slowest device, make the next slowest as fast as possible,
and so on; found with one LP per level, fixing the devices whose time row has a positive
dual), then, if shares are still free, the shares closest (weighted L1) to
proportional-to-speed. Solvers return that point to their own accuracy (CBC: 8 digits), so
we recompute it exactly from the constraints it meets (``_polish``) and round to 12
significant digits: every backend then gives the same floats.

Backends: ``"highs"`` (scipy, default), ``"pulp"`` (bundled CBC) and ``"cvxpy"``; tests
cross-check them because a wrong LP would silently give slow plans.
"""

from __future__ import annotations

import functools
import warnings
from collections import namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from synth.loads import MemoryInfeasible, round_share


class BackendUnavailable(RuntimeError):
    """The requested LP backend (or any LP solver for it) is not installed."""


@dataclass(frozen=True, eq=False)
class ShareProblem:
    """Affine time and memory per device; ``a``/``m``/``has_work`` are [segments, devices]
    (1-D means one segment), the rest [devices]. ``m``/``c`` default to 0 and ``capacity``
    to unlimited. ``has_work[k, r]`` false pins device r's share of segment k to 0; where
    true the share is at least ``min_share`` (a device in the group must hold a piece)."""

    a: np.ndarray
    b: np.ndarray
    m: np.ndarray | None = None
    c: np.ndarray | None = None
    capacity: np.ndarray | None = None
    device_names: Sequence[str] | None = None
    min_share: float = 0.0
    has_work: np.ndarray | None = None

    def __post_init__(self) -> None:
        a = np.atleast_2d(np.array(self.a, dtype=float))
        k, n = a.shape
        given = {"a": a, "b": self.b, "m": np.zeros((k, n)) if self.m is None else self.m,
                 "c": np.zeros(n) if self.c is None else self.c,
                 "capacity": np.full(n, np.inf) if self.capacity is None else self.capacity,
                 "has_work": np.ones((k, n)) if self.has_work is None else self.has_work}
        for name, value in given.items():
            arr = np.array(value, dtype=bool if name == "has_work" else float)
            arr = np.atleast_2d(arr) if name in ("a", "m", "has_work") else arr
            if arr.shape != ((k, n) if name in ("a", "m", "has_work") else (n,)):
                raise ValueError(f"{name} has shape {arr.shape}; a is [segments, devices] = "
                                 f"{(k, n)}")
            if name != "has_work" and (np.any(np.isnan(arr)) or np.any(arr < 0) or
                                       (name != "capacity" and not np.all(np.isfinite(arr)))):
                raise ValueError(f"{name} must be non-negative and finite (capacity may be inf)")
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        names = tuple(self.device_names or (f"device{r}" for r in range(n)))
        if len(names) != n:
            raise ValueError(f"{len(names)} device names for {n} devices")
        object.__setattr__(self, "device_names", names)
        active = self.has_work.sum(axis=1)
        if not 0.0 <= self.min_share < 1.0 or np.any(active == 0) or \
                np.any(active * self.min_share > 1 + 1e-12):
            raise ValueError("every segment needs a device with work, and room for min_share "
                             f"({self.min_share}) on each")

    @property
    def segments(self) -> int:
        return self.a.shape[0]

    @property
    def devices(self) -> int:
        return self.a.shape[1]

    def device_seconds(self, shares: np.ndarray) -> np.ndarray:
        return (self.a * shares).sum(axis=0) + self.b

    def device_bytes(self, shares: np.ndarray) -> np.ndarray:
        return (self.m * shares).sum(axis=0) + self.c


@dataclass(frozen=True, eq=False)
class ShareSolution:
    """Shares [segments, devices], the resulting step time (``seconds``, the slowest device)
    and per-device seconds and bytes at those shares."""

    shares: np.ndarray
    seconds: float
    device_seconds: np.ndarray
    device_bytes: np.ndarray
    backend: str
    status: str = "optimal"
    names: tuple[str, ...] = field(default=(), repr=False)

    def device_shares(self, world: int) -> tuple[float, ...]:
        """Each device's share as plain floats (a program's shares), from a one-segment problem."""
        return tuple(float(x) for x in np.asarray(self.shares).reshape(-1)[:world])

    def __repr__(self) -> str:
        per = ", ".join(f"{n}: {'/'.join(f'{s:.3g}' for s in self.shares[:, r])}"
                        for r, n in enumerate(self.names or range(self.shares.shape[1])))
        return f"ShareSolution({self.seconds:.4g} s via {self.backend}; shares {per})"


def proportional_shares(speeds: Sequence[float]) -> list[float]:
    """Shares proportional to speed: the ``dp-flops`` baseline and the LP's tie-breaker."""
    total = float(sum(speeds))
    if len(speeds) == 0 or min(speeds) < 0 or total <= 0:
        raise ValueError(f"speeds must be non-negative with a positive sum, got {list(speeds)}")
    return [float(s) / total for s in speeds]


def even_shares(n: int) -> list[float]:
    """Equal shares for ``n`` devices: the ``dp-even`` baseline."""
    if n < 1:
        raise ValueError(f"need at least one device, got {n}")
    return [1.0 / n] * n


# ---- LP in matrix form and the three backends ------------------------------------------

# minimise cost @ x  s.t.  a_ub @ x <= b_ub,  a_eq @ x == b_eq,  lower <= x <= upper.
_LP = namedtuple("_LP", "cost a_ub b_ub a_eq b_eq lower upper")

# A backend returns (status, x, |dual| of each <= row); status "optimal" or "infeasible".
_Result = tuple[str, np.ndarray | None, np.ndarray | None]


def _highs(lp: _LP) -> _Result:
    from scipy.optimize import linprog
    res = linprog(lp.cost, A_ub=lp.a_ub, b_ub=lp.b_ub, A_eq=lp.a_eq, b_eq=lp.b_eq,
                  bounds=list(zip(lp.lower, lp.upper)), method="highs")
    if res.status == 2:
        return "infeasible", None, None
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on the ratio LP: {res.message}")
    return "optimal", res.x, np.abs(res.ineqlin.marginals)


def _pulp(lp: _LP) -> _Result:
    try:
        import pulp
    except ImportError as exc:
        raise BackendUnavailable("pulp is not installed") from exc
    prob = pulp.LpProblem("ratios", pulp.LpMinimize)
    xs = [prob.add_variable(f"x{i}", None if np.isinf(lo) else lo, None if np.isinf(hi) else hi)
          for i, (lo, hi) in enumerate(zip(lp.lower, lp.upper))]

    def expr(row: np.ndarray):
        return pulp.lpSum(float(v) * xs[i] for i, v in enumerate(row) if v != 0)

    prob += expr(lp.cost)
    for i, (row, rhs) in enumerate(zip(lp.a_ub, lp.b_ub)):
        prob += (expr(row) <= float(rhs), f"ub{i}")
    for i, (row, rhs) in enumerate(zip(lp.a_eq, lp.b_eq)):
        prob += (expr(row) == float(rhs), f"eq{i}")
    with warnings.catch_warnings():  # PuLP 3.3 deprecates the bundled CBC we want
        warnings.simplefilter("ignore", DeprecationWarning)
        status = pulp.LpStatus[prob.solve(pulp.PULP_CBC_CMD(msg=False))]
    if status == "Infeasible":
        return "infeasible", None, None
    if status != "Optimal":
        raise RuntimeError(f"CBC failed on the ratio LP: {status}")
    duals = [prob.get_constraint_by_name(f"ub{i}").pi or 0.0 for i in range(len(lp.b_ub))]
    return "optimal", np.array([x.value() or 0.0 for x in xs]), np.abs(np.array(duals))


@functools.cache
def _cvxpy_solver() -> str:
    try:
        import cvxpy as cp
    except ImportError as exc:
        raise BackendUnavailable("cvxpy is not installed") from exc
    for name in ("HIGHS", "CLARABEL", "ECOS", "SCIPY", "GLPK", "SCS"):
        if name in cp.installed_solvers():
            return name
    raise BackendUnavailable("cvxpy has no LP-capable solver installed")


def _cvxpy(lp: _LP) -> _Result:
    solver = _cvxpy_solver()
    import cvxpy as cp
    x = cp.Variable(len(lp.cost))
    ub = lp.a_ub @ x <= lp.b_ub
    cons = [ub, lp.a_eq @ x == lp.b_eq]
    lo, hi = np.isfinite(lp.lower), np.isfinite(lp.upper)
    cons += [x[lo] >= lp.lower[lo]] if lo.any() else []
    cons += [x[hi] <= lp.upper[hi]] if hi.any() else []
    prob = cp.Problem(cp.Minimize(lp.cost @ x), cons)
    prob.solve(solver=solver)
    if prob.status in ("infeasible", "infeasible_inaccurate"):
        return "infeasible", None, None
    if prob.status not in ("optimal", "optimal_inaccurate"):
        raise RuntimeError(f"cvxpy failed on the ratio LP: {prob.status}")
    return "optimal", np.asarray(x.value), np.abs(np.asarray(ub.dual_value))


def _highspy(lp: _LP) -> _Result:
    """HiGHS without importing scipy.optimize (``hapc replan``'s start-up): see synth.lp_highspy."""
    from synth import lp_highspy

    if not lp_highspy.available():
        raise BackendUnavailable("highspy is not installed")
    return lp_highspy.solve(lp)


_Solver = Callable[[_LP], _Result]
_BACKENDS: dict[str, _Solver] = {"highs": _highs, "pulp": _pulp, "cvxpy": _cvxpy, "highspy": _highspy}


def available_backends() -> list[str]:
    """The backends that can run here (tests skip the others, saying why)."""
    out = ["highs"]
    for name, probe in (("pulp", lambda: __import__("pulp")), ("cvxpy", _cvxpy_solver),
                        ("highspy", lambda: __import__("highspy._core"))):
        try:
            probe()
        except (ImportError, BackendUnavailable):
            continue
        out.append(name)
    return out


# ---- the ratio LP ----------------------------------------------------------------------

def solve_shares(problem: ShareProblem, backend: str = "highs") -> ShareSolution:
    """Minimise the slowest device's seconds over the shares, within memory capacity.

    Raises :class:`MemoryInfeasible` (a user error) when no shares fit, naming how many GB
    are missing on which devices.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"unknown LP backend {backend!r}; choose from {sorted(_BACKENDS)}")
    return _solve_shares(problem, backend, device_classes(problem))


def _solve_shares(problem: ShareProblem, backend: str, classes: list[list[int]]) -> ShareSolution:
    """:func:`solve_shares` with one share variable per class of ``classes`` (singletons: the
    per-device LP, which tests compare with)."""
    p, solve, rows = _per_class(problem, classes), _BACKENDS[backend], _Rows(problem, classes)
    n_dev, ns = p.devices, rows.ns
    level = np.full(n_dev, np.nan)  # leximin time fixed for each device (scaled seconds)
    round_of = np.full(n_dev, -1)  # the LP round that fixed it: devices at one level
    relax = 0.0
    while np.isnan(level).any():
        free = np.isnan(level)
        status, x, duals = solve(rows.lp([1.0], [(rows.time, -free[:, None].astype(float),
                                                  np.where(free, -rows.b, level + relax - rows.b))],
                                         [-np.inf], [np.inf]))
        if status == "infeasible":
            if free.all():
                raise _memory_infeasible(problem, rows, solve)
            if relax > 1e-6:
                raise RuntimeError(f"ratio LP lost feasibility while fixing levels ({backend})")
            relax = max(relax * 10, 1e-12)  # the solver's last digits; rarely needed
            continue
        # Time-row duals sum to 1; a positive one proves that device is at the level in
        # every optimum. Fix it at the time the solution gives it, which that solution
        # meets exactly, so the next round is feasible without a slack to exploit.
        d = np.where(free, duals[:n_dev], -1.0)
        blocked = free & (d > 1e-7)
        if not blocked.any():
            blocked = np.arange(n_dev) == int(np.argmax(d))
        level[blocked] = (rows.time @ x[:ns] + rows.b)[blocked]
        round_of[blocked] = round_of.max() + 1
    shares, tie_break = x[:ns], p.segments > 1 or bool(np.any(p.has_work & (p.a == 0)))
    if tie_break:
        shares = _closest_to_reference(rows, level + relax, solve)
    shares = _polish(rows, shares, round_of, level + relax, tie_break)
    shares = np.clip(shares, rows.lower, rows.upper).reshape(p.segments, n_dev)
    shares[np.abs(shares) < 1e-12] = 0.0  # solver dust
    shares = np.vectorize(round_share)(shares)
    shares = shares[:, _class_of(classes, problem.devices)]      # every device its class's share
    shares.setflags(write=False)
    seconds = problem.device_seconds(shares)
    return ShareSolution(shares, float(seconds.max()), seconds, problem.device_bytes(shares),
                         backend, "optimal", tuple(problem.device_names))


def device_classes(problem: ShareProblem) -> list[list[int]]:
    """Devices the LP cannot tell apart, in order of first appearance: equal time, memory,
    capacity and has-work columns (exactly equal floats).

    The LP gets one share variable per class, standing for every member's (equal) share.
    This loses nothing. The feasible set is convex and symmetric under swapping two devices
    of a class, and so is every objective of the leximin sequence; averaging a solution over
    those swaps gives a feasible point with equal shares inside each class whose time vector
    is no worse at any level (each time is affine in the shares). The leximin time vector is
    moreover unique, so identical devices end at equal times, hence (where time grows with
    share) at equal shares: the per-class LP finds the very point the per-device LP would.
    Only where the tie-break has to choose among equally good points may it choose another
    of them (the symmetric one). On 256 devices of two kinds the LP has 2 variables, not 256.
    """
    key_of: dict[tuple, int] = {}
    classes: list[list[int]] = []
    for r in range(problem.devices):
        key = (problem.a[:, r].tobytes(), float(problem.b[r]), problem.m[:, r].tobytes(), float(problem.c[r]),
               float(problem.capacity[r]), problem.has_work[:, r].tobytes())
        c = key_of.setdefault(key, len(classes))
        if c == len(classes):
            classes.append([])
        classes[c].append(r)
    return classes


def _class_of(classes: list[list[int]], devices: int) -> np.ndarray:
    out = np.zeros(devices, dtype=int)
    for c, members in enumerate(classes):
        out[members] = c
    return out


def _per_class(p: ShareProblem, classes: list[list[int]]) -> ShareProblem:
    """The problem over one representative per class (the first member); :class:`_Rows`
    weighs each column by its class's size."""
    first = [members[0] for members in classes]
    if len(first) == p.devices:
        return p
    reduced = object.__new__(ShareProblem)      # already validated as a whole; a slice of it
    for name, value in (("a", p.a[:, first]), ("b", p.b[first]), ("m", p.m[:, first]), ("c", p.c[first]),
                        ("capacity", p.capacity[first]), ("has_work", p.has_work[:, first]),
                        ("device_names", tuple(p.device_names[r] for r in first)), ("min_share", p.min_share)):
        object.__setattr__(reduced, name, value)
    return reduced


class _Rows:
    """The problem's rows over the flattened shares (index ``k * devices + r``): times
    scaled so the largest coefficient is 1, memory in units of the
    largest capacity (one row per capped device)."""

    def __init__(self, whole: ShareProblem, classes: list[list[int]]) -> None:
        p = _per_class(whole, classes)
        k_seg, n_dev = p.a.shape
        self.ns = ns = k_seg * n_dev
        # Each column is a class of identical devices; ``count`` of them share its variable.
        self.count = np.array([len(members) for members in classes], dtype=float)
        self.members = classes          # the device indices of each class
        scale = max(float(p.a.max()), float(p.b.max())) or 1.0
        self.b = p.b / scale
        self.time = np.zeros((n_dev, ns))
        self.eq = np.zeros((k_seg, ns))
        for k in range(k_seg):
            self.eq[k, k * n_dev:(k + 1) * n_dev] = self.count
            self.time[np.arange(n_dev), k * n_dev + np.arange(n_dev)] = p.a[k] / scale
        self.limited = [r for r in range(n_dev) if np.isfinite(p.capacity[r])]
        # Memory rows in units of the largest capacity, so that they are O(1) for a 2 KB device as
        # for an 80 GB one: in fixed GB a tiny model's overflow sat below the solver's tolerance.
        caps = [float(p.capacity[r]) for r in self.limited]
        self.mem_unit_bytes = max([c for c in caps if c > 0], default=1e9)
        self.mem_a = np.zeros((len(self.limited), ns))
        for i, r in enumerate(self.limited):
            self.mem_a[i, r::n_dev] = p.m[:, r] / self.mem_unit_bytes
        self.mem_cap = np.array([(p.capacity[r] - p.c[r]) / self.mem_unit_bytes for r in self.limited])
        self.lower = np.where(p.has_work, p.min_share, 0.0).ravel()
        self.upper = p.has_work.astype(float).ravel()
        ref = np.zeros((k_seg, n_dev))
        for k in range(k_seg):
            zero_cost = p.has_work[k] & (p.a[k] == 0)
            speed = zero_cost if zero_cost.any() else \
                np.where(p.has_work[k], 1.0 / np.where(p.a[k] > 0, p.a[k], 1.0), 0.0)
            ref[k] = speed / (speed * self.count).sum()
        self.reference = ref.ravel()

    def lp(self, extra_cost, ub, extra_lower, extra_upper, memory_rows: bool = True) -> _LP:
        """An LP over the shares plus ``len(extra_cost)`` extra variables (costed; shares
        cost nothing). ``ub`` lists blocks ``(share coefficients, extra coefficients, rhs)``;
        segment sums, share bounds and (unless told not to) memory rows are always in."""
        n_x = len(extra_cost)
        if memory_rows:
            ub = [*ub, (self.mem_a, np.zeros((len(self.mem_cap), n_x)), self.mem_cap)]
        return _LP(np.concatenate([np.zeros(self.ns), extra_cost]),
                   np.vstack([np.hstack([s, e]) for s, e, _ in ub]),
                   np.concatenate([rhs for _, _, rhs in ub]),
                   np.hstack([self.eq, np.zeros((len(self.eq), n_x))]), np.ones(len(self.eq)),
                   np.concatenate([self.lower, extra_lower]),
                   np.concatenate([self.upper, extra_upper]))


def _closest_to_reference(rows: _Rows, level: np.ndarray, solve: _Solver) -> np.ndarray:
    """At the leximin times, the shares nearest (L1) to proportional-to-speed: pins down
    the work that can move between segments at no cost.

    Equal weights would tie whenever the free moves are symmetric (identical devices,
    speeds in proportion across segments) and each solver would return its own vertex.
    Weights ``1 + sqrt(prime)/1000`` admit no rational relation, so no move can leave the
    weighted distance unchanged: the optimum is one point, whatever the solver.
    """
    ns, eye = rows.ns, np.eye(rows.ns)
    weights = np.tile(rows.count, ns // len(rows.count)) * (1.0 + np.sqrt(_primes(ns)) / 1000)
    status, x, _ = solve(rows.lp(weights, [
        (rows.time, np.zeros((len(level), ns)), level - rows.b),
        (eye, -eye, rows.reference), (-eye, -eye, -rows.reference)],
        np.zeros(ns), np.full(ns, np.inf)))
    if status != "optimal":
        raise RuntimeError("ratio LP: tie-breaking stage lost feasibility")
    return x[:ns]


def _primes(n: int) -> np.ndarray:
    found: list[int] = []
    candidate = 2
    while len(found) < n:
        if all(candidate % q for q in found if q * q <= candidate):
            found.append(candidate)
        candidate += 1
    return np.array(found, dtype=float)


def _polish(rows: _Rows, x: np.ndarray, round_of: np.ndarray, level: np.ndarray,
            tie_break: bool, tight: float = 1e-6) -> np.ndarray:
    """The exact point behind a solver's answer, so every backend returns the same floats
    (CBC reports 8 digits, HiGHS and cvxpy differ in the last few).

    Unknowns: the shares and one time per leximin level. Equations: segment sums, each
    device's time equal to its level, and every bound, memory row and (if the tie-break
    ran) reference distance that ``x`` meets within ``tight``. When they pin down a single
    point near ``x`` that is feasible, that is the answer; otherwise ``x`` stands.
    """
    ns, n_lv = rows.ns, int(round_of.max()) + 1
    eye, levels = np.eye(ns), np.eye(n_lv)[round_of]
    near = [(np.abs(x - rows.lower) <= tight, eye, rows.lower),
            (np.abs(x - rows.upper) <= tight, eye, rows.upper),
            (np.abs(rows.mem_a @ x - rows.mem_cap) <= tight * np.maximum(1, rows.mem_cap),
             rows.mem_a, rows.mem_cap)]
    if tie_break:
        near.append((np.abs(x - rows.reference) <= tight, eye, rows.reference))
    a = np.vstack([np.hstack([rows.eq, np.zeros((len(rows.eq), n_lv))]),
                   np.hstack([rows.time, -levels]),
                   *(np.hstack([m[on], np.zeros((int(on.sum()), n_lv))]) for on, m, _ in near)])
    b = np.concatenate([np.ones(len(rows.eq)), -rows.b, *(v[on] for on, _, v in near)])
    sol, _, rank, _ = np.linalg.lstsq(a, b, rcond=None)
    s = sol[:ns]
    exact = rank == ns + n_lv and np.abs(a @ sol - b).max() <= 1e-10 and \
        np.abs(s - x).max() <= 10 * tight and np.all(s >= rows.lower - 1e-12) and \
        np.all(s <= rows.upper + 1e-12) and \
        np.all(rows.mem_a @ s <= rows.mem_cap + 1e-9 * np.maximum(1, rows.mem_cap)) and \
        np.all(rows.time @ s + rows.b <= level + tight)
    return s if exact else x


def _memory_infeasible(p: ShareProblem, rows: _Rows, solve: _Solver) -> MemoryInfeasible:
    """Why nothing fits: the least total overflow (GB, one variable per capped device), then,
    at that total, the most even spread of it, so the message names one answer."""
    n_lim, eye, zero = len(rows.limited), np.eye(len(rows.limited)), np.zeros
    count = rows.count[rows.limited]       # a class's overflow is each of its members'
    status, x, _ = solve(rows.lp(count, [(rows.mem_a, -eye, rows.mem_cap)],
                                 zero(n_lim), np.full(n_lim, np.inf), memory_rows=False))
    if status == "optimal":  # second variable block: z >= every overflow
        total = float(count @ x[rows.ns:])
        status, x, _ = solve(rows.lp(np.eye(n_lim + 1)[n_lim], [
            (rows.mem_a, np.hstack([-eye, zero((n_lim, 1))]), rows.mem_cap),
            (zero((1, rows.ns)), np.append(count, 0.0)[None], [total * (1 + 1e-9) + 1e-6]),
            (zero((n_lim, rows.ns)), np.hstack([eye, -np.ones((n_lim, 1))]), zero(n_lim))],
            zero(n_lim + 1), np.full(n_lim + 1, np.inf), memory_rows=False))
    if status != "optimal":
        raise RuntimeError("ratio LP: the overflow LP failed")
    over = x[rows.ns:rows.ns + n_lim]       # in units of rows.mem_unit_bytes
    short = sorted((d, float(over[i]) * rows.mem_unit_bytes)
                   for i, c in enumerate(rows.limited) if over[i] > 1e-6 for d in rows.members[c])
    missing = {p.device_names[d]: v for d, v in short}       # device order, as in the file
    if not missing:
        raise RuntimeError("ratio LP reported infeasible memory but nothing overflows")
    return MemoryInfeasible(f"does not fit: {missing_text(missing)} ({sum(missing.values()) / 1e9:.3g} GB "
                            "in all, even with the shares that leave the least missing)", missing)


def missing_text(missing: dict[str, float]) -> str:
    """``{"A100-40GB#0": bytes, ...}`` as a line a person reads: a run of devices of one type
    missing the same (to three figures) is written once, ``12.3 GB missing on
    A100-40GB#0..#31 (each)``, so a 64-device cluster is two phrases, not 64."""
    runs: list[list] = []
    for name, value in missing.items():
        kind, sep, index = name.rpartition("#")
        if not sep:
            kind, index = name, ""
        amount = f"{value / 1e9:.3g} GB"
        if runs and index and runs[-1][0] == kind and runs[-1][1] == amount:
            runs[-1][3] = index
        else:
            runs.append([kind, amount, index, index])
    return ", ".join(f"{amount} missing on {kind}" if not first else
                     f"{amount} missing on {kind}#{first}" if first == last else
                     f"{amount} missing on {kind}#{first}..#{last} (each)"
                     for kind, amount, first, last in runs)
