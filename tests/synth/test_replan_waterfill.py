"""A replan's re-balance without numpy: the LP's coefficients as plain floats (synth.loads) and
the one-segment LP in closed form (synth.waterfill), each checked against what numpy and the LP
give, so that plans stay the same; and a replan then imports no numpy at all."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest


from tests.elastic.test_replan_reuse import REPO, compiled  # noqa: F401 (a fixture)

from bench.golden import MODELS, golden_path  # noqa: E402
from costmodel.memory import program_memory  # noqa: E402
from costmodel.simcache import SimulationCache  # noqa: E402
from costmodel.simulator import simulate  # noqa: E402
from hapc.ir.layout import Shard  # noqa: E402
from hapc.ir.program import Compute  # noqa: E402
from hapc.plan.plan import Plan  # noqa: E402
from synth import lp_highspy  # noqa: E402
from synth.loads import DeviceLoads, MemoryInfeasible, _pairwise_sum, device_loads, share_problem, with_shares  # noqa: E402
from synth.ratios import solve_shares  # noqa: E402
from synth.waterfill import fill_shares  # noqa: E402

BACKEND = "highspy" if lp_highspy.available() else "highs"


def _loads(a, b, m=None, c=None, capacity=None) -> DeviceLoads:
    n = len(a)
    return DeviceLoads(tuple(a), tuple(b), tuple(m or [0.0] * n), tuple(c or [0.0] * n),
                       tuple(capacity or [float("inf")] * n), tuple(f"d{r}" for r in range(n)))


def _lp(loads: DeviceLoads) -> tuple[float, ...]:
    return tuple(float(x) for x in solve_shares(loads.problem(), BACKEND).shares.reshape(-1))


def _random_loads(rng: random.Random) -> DeviceLoads:
    """Devices of a few kinds (identical columns, as real clusters have), some memory-capped,
    some of them so tightly that memory binds."""
    n = rng.randint(1, 12)
    kinds = []
    for _ in range(rng.randint(1, min(n, 4))):
        m, c = rng.uniform(1e9, 8e9), rng.uniform(0.0, 4e9)
        room = c + m * rng.uniform(0.05, 0.5)           # fits up to a share of 0.05 to 0.5
        kinds.append((rng.uniform(0.001, 2.0) ** rng.choice([1, 2]), rng.uniform(0.0, 1.5), m, c,
                      rng.choice([room, 6e9, 16e9, 32e9, float("inf")])))
    rows = [rng.choice(kinds) for _ in range(n)]
    if rng.random() < 0.1:          # a program that shards nothing: no time scales with the shares
        rows = [(0.0, *row[1:]) for row in rows]
    return _loads(*([row[i] for row in rows] for i in range(5)))


def test_closed_form_gives_the_lps_shares_to_the_last_bit():
    rng = random.Random(15)
    answered = capped = 0
    for _ in range(400):
        loads = _random_loads(rng)
        got = fill_shares(loads)
        if got is not None:
            answered += 1
            assert got == _lp(loads), loads
            used = [m * s + c for m, s, c in zip(loads.m, got, loads.c)]
            capped += any(u > cap * (1 - 1e-9) for u, cap in zip(used, loads.capacity))
    assert answered >= 250 and capped >= 20       # most: it declines only where a bound is nearly active,
    # the memory fits at no shares, or a 12-digit rounding is close


def test_hand_solved_shares():
    assert fill_shares(_loads([1.0, 2.0], [0.0, 0.0])) == (0.666666666667, 0.333333333333)
    # s0 + 0.5 = s1 and s0 + s1 = 1; a device whose fixed time alone exceeds the level gets nothing
    assert fill_shares(_loads([1.0, 1.0], [0.5, 0.0])) == (0.25, 0.75)
    assert fill_shares(_loads([1.0, 1.0, 1.0], [5.0, 0.0, 0.0])) == (0.0, 0.5, 0.5)
    assert fill_shares(_loads([0.0, 0.0, 0.0], [1.0, 2.0, 3.0])) == (0.333333333333,) * 3     # nothing scales: even
    # device 0's memory, 10 GB x share + 1 GB within 4 GB, caps it at 0.3
    assert fill_shares(_loads([1.0, 1.0], [0.0, 0.0], m=[10e9, 10e9], c=[1e9, 1e9], capacity=[4e9, 16e9])) == (0.3, 0.7)


@pytest.mark.parametrize("loads", [
    _loads([1.0, 1.0], [0.0, 0.0], m=[10e9, 10e9], c=[1e9, 1e9], capacity=[6e9 + 1e3, 16e9]),  # memory nearly binds
    _loads([1.0, 1.0], [0.0, 0.0], m=[10e9, 10e9], c=[1e9, 1e9], capacity=[4e9, 4e9]),       # fits at no shares
    _loads([1.0, 1.0], [0.0, 0.0], m=[10e9, 10e9], c=[5e9, 1e9], capacity=[4e9, 16e9]),      # not even at share 0
    _loads([1.0, 0.0], [0.0, 0.0]),                   # a device with no sharded work: the LP's tie-break
    _loads([1.0, 1.0], [0.5, 0.5 - 1e-12]),           # shares so near a 12-digit halfway that the LP's may round either way
    _loads([1.0], [0.0]),                             # one device: its share at its bound
    _loads([1.0, 1.0], [0.0, 1.0 + 1e-9]),            # an idle device all but at the level
])
def test_the_lp_decides_what_the_closed_form_cannot_settle(loads):
    assert fill_shares(loads) is None
    try:
        _lp(loads)          # ... and the LP does
    except MemoryInfeasible as exc:       # ... or says why not
        assert "does not fit" in str(exc)


def test_pairwise_sum_is_numpys_sum():
    rng = random.Random(3)
    for n in range(0, 300):
        values = [rng.uniform(0, 10) ** rng.randint(-3, 3) for _ in range(n)]
        assert _pairwise_sum(values, 0, n) == float(np.array(values, dtype=float).sum()), n


def _numpy_loads(program, sim, cluster, optimizer):
    """The LP's coefficients as synth.loads computed them with numpy before (the oracle)."""
    kind_of = list(cluster.device_kinds())
    first = {k: r for r, k in reversed(list(enumerate(kind_of)))}
    a_kind, b_kind = np.zeros(len(first)), np.zeros(len(first))
    cache = SimulationCache(program.graph, cluster)
    for step in program.steps:
        if isinstance(step, Compute):
            node = cache.nodes[step.node]
            sharded = any(isinstance(x, Shard) for x in step.strategy.inputs + step.strategy.outputs)
            for k, r in first.items():
                t = cache.node_time(node, cache.node_key(node), r, cache.device_key(r), 1.0)
                (a_kind if sharded else b_kind)[k] += t.fwd_seconds + t.bwd_seconds
    world = program.world
    s1 = np.asarray(program.shares, dtype=float)
    tilted = np.where(np.arange(world) % 2 == 0, 1.2, 0.8)
    s2 = np.full(world, 1.0 / world) if not np.allclose(s1, 1.0 / world) else tilted / tilted.sum()
    m1 = np.asarray(sim.memory.totals, dtype=float)
    m2 = np.asarray(program_memory(with_shares(program, s2), cluster, optimizer).totals)
    ds = s1 - s2
    m = np.maximum(np.where(np.abs(ds) > 1e-12, (m1 - m2) / np.where(np.abs(ds) > 1e-12, ds, 1.0), 0.0), 0.0)
    return a_kind[kind_of], b_kind[kind_of] + np.asarray(sim.comm_seconds), m, np.maximum(m1 - m * s1, 0.0)


@pytest.mark.parametrize("name", MODELS)
def test_plain_float_coefficients_are_numpys(name):
    plan = Plan.load(golden_path(name))
    assert plan.pipeline is None, "the golden plans are one-stage; pipelined ones are not re-balanced this way"
    optimizer = plan.model.get("optimizer", "adamw")
    world = plan.cluster.world
    for shares in (plan.program.shares, [1.0 / world] * world):        # even shares: the tilted second point
        program = with_shares(plan.program, shares)
        sim = simulate(program, plan.cluster, optimizer=optimizer)
        loads = device_loads(program, sim, plan.cluster, optimizer)
        for got, want in zip((loads.a, loads.b, loads.m, loads.c), _numpy_loads(program, sim, plan.cluster, optimizer)):
            assert list(got) == want.tolist()
        assert share_problem(program, sim, plan.cluster, optimizer).a.tolist() == [list(loads.a)]


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_a_replan_settled_by_the_closed_form_imports_no_numpy(compiled, tmp_path, model):  # noqa: F811
    """The whole command, in a fresh process: the MLP's program shards nothing (even shares),
    the GPT's does (water-filling); neither re-balance needs the LP."""
    import os
    import shutil
    import subprocess

    from synth import reuse

    if model == "mlp":
        plan_file = compiled / "plan.json"
    else:       # the golden plan, with the replan cache its compile would have written
        plan_file = tmp_path / "old" / "plan.json"
        plan_file.parent.mkdir()
        shutil.copyfile(golden_path(model), plan_file)
        reuse.write(Plan.load(plan_file).graph, reuse.cache_path(plan_file), plan_file=plan_file)
    code = ("import sys; from hapc.cli import main; rc = main(sys.argv[1:]); "
            "print(sorted(m for m in ('numpy', 'highspy', 'scipy') if m in sys.modules)); sys.exit(rc)")
    args = [str(plan_file), "--drop", "1", "--search", "-o", str(tmp_path / "new"), "-q", "--no-emit"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code, "replan", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr[-2000:]
