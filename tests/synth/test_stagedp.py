"""The stage planner's exact DPs (synth/stagedp.py): one self-looped layer for every stage
count from ``max(m, 2)`` up (or lower, where memory tells no counts apart) gives the very
values, bottlenecks and fronts of one layer per count, and the walks give back stage lists
that cost what the DP says."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from costmodel.cluster import load_cluster
from synth import stagedp

from tests.process.forking import child_forks  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[2]
GPT = {"layers": 4, "hidden": 64, "heads": 4, "seq": 32, "vocab": 101, "batch": 16, "dropout": 0.0}


class _EveryCount(stagedp.StageProblem):
    """The same problem with one layer per stage count (no self-loop): the reference."""

    @property
    def top(self) -> int:
        return self.max_stages

    def under(self, cap: float) -> stagedp.StageProblem:
        return self


def _problems(load_model, cluster_name: str, memory_bytes: float | None):
    return _planner_problems(load_model, cluster_name, memory_bytes)[1]


def _planner_problems(load_model, cluster_name: str, memory_bytes: float | None):
    import torch

    from hapc.frontend.tracer import trace
    from synth.stages import StagePlanner

    mod = load_model("gpt")
    with torch.device("meta"):
        model = mod.model(**GPT)
    traced = trace(model, tuple(t.to("meta") for t in mod.inputs(**GPT)))
    cluster = load_cluster(str(REPO / "configs" / "clusters" / cluster_name))
    if memory_bytes:
        cluster = replace(cluster, devices=[replace(d, memory_bytes=memory_bytes) for d in cluster.devices])
    planner = StagePlanner(traced.graph, cluster)
    out = []
    for nodes in planner.device_orders():
        positions, starts = planner.groups_of(nodes)
        for m in planner.microbatch_counts([g for gs in starts.values() for g in gs]):
            out.append(planner._problem(nodes, positions, starts, m, None, False))
    return planner, out


@pytest.mark.parametrize("cluster_name, memory_bytes", [("small-mixed.yaml", 1.3e6),        # four stages bind memory
                                                        ("cpu-2nodes-2x2.yaml", 1.6e6)])    # three, 16 micro-batches
def test_collapsed_stage_counts_solve_every_problem_alike(load_model, cluster_name, memory_bytes):
    problems = _problems(load_model, cluster_name, memory_bytes)
    assert any(prob.looped for prob in problems) and any(not prob.looped for prob in problems)
    for prob in problems:
        ref = _EveryCount(**{f: getattr(prob, f) for f in ("m", "n_pos", "n_cuts", "arcs", "max_stages", "ks",
                                                           "gpipe_memory", "steps")})
        assert stagedp.least_bottleneck(prob) == stagedp.least_bottleneck(ref)
        caps = prob.steps[np.linspace(0, len(prob.steps) - 1, 4).astype(int)]
        value, pick_arc, pick_cut, pick_loop = stagedp.cap_dp(prob, caps)
        ref_value = stagedp.cap_dp(ref, caps)[0]
        for b, cap in enumerate(caps):
            least = min(value[k, b, 0, 0] for k in prob.layers())
            assert least == min(ref_value[k, b, 0, 0] for k in ref.layers())
            if not np.isfinite(least):
                continue
            k = min(prob.layers(), key=lambda k: value[k, b, 0, 0])
            chosen = stagedp._walk(prob, pick_arc, pick_cut, pick_loop, b, k)
            assert len(chosen) >= 2 and chosen[0][1] == 0 and chosen[-1][2] == prob.n_cuts - 1
            assert all(arc.gate[i, j] <= cap for arc, i, j in chosen)
            assert sum(arc.cost[i, j] for arc, i, j in chosen) == pytest.approx(least, rel=1e-12)
            if b < len(caps) - 1:
                continue                 # the front DP once per problem, at the loosest cap
            exact = stagedp.pareto_dp(prob, float(cap), np.inf)
            ref_exact = stagedp.pareto_dp(ref, float(cap), np.inf)
            assert (exact is None) == (ref_exact is None)
            if exact is not None:
                assert exact[0] == pytest.approx(ref_exact[0], rel=1e-12)
                v, chosen = exact
                assert stagedp.pipeline_sum(chosen) + stagedp.tail_excess(chosen) == pytest.approx(v, rel=1e-12)


@pytest.mark.usefixtures("child_forks")
def test_groups_synthesised_in_a_child_match_the_serial_ones(load_model, monkeypatch):
    """The groups' programs and profiles are shared with a forked child (synth.stages
    start_groups, hapc.process.sharedjobs): the plan, the programs and every profile are those found
    one after the other."""
    import torch

    from hapc.frontend.tracer import trace
    from synth.stages import StagePlanner, pipeline_even

    mod = load_model("gpt")
    with torch.device("meta"):
        model = mod.model(**GPT)
    graph = trace(model, tuple(t.to("meta") for t in mod.inputs(**GPT))).graph
    cluster = load_cluster(str(REPO / "configs" / "clusters" / "cpu-2nodes-2x2.yaml"))
    import hapc.process.sharedjobs

    children = []

    class Spy(hapc.process.sharedjobs.SharedJobs):
        def __init__(self, jobs):
            super().__init__(jobs)
            children.append(self.forked)

    monkeypatch.setattr(hapc.process.sharedjobs, "SharedJobs", Spy)
    planners, plans = [], []
    for serial in (True, False):
        if serial:
            monkeypatch.setenv("HAPC_SERIAL", "1")
        else:
            monkeypatch.delenv("HAPC_SERIAL")
        planner = StagePlanner(graph, cluster)
        even = pipeline_even(planner)
        assert children[-1] is (not serial)
        planners.append(planner)
        plans.append((even.iteration_seconds, planner.plan()))
    (even_a, a), (even_b, b) = plans
    assert even_a == even_b and a.iteration_seconds == b.iteration_seconds
    assert [(s.first_node, s.stop_node, s.ranks) for s in a.stages] == [(s.first_node, s.stop_node, s.ranks) for s in b.stages]
    assert a.search["group_syntheses"] == b.search["group_syntheses"] == len(planners[0]._programs)
    for key, program in planners[0]._programs.items():
        assert planners[1]._programs[key].steps == program.steps
    baselines = [p.baseline_planner() for p in planners]
    assert baselines[0]._programs.keys() == baselines[1]._programs.keys() and baselines[0]._programs
    for key, program in baselines[0]._programs.items():
        assert baselines[1]._programs[key].steps == program.steps
    assert planners[0]._profiles.keys() == planners[1]._profiles.keys()
    for key, prof in planners[0]._profiles.items():
        other = planners[1]._profiles[key]
        assert all(np.array_equal(getattr(prof, f), getattr(other, f))
                   for f in ("fwd_compute", "bwd_compute", "fwd_comm", "bwd_comm", "static_bytes", "activation_bytes"))


def _random_problem(rng: np.random.Generator, m: int, short_of: int) -> stagedp.StageProblem:
    """A synthetic problem on 5 device positions and 6 cuts whose stages hold at most
    ``short_of - 1`` micro-batches where memory binds (room for ``m`` or more elsewhere)."""
    n_pos, c = 5, 6
    upper = np.triu(np.ones((c, c), dtype=bool), 1)
    arcs = []
    for a in range(n_pos - 1):
        for b in range(a + 1, n_pos):
            room = np.where(rng.random((c, c)) < 0.3, rng.integers(0, max(short_of, 1), (c, c)), m + 3)
            busy = np.where(upper, rng.uniform(1.0, 3.0, (c, c)) + 2.0 * (room < m), np.inf)   # big = slow
            gate = np.where(upper, busy * rng.uniform(0.3, 1.0, (c, c)), np.inf)
            tail = rng.uniform(0.0, 2.0, (c, c))
            cost = busy.copy()
            cost[0] += tail[0]
            arcs.append(stagedp.Arc(type("G", (), {"key": f"{a}-{b}"})(), a, b, cost, gate,
                                    np.where(upper, room, -1.0).astype(float), busy, busy + tail,
                                    np.where(upper, busy, 1.0) * rng.uniform(0.2, 0.6, (c, c))))
    steps = np.unique(np.concatenate([a.gate[np.isfinite(a.gate)] for a in arcs]))
    return stagedp.StageProblem(m, n_pos, c, arcs, 4, [2, 3, 4], False, steps)


@pytest.mark.parametrize("seed", range(12))
def test_layers_collapse_where_memory_cannot_tell_counts_apart(seed):
    """Counts from ``t`` up share the top layer when no stage has room for between
    ``min(m, t)`` and ``min(m, max_stages)`` micro-batches: the values, bottlenecks and exact
    fronts are those of one layer per count, on problems whose memory binds at 0..m."""
    rng = np.random.default_rng(seed)
    m = (2, 4, 8)[seed % 3]
    short_of = int(rng.integers(0, min(m, 4) + 1))
    prob = _random_problem(rng, m, short_of)
    assert prob.top == min(4, max(2, short_of))          # the layer where counts stop mattering
    ref = _EveryCount(**{f: getattr(prob, f) for f in ("m", "n_pos", "n_cuts", "arcs", "max_stages", "ks",
                                                       "gpipe_memory", "steps")})
    assert stagedp.least_bottleneck(prob) == stagedp.least_bottleneck(ref)
    caps = prob.steps[np.linspace(0, len(prob.steps) - 1, 12).astype(int)]
    ref_value = stagedp.cap_dp(ref, caps)[0]
    tops, bounds = set(), []
    for b, cap in enumerate(caps):
        # Each cap alone on the problem as a DP under that cap sees it (its layers may collapse
        # further where only slower stages lack memory), and all caps on the whole problem.
        for dp, at in ((prob.under(float(cap)), [cap]), (prob, caps)):
            tops.add(dp.top)
            value, pick_arc, pick_cut, pick_loop = stagedp.cap_dp(dp, np.array(at))
            col = 0 if len(at) == 1 else b
            least = min(value[k, col, 0, 0] for k in dp.layers())
            assert least == min(ref_value[k, b, 0, 0] for k in ref.layers())
            if np.isfinite(least):
                k = min(dp.layers(), key=lambda k: value[k, col, 0, 0])
                chosen = stagedp._walk(dp, pick_arc, pick_cut, pick_loop, col, k)
                need = [min(m, len(chosen) - s) for s in range(len(chosen))]
                assert all(arc.inflight_max[i, j] >= n and arc.gate[i, j] <= cap
                           for (arc, i, j), n in zip(chosen, need))
                assert sum(arc.cost[i, j] for arc, i, j in chosen) == pytest.approx(least, rel=1e-12)
        dp = prob.under(float(cap))
        exact, ref_exact = stagedp.pareto_dp(dp, float(cap), np.inf), stagedp.pareto_dp(ref, float(cap), np.inf)
        assert (exact is None) == (ref_exact is None)
        if exact is not None:
            assert exact[0] == pytest.approx(ref_exact[0], rel=1e-12)
            # The cheap bound on V that spares the front DP: never above the exact least V,
            # never below W + e0 (the bound it tightens).
            value = stagedp.cap_dp(dp, np.array([cap]))[0]
            bound = stagedp.tail_bound(dp, value, 0, float(cap))
            assert bound <= exact[0] * (1 + 1e-12)
            assert bound >= min(value[k, 0, 0, 0] for k in dp.layers()) * (1 - 1e-12)
            bounds.append((bound, exact[0]))
    assert len(tops) > 1 or short_of <= 2            # some caps see fewer layers than the problem
    assert any(b == pytest.approx(v, rel=1e-12) for b, v in bounds if np.isfinite(v))   # and often tight


@pytest.mark.parametrize("cluster_name, memory_bytes", [("cpu-2nodes-2x2.yaml", None), ("small-mixed.yaml", None)])
def test_no_plan_takes_less_than_m_times_its_slowest_step(load_model, cluster_name, memory_bytes):
    """The bound behind clipping cap intervals at incumbent / m (_Run.winnable): every stage
    list the DP gives, priced by the schedule, takes at least m times its slowest step; and the
    clipped intervals keep exactly the caps under incumbent / m."""
    planner, problems = _planner_problems(load_model, cluster_name, memory_bytes)
    priced = 0
    for prob in problems:
        caps = prob.steps[np.linspace(0, len(prob.steps) - 1, 8).astype(int)]
        value, pick_arc, pick_cut, pick_loop = stagedp.cap_dp(prob, caps)
        for b in range(len(caps)):
            for k in prob.layers():
                if not np.isfinite(value[k, b, 0, 0]):
                    continue
                chosen = stagedp._walk(prob, pick_arc, pick_cut, pick_loop, b, k)
                pipe = planner._price([(arc.group, i, j) for arc, i, j in chosen], prob.m, "1f1b", require_fit=False)
                slowest = max(float(arc.gate[i, j]) for arc, i, j in chosen)
                assert pipe.iteration_seconds >= prob.m * slowest * (1 - 1e-12)
                priced += 1
        run = stagedp._Run(prob)
        if not run.pending:
            continue
        incumbent = float(prob.m * caps[len(caps) // 2])
        kept = run.winnable(incumbent)
        (_, first, hi), = run.pending
        assert all(prob.m * prob.steps[h] < incumbent for _, _, h in kept)
        assert all(h == hi or prob.m * prob.steps[h + 1] >= incumbent for _, _, h in kept)
        assert bool(kept) == (prob.m * prob.steps[first] < incumbent)
    assert priced > 20
