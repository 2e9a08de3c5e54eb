"""The A* search returns the optimum of its cost model: equal to brute force on small graphs
and to an ILP (pulp) on a medium chain; a time budget gives a valid plan with a known gap."""

from __future__ import annotations

import itertools
import math

import pulp
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hapc
from costmodel import load_cluster
from hapc.codegen.executor import replicated_program, run
from synth.costs import Prices
from synth.search import Searcher, search, to_program
from synth.space import FREE, PARAM, SearchSpace

THREE_UNEVEN = {"nodes": [{"devices": [{"name": "a", "tflops": 0.3, "memory_GB": 8, "hbm_GBps": 30, "count": 1},
                                       {"name": "b", "tflops": 0.2, "memory_GB": 8, "hbm_GBps": 20, "count": 1},
                                       {"name": "c", "tflops": 0.1, "memory_GB": 8, "hbm_GBps": 10, "count": 1}],
                           "intra_link": "loopback"}]}


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 24)
        self.b = nn.Linear(24, 5)

    def forward(self, x, y):
        return F.mse_loss(self.b(torch.relu(self.a(x))), y)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 12)
        self.b = nn.Linear(12, 12)

    def forward(self, x):
        h = x + self.b(torch.tanh(self.a(x)))
        return h.sum()


class Chain(nn.Module):
    def __init__(self, depth=8, width=24):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return F.mse_loss(x, y)


def _space(model, inputs, cluster=THREE_UNEVEN, shares=None):
    traced = hapc.trace(model, inputs)
    cl = load_cluster(cluster)
    shares = shares or cl.flops_shares()
    return traced, SearchSpace.build(traced.graph, Prices(traced.graph, cl, shares)), shares


def _assignment_cost(space: SearchSpace, searcher: Searcher, options: tuple[int, ...]) -> float:
    """Price one complete assignment the plain way: walk the nodes, keep every copy made."""
    held: dict[str, set] = {}
    cost = 0.0
    for ns, k in zip(space.nodes, options):
        strat = ns.options[k]
        cost += ns.compute_seconds[k]
        for (value, kind), want in zip(ns.inputs, strat.inputs):
            if kind == FREE:
                continue
            if kind == PARAM:
                cost += searcher._param_price(value, want)[0]
                continue
            if want not in held[value]:
                v = space.graph.values[value]
                cost += min(space.prices.move(v.meta, v.requires_grad, src, want).seconds for src in held[value])
                held[value].add(want)
        for out, lay in zip(ns.node.outputs, strat.outputs):
            held[out] = {lay}
    loss = held[space.graph.output]
    if not any(type(x).__name__ in ("Replicate", "Partial") for x in loss):
        return math.inf
    return cost


def _brute_force(space: SearchSpace) -> float:
    searcher = Searcher(space)
    sizes = [len(ns.options) for ns in space.nodes]
    assert math.prod(sizes) <= 300_000, sizes
    return min(_assignment_cost(space, searcher, combo)
               for combo in itertools.product(*(range(n) for n in sizes)))


@pytest.mark.parametrize("build", [
    lambda: (TwoLayer(), (torch.randn(7, 12), torch.randn(7, 5))),
    lambda: (Residual(), (torch.randn(9, 12),)),
])
def test_search_equals_brute_force(build):
    model, inputs = build()
    _, space, _ = _space(model, inputs)
    assert len(space.nodes) <= 8
    result = search(space)
    assert result.exact
    assert result.cost_seconds == pytest.approx(_brute_force(space), rel=1e-12)


def test_search_equals_brute_force_on_small_mixed_cluster():
    _, space, _ = _space(TwoLayer(), (torch.randn(8, 12), torch.randn(8, 5)), "configs/clusters/small-mixed.yaml")
    assert search(space).cost_seconds == pytest.approx(_brute_force(space), rel=1e-12)


def _ilp_optimum(space: SearchSpace) -> float:
    """The same problem as an ILP: one strategy per node, a layout change priced per edge.

    Exact for graphs whose activations each have one reader (a chain), where the search's
    reuse of copies cannot matter.
    """
    searcher = Searcher(space)
    prob = pulp.LpProblem("plan", pulp.LpMinimize)
    x = {(i, k): pulp.LpVariable(f"x_{i}_{k}", cat="Binary")
         for i, ns in enumerate(space.nodes) for k in range(len(ns.options))}
    producer = {o: (i, j) for i, ns in enumerate(space.nodes) for j, o in enumerate(ns.node.outputs)}
    terms = []
    for i, ns in enumerate(space.nodes):
        prob += pulp.lpSum(x[i, k] for k in range(len(ns.options))) == 1
        for k, strat in enumerate(ns.options):
            fixed = ns.compute_seconds[k]
            for (value, kind), want in zip(ns.inputs, strat.inputs):
                if kind == PARAM:
                    fixed += searcher._param_price(value, want)[0]
            terms.append(fixed * x[i, k])
        for pos, (value, kind) in enumerate(ns.inputs):
            if kind != "act":
                continue
            p, j = producer[value]
            meta = space.graph.values[value]
            for kp, sp in enumerate(space.nodes[p].options):
                for k, strat in enumerate(ns.options):
                    c = space.prices.move(meta.meta, meta.requires_grad, sp.outputs[j], strat.inputs[pos]).seconds
                    if c > 0:
                        z = pulp.LpVariable(f"z_{i}_{pos}_{kp}_{k}", lowBound=0)
                        prob += z >= x[p, kp] + x[i, k] - 1
                        terms.append(c * z)
    last = len(space.nodes) - 1
    for k, strat in enumerate(space.nodes[last].options):
        if type(strat.outputs[0]).__name__ == "Shard":
            prob += x[last, k] == 0
    prob += pulp.lpSum(terms) * 1e6       # microseconds: CBC's absolute tolerances assume O(1) costs
    prob.solve(pulp.PULP_CBC_CMD(msg=False, gapRel=0.0))
    assert pulp.LpStatus[prob.status] == "Optimal"
    return pulp.value(prob.objective) / 1e6


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_search_equals_ilp_on_a_medium_chain():
    _, space, _ = _space(Chain(depth=8), (torch.randn(9, 24), torch.randn(9, 24)))
    assert len(space.nodes) >= 17
    assert search(space).cost_seconds == pytest.approx(_ilp_optimum(space), rel=1e-6)


def test_time_budget_returns_a_valid_plan_with_its_gap():
    traced, space, shares = _space(Chain(depth=6), (torch.randn(9, 24), torch.randn(9, 24)))
    exact = search(space)
    rushed = search(space, time_budget_seconds=1e-9)
    assert not rushed.exact
    assert rushed.lower_bound_seconds <= exact.cost_seconds + 1e-15 <= rushed.cost_seconds + 1e-15
    assert 0.0 <= rushed.gap < 1.0
    x, y = torch.randn(9, 24), torch.randn(9, 24)
    got = run(to_program(space, rushed, shares), traced, (x, y), dtype=torch.float64)
    ref = run(replicated_program(traced.graph), traced, (x, y), dtype=torch.float64)
    assert abs(got.loss - ref.loss).item() < 1e-9


def test_repeated_layers_are_solved_once():
    _, space, _ = _space(Chain(depth=12), (torch.randn(9, 24), torch.randn(9, 24)))
    result = search(space)
    assert result.distinct_segments < result.segments / 3


def test_a_layout_change_prices_its_backward_with_the_forward_variant():
    """The emitted dual runs the forward's variant, and so must the search's price."""
    from costmodel.collectives import collective_seconds
    from hapc.ir.graph import TensorMeta
    from hapc.ir.layout import Replicate, Shard

    data = {"nodes": [{"devices": [{"type": "cpu", "count": 2}],
                       "intra_link": {"bandwidth_GBps": 1, "latency_us": 100,
                                      "collectives": {"all_gather": {"bandwidth_GBps": 0.2},
                                                      "all_to_all": {"bandwidth_GBps": 0.8}}}}]}
    cluster = load_cluster(data)
    meta = TensorMeta((1024, 256), "float32")
    price = Prices(_empty_graph(), cluster, (0.5, 0.5)).move(meta, True, Shard(0), Replicate())
    assert price.fwd_kind == "all_gather" and price.fwd_variant == "all_to_all"   # the slow ring loses
    piece = [1024 * 256 * 4 / 2] * 2
    want = (collective_seconds("all_gather", piece, cluster, variant="all_to_all")
            + collective_seconds("reduce_scatter", piece, cluster, variant="all_to_all"))
    assert price.seconds == pytest.approx(want)


def _empty_graph():
    from hapc.ir.graph import Graph

    return Graph(values={}, nodes=[], inputs=[], params=[], buffers=[], output="")
