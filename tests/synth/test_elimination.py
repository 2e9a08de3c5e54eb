"""Segments solved by variable elimination (synth/elimination.py) are solved exactly: equal to
brute force (priced independently of the search) on small graphs, equal to the A* on a small
mixture-of-experts layer, and the plan computes the single-device model's loss."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

import hapc
from costmodel import load_cluster
from hapc.codegen.executor import replicated_program, run
from synth import elimination
from synth.costs import Prices
from synth.search import Searcher, to_program
from synth.space import SearchSpace

from tests.synth.test_search import _assignment_cost  # one plain pricing of an assignment for both files

TWO_UNEVEN = {"nodes": [{"devices": [{"name": "a", "tflops": 0.3, "memory_GB": 8, "hbm_GBps": 30, "count": 1},
                                     {"name": "b", "tflops": 0.1, "memory_GB": 8, "hbm_GBps": 10, "count": 1}],
                         "intra_link": "loopback"}]}
SMALL_MOE = {"layers": 1, "hidden": 16, "heads": 2, "seq": 8, "vocab": 31, "batch": 3, "experts": 3,
             "dropout": 0.0}


class Gate(nn.Module):
    """A router in miniature: one value read by several later nodes, so several values are
    live at once and a copy made for one reader serves the next."""

    def __init__(self):
        super().__init__()
        self.w = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        p = torch.tanh(self.w(x))
        return (p * x[:, :4]).sum() + p.mean()


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 12)
        self.b = nn.Linear(12, 12)

    def forward(self, x):
        h = x + self.b(torch.tanh(self.a(x)))
        return (h * x).sum()


def _space(model, inputs, cluster=TWO_UNEVEN):
    traced = hapc.trace(model, inputs)
    cl = load_cluster(cluster)
    shares = cl.flops_shares()
    return traced, SearchSpace.build(traced.graph, Prices(traced.graph, cl, shares)), shares


def _eliminated(space: SearchSpace) -> Searcher:
    """A searcher whose A* gives up at once, so that every segment goes to the elimination."""
    searcher = Searcher(space)
    searcher.segment_budget = 0
    return searcher


def _brute_force(space: SearchSpace) -> float:
    searcher = Searcher(space)
    sizes = [len(ns.options) for ns in space.nodes]
    assert math.prod(sizes) <= 300_000, sizes
    return min(_assignment_cost(space, searcher, combo) for combo in itertools.product(*map(range, sizes)))


@pytest.mark.parametrize("build", [
    lambda: (Gate(), (torch.randn(6, 8),)),
    lambda: (Residual(), (torch.randn(9, 12),)),
])
def test_elimination_equals_brute_force(build):
    torch.manual_seed(0)
    model, inputs = build()
    _, space, _ = _space(model, inputs)
    searcher = _eliminated(space)
    result = searcher.run()
    assert result.exact and result.gap == 0.0
    assert searcher.elimination.eliminations >= 1
    assert result.cost_seconds == pytest.approx(_brute_force(space), rel=1e-12)


@pytest.fixture(scope="module")
def small_moe():
    from hapc.frontend.modelfile import load_model_file

    mf = load_model_file("configs/models/moe.py", SMALL_MOE)
    torch.manual_seed(0)
    model = mf.build_model()
    inputs = mf.build_inputs()
    return hapc.trace(model, inputs), inputs


def test_a_mixture_of_experts_layer_is_solved_exactly(small_moe):
    """Every segment eliminated, the 73-node MoE layer too: the plan is proven optimal, its
    cost is what an independent walk over its choices prices, and it computes the model."""
    traced, inputs = small_moe
    cl = load_cluster(TWO_UNEVEN)
    graph = traced.graph
    space = SearchSpace.build(graph, Prices(graph, cl, cl.flops_shares()))
    assert max(s.stop - s.start for s in space.segments) > 60
    searcher = _eliminated(space)
    result = searcher.run()
    assert result.exact and result.gap == 0.0
    assert searcher.elimination.eliminations >= len({s.signature for s in space.segments}) - 1
    options = tuple(c.option for c in result.choices)
    assert _assignment_cost(space, searcher, options) == pytest.approx(result.cost_seconds, rel=1e-12)
    shares = cl.flops_shares()
    got = run(to_program(space, result, shares), traced, inputs, dtype=torch.float64)
    ref = run(replicated_program(graph), traced, inputs, dtype=torch.float64)
    assert abs(got.loss - ref.loss).item() < 1e-9


@pytest.mark.slow
def test_a_mixture_of_experts_layer_eliminated_equals_the_astar(small_moe, monkeypatch):
    """The A* proves the same optimum, given 100,000 expansions (about 14 s of CPU)."""
    traced, _ = small_moe
    monkeypatch.setattr(elimination, "WIDE_LIVE", 10**6)      # leave every segment to the A*
    monkeypatch.setattr(elimination, "WIDE_ENTRY", 10**6)
    cl = load_cluster(TWO_UNEVEN)
    graph = traced.graph
    space = SearchSpace.build(graph, Prices(graph, cl, cl.flops_shares()))
    space.hard_segments.clear()
    astar = Searcher(space)
    astar.segment_budget = 10**6
    reference = astar.run()
    assert reference.exact and astar.elimination.eliminations == 0
    assert _eliminated(space).run().cost_seconds == pytest.approx(reference.cost_seconds, rel=1e-12)


def test_too_wide_a_segment_is_left_to_the_beam_and_the_plan_says_so(small_moe, monkeypatch):
    traced, _ = small_moe
    cl = load_cluster(TWO_UNEVEN)
    graph = traced.graph
    monkeypatch.setattr(elimination, "MAX_TABLE_ENTRIES", 1)
    result = _eliminated(SearchSpace.build(graph, Prices(graph, cl, cl.flops_shares()))).run()
    assert not result.exact
    assert result.lower_bound_seconds <= result.cost_seconds


def test_a_segment_the_memo_keeps_missing_is_eliminated_after_repeated_misses():
    """The A* solves a segment's entry states itself while the memo misses them a few times
    (a transformer's entry costs settle within three layers); the next request is eliminated,
    and gives the A*'s optimum."""
    torch.manual_seed(0)
    _, space, _ = _space(Residual(), (torch.randn(9, 12),))
    searcher = Searcher(space)
    seg = max(space.segments, key=lambda s: s.stop - s.start)
    frontier = {state: (0.0, []) for state in _entry_states(searcher, seg)}
    solver = searcher.elimination
    assert not solver._wide(seg, len(frontier))
    for _ in range(elimination.REPEATED_MISSES):
        assert solver.solve(seg, frontier, 0.0) is None
    eliminated = solver.solve(seg, frontier, 0.0)
    assert eliminated is not None and solver.eliminations == 1
    by_astar = searcher._astar_segment(seg, frontier, 0.0)    # the A* keeps some dominated exits too
    for state, (seconds, _, _) in eliminated.items():
        assert by_astar[state][0] == pytest.approx(seconds, rel=1e-12)
    assert min(g for g, _, _ in by_astar.values()) == pytest.approx(min(g for g, _, _ in eliminated.values()),
                                                                   rel=1e-12)


def _entry_states(searcher: Searcher, seg) -> list[tuple]:
    """A few states of the values live when ``seg`` starts: each held in one layout it can take."""
    live = searcher._live[seg.start]
    codes = [searcher._codes_of(vid)[:2] for vid in live]
    return [tuple(1 << c for c in combo) for combo in itertools.product(*codes)]


class _Scan(torch.nn.Module):
    """A state-space scan unrolled over 16 steps (Mamba's slow path): one activation, the
    discretised state matrix, is read by every step."""

    def __init__(self, d: int = 6, n: int = 4) -> None:
        super().__init__()
        self.A = torch.nn.Parameter(-torch.rand(d, n))
        self.C = torch.nn.Parameter(torch.randn(d, n))
        self.inp, self.dt = torch.nn.Linear(d, d), torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = torch.nn.functional.softplus(self.dt(x))                  # [B, L, D]
        decay = torch.exp(self.A[None, None] * dt[..., None])           # [B, L, D, N]
        u = self.inp(x)
        h = torch.zeros(x.shape[0], x.shape[2], self.A.shape[1])
        ys = []
        for t in range(x.shape[1]):
            h = h * decay[:, t] + u[:, t, :, None]
            ys.append((h * self.C).sum(-1))
        return torch.stack(ys, 1).pow(2).mean()


def test_a_value_read_by_every_step_of_a_scan_is_not_eliminated_into_a_dense_table():
    """Its term over all 16 readers would hold 3**17 entries (1 GB; Mamba's 4**14 was 2 GiB and
    ended a compile in MemoryError): the segment is left to the A* and the beam before any
    table is built, and the plan is found in little memory."""
    import tracemalloc
    from pathlib import Path

    traced = hapc.trace(_Scan(), (torch.randn(5, 16, 6),))
    tracemalloc.start()
    try:
        plan = hapc.baseline(traced, None, str(Path(__file__).resolve().parents[2] / "configs" / "clusters" / "cpu-3nodes-1-2-3.yaml"), "megatron-tp")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.cost > 0 and peak < 300e6, f"{peak / 1e6:.0f} MB"
