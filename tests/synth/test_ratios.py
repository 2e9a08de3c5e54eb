"""The ratio LP: hand-solved optima, memory caps, the infeasibility message, and the three
backends agreeing (a wrong LP would not crash, it would silently give slow plans)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hapc.errors import UserError
from synth.ratios import (
    MemoryInfeasible,
    ShareProblem,
    available_backends,
    even_shares,
    proportional_shares,
    solve_shares,
)

ALL_BACKENDS = ["highs", "pulp", "cvxpy", "highspy"]
GB = 1e9


def backend_param(name: str):
    reason = f"LP backend {name!r} is not installed here"
    return pytest.param(name, marks=pytest.mark.skipif(name not in available_backends(),
                                                       reason=reason))


BACKENDS = [backend_param(name) for name in ALL_BACKENDS]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_devices_split_by_speed(backend):
    sol = solve_shares(ShareProblem(a=[1.0, 2.0], b=[0.0, 0.0]), backend)
    assert sol.shares[0] == pytest.approx([2 / 3, 1 / 3], abs=1e-8)
    assert sol.seconds == pytest.approx(2 / 3, rel=1e-8)
    assert sol.device_seconds == pytest.approx([2 / 3, 2 / 3], rel=1e-8)
    assert sol.backend == backend and sol.status == "optimal"


@pytest.mark.parametrize("backend", BACKENDS)
def test_three_devices_split_by_speed(backend):
    sol = solve_shares(ShareProblem(a=[1.0, 2.0, 4.0], b=[0.0, 0.0, 0.0]), backend)
    assert sol.shares[0] == pytest.approx([4 / 7, 2 / 7, 1 / 7], abs=1e-8)
    assert sol.seconds == pytest.approx(4 / 7, rel=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fixed_seconds_shift_work_away(backend):
    # s0 + 0.5 = s1, s0 + s1 = 1
    sol = solve_shares(ShareProblem(a=[1.0, 1.0], b=[0.5, 0.0]), backend)
    assert sol.shares[0] == pytest.approx([0.25, 0.75], abs=1e-8)
    assert sol.seconds == pytest.approx(0.75, rel=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slow_fixed_device_gets_nothing_and_the_rest_is_balanced(backend):
    # Device 0 sets the step time alone (5 s of fixed work); the others could split their
    # work any way, and the tie-break (leximin times) splits it evenly.
    sol = solve_shares(ShareProblem(a=[1.0, 1.0, 1.0], b=[5.0, 0.0, 0.0]), backend)
    assert sol.shares[0] == pytest.approx([0.0, 0.5, 0.5], abs=1e-8)
    assert sol.seconds == pytest.approx(5.0, rel=1e-8)
    with_floor = solve_shares(ShareProblem(a=[1.0, 1.0, 1.0], b=[5.0, 0.0, 0.0],
                                           min_share=0.1), backend)
    assert with_floor.shares[0] == pytest.approx([0.1, 0.45, 0.45], abs=1e-8)
    assert with_floor.seconds == pytest.approx(5.1, rel=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_cap_limits_the_fast_device(backend):
    # Unconstrained, the 4x faster device would take 0.8; 5 GB of 10 GB/share caps it at 0.5.
    problem = ShareProblem(a=[1.0, 4.0], b=[0.0, 0.0], m=[10 * GB, 10 * GB], c=[0.0, 0.0],
                           capacity=[5 * GB, np.inf], device_names=["fast", "slow"])
    sol = solve_shares(problem, backend)
    assert sol.shares[0] == pytest.approx([0.5, 0.5], abs=1e-8)
    assert sol.seconds == pytest.approx(2.0, rel=1e-8)
    assert sol.device_bytes == pytest.approx([5 * GB, 5 * GB], rel=1e-8)
    free = solve_shares(ShareProblem(a=[1.0, 4.0], b=[0.0, 0.0]), backend)
    assert free.shares[0] == pytest.approx([0.8, 0.2], abs=1e-8)


def test_missing_memory_reads_as_runs_of_alike_devices():
    from synth.ratios import missing_text

    assert missing_text({"A100#0": 2e9, "A100#1": 2e9, "V100#2": 3e9, "V100#3": 1e9, "cpu": 5e8}) == \
        "2 GB missing on A100#0..#1 (each), 3 GB missing on V100#2, 1 GB missing on V100#3, 0.5 GB missing on cpu"


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_infeasible_names_the_missing_gigabytes(backend):
    # 40 GB of sharded state + 2 GB each on two 16 GB cards: 12 GB short, 6 GB on each.
    problem = ShareProblem(a=[1.0, 1.0], b=[0.0, 0.0], m=[40 * GB, 40 * GB], c=[2 * GB, 2 * GB],
                           capacity=[16 * GB, 16 * GB],
                           device_names=["V100-16GB#4", "V100-16GB#5"])
    with pytest.raises(MemoryInfeasible) as info:
        solve_shares(problem, backend)
    message = str(info.value)
    assert isinstance(info.value, UserError) and "\n" not in message
    assert "6 GB missing on V100-16GB#4..#5 (each)" in message       # a run of alike devices once
    assert "12 GB in all" in message
    assert info.value.missing_bytes == pytest.approx({"V100-16GB#4": 6 * GB,
                                                      "V100-16GB#5": 6 * GB}, rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_infeasible_with_fixed_overflow(backend):
    # Device a is 2 GB over with no share at all; moving share keeps the total at 22 GB,
    # spread evenly at s = 0.225: 11 GB on each.
    problem = ShareProblem(a=[1.0, 1.0], b=[0.0, 0.0], m=[40 * GB, 40 * GB],
                           c=[12 * GB, 0.0], capacity=[10 * GB, 20 * GB], device_names=["a", "b"])
    with pytest.raises(MemoryInfeasible, match=r"11 GB missing on a, 11 GB missing on b "
                                               r"\(22 GB in all"):
        solve_shares(problem, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_segments_move_work_to_where_each_device_is_fast(backend):
    # Device 1 is 3x slower on segment 1 only: it should take all of segment 0.
    sol = solve_shares(ShareProblem(a=[[1.0, 1.0], [1.0, 3.0]], b=[0.0, 0.0]), backend)
    assert sol.shares == pytest.approx(np.array([[0.0, 1.0], [1.0, 0.0]]), abs=1e-8)
    assert sol.seconds == pytest.approx(1.0, rel=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_segments_with_free_choice_fall_back_to_proportional(backend):
    # Proportional speeds: any split with the same total per device is optimal; the rule
    # picks the one proportional to speed in every segment.
    sol = solve_shares(ShareProblem(a=[[1.0, 2.0], [2.0, 4.0]], b=[0.0, 0.0]), backend)
    assert sol.shares == pytest.approx(np.array([[2 / 3, 1 / 3], [2 / 3, 1 / 3]]), abs=1e-8)
    assert sol.seconds == pytest.approx(2.0, rel=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_has_work_pins_shares_to_zero(backend):
    problem = ShareProblem(a=[[1.0, 1.0], [1.0, 1.0]], b=[0.0, 0.0],
                           has_work=[[True, True], [True, False]], min_share=0.05)
    sol = solve_shares(problem, backend)
    # Segment 1 sits on device 0, so device 1 takes all of segment 0: times 1 and 1.
    assert sol.shares == pytest.approx(np.array([[0.05, 0.95], [1.0, 0.0]]), abs=1e-8)
    assert sol.seconds == pytest.approx(1.05, rel=1e-8)


def random_problem(rng: np.random.Generator) -> ShareProblem:
    """Random sizes, fixed costs and memory caps, feasible by construction (even shares fit)."""
    k, n = int(rng.integers(1, 3)), int(rng.integers(2, 5))
    a = rng.uniform(0.1, 2.0, (k, n))
    b = rng.uniform(0.0, 0.5, n) * (rng.random(n) < 0.6)
    m = rng.uniform(1 * GB, 20 * GB, (k, n))
    c = rng.uniform(0.0, 5 * GB, n)
    even_bytes = (m / n).sum(axis=0) + c
    cap = np.where(rng.random(n) < 0.5, even_bytes * rng.uniform(1.0, 1.3, n), np.inf)
    return ShareProblem(a, b, m, c, cap, min_share=0.01 if rng.random() < 0.3 else 0.0)


RANDOM_PROBLEMS = [random_problem(np.random.default_rng(seed)) for seed in range(50)]


@pytest.fixture(scope="module")
def reference_solutions():
    return [solve_shares(p, "highs") for p in RANDOM_PROBLEMS]


def test_random_solutions_are_feasible_and_beat_simple_shares(reference_solutions):
    for problem, sol in zip(RANDOM_PROBLEMS, reference_solutions):
        assert sol.shares.sum(axis=1) == pytest.approx(np.ones(problem.segments), abs=1e-9)
        assert np.all(sol.shares >= problem.min_share - 1e-12)
        assert np.all(sol.device_bytes <= problem.capacity * (1 + 1e-9))
        even = np.full(problem.a.shape, 1.0 / problem.devices)
        assert sol.seconds <= problem.device_seconds(even).max() * (1 + 1e-9)


# The first 12 instances run by default; the other 38 (pulp and cvxpy cost ~20-40 ms an LP)
# with `-m slow`. Shares must match to the last bit: the exact-point polish makes every
# backend return the same floats, which byte-identical plan files rely on.
@pytest.mark.parametrize("backend", [backend_param(n) for n in ("pulp", "cvxpy")])
@pytest.mark.parametrize("which", [pytest.param(slice(0, 12), id="first12"),
                                   pytest.param(slice(12, 50), id="rest",
                                                marks=pytest.mark.slow)])
def test_backends_agree_on_random_instances(backend, which, reference_solutions):
    for i in range(50)[which]:
        sol, ref = solve_shares(RANDOM_PROBLEMS[i], backend), reference_solutions[i]
        assert sol.seconds == pytest.approx(ref.seconds, rel=1e-7), f"instance {i}"
        assert sol.shares.tobytes() == ref.shares.tobytes(), \
            f"instance {i}: {sol.shares} != {ref.shares}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_call_gives_identical_floats(backend):
    for problem in (RANDOM_PROBLEMS[5], RANDOM_PROBLEMS[6]):  # memory caps, min_share
        first, second = solve_shares(problem, backend), solve_shares(problem, backend)
        assert first.shares.tobytes() == second.shares.tobytes()
        assert first.seconds == second.seconds
        assert all(v == float(f"{v:.12g}") for v in first.shares.ravel())


def test_simple_share_vectors():
    assert proportional_shares([3.0, 1.0]) == [0.75, 0.25]
    assert even_shares(4) == [0.25] * 4
    with pytest.raises(ValueError):
        proportional_shares([0.0, 0.0])
    with pytest.raises(ValueError):
        even_shares(0)


def test_bad_problems_are_rejected():
    with pytest.raises(ValueError, match="shape"):
        ShareProblem(a=[1.0, 2.0], b=[0.0])
    with pytest.raises(ValueError, match="non-negative"):
        ShareProblem(a=[-1.0, 2.0], b=[0.0, 0.0])
    with pytest.raises(ValueError, match="min_share"):
        ShareProblem(a=[1.0, 2.0], b=[0.0, 0.0], min_share=0.6)
    with pytest.raises(ValueError, match="backend"):
        solve_shares(ShareProblem(a=[1.0], b=[0.0]), "glpk")


def test_repr_reads_well():
    text = repr(solve_shares(ShareProblem(a=[1.0, 2.0], b=[0.0, 0.0], device_names=["x", "y"])))
    assert re.fullmatch(r"ShareSolution\(0\.6667 s via highs; shares x: 0\.667, y: 0\.333\)", text)


def test_one_variable_per_class_of_identical_devices_loses_nothing():
    # Random problems whose devices come in copies: the LP over classes reaches the leximin
    # times of the LP over devices (computed here with one class per device), and hands every
    # member of a class the same share.
    from synth.ratios import _solve_shares, device_classes

    rng = np.random.default_rng(7)
    for _ in range(8):
        base = random_problem(rng)
        copies = rng.integers(1, 4, base.devices)
        pick = np.repeat(np.arange(base.devices), copies)
        problem = ShareProblem(base.a[:, pick], base.b[pick], base.m[:, pick] / copies[pick],
                               base.c[pick], base.capacity[pick], min_share=base.min_share / 4)
        classes = device_classes(problem)
        assert len(classes) == base.devices
        by_class = solve_shares(problem)
        by_device = _solve_shares(problem, "highs", [[r] for r in range(problem.devices)])
        assert by_class.seconds == pytest.approx(by_device.seconds, rel=1e-9)
        assert np.sort(by_class.device_seconds) == pytest.approx(np.sort(by_device.device_seconds), rel=1e-7)
        for members in classes:
            assert np.all(by_class.shares[:, members] == by_class.shares[:, members[:1]])
