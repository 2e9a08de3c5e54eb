"""What makes the synthesizer fast must not change what it finds: the communication-aware
heuristic stays a lower bound, structure shared between search spaces is the graph's alone,
segments known to be too hard are beamed at once only when they ran out of states (not of
time), and the outer loop's warm start rebuilds the same program at the LP's shares."""

from __future__ import annotations

import torch

import hapc
from costmodel import load_cluster
from costmodel.simulator import simulate
from synth.costs import Prices
from synth.bounds import ValueBound
from synth.search import Searcher, search, to_program
from synth.space import SearchSpace
from synth.synthesize import Candidate, _reshared
from tests.synth.test_search import THREE_UNEVEN, Chain, Residual, TwoLayer


def _traced(model, *inputs):
    torch.manual_seed(0)
    return hapc.trace(model, inputs)


_CLUSTER = load_cluster(THREE_UNEVEN)


def _build(graph, cluster=_CLUSTER, shares=None, **kw):
    cl = load_cluster(cluster)
    return SearchSpace.build(graph, Prices(graph, cl, shares or cl.flops_shares()), **kw)


def test_value_bound_never_exceeds_the_cost_to_go_along_the_optimum():
    """Along the optimal plan, the heuristic at every state is at most what the plan still pays."""
    for model, inputs in ((Residual(), (torch.randn(6, 12),)),
                          (TwoLayer(), (torch.randn(6, 12), torch.randn(6, 5))),
                          (Chain(depth=4, width=12), (torch.randn(6, 12), torch.randn(6, 12)))):
        space = _build(_traced(model, *inputs).graph)
        searcher = Searcher(space)
        result = searcher.run()
        assert result.exact
        state, g, trail = (), 0.0, []
        for ns, choice in zip(space.nodes, result.choices):
            trail.append((ns.index, state, g))
            moves = {k: (st, c) for st, c, k, _ in searcher._expand(ns, state)}
            state, cost = moves[choice.option]
            g += cost
        assert abs(g - result.cost_seconds) < 1e-12
        checked = 0
        for seg in space.segments:
            bound = ValueBound(searcher, seg)
            seg_end = next(gg for i, _, gg in trail if i == seg.stop - 1)
            last = space.nodes[seg.stop - 1]
            end_cost = seg_end + min(c for st, c, k, _ in searcher._expand(last, trail[seg.stop - 1][1])
                                     if k == result.choices[seg.stop - 1].option)
            for i, st, gi in trail[seg.start:seg.stop]:
                assert bound.of(i, st) <= end_cost - gi + 1e-12, (model, i)
                checked += 1
        assert checked == len(space.nodes)


def test_search_spaces_of_one_graph_share_its_structure():
    graph = _traced(Chain(depth=3, width=12), torch.randn(6, 12), torch.randn(6, 12)).graph
    a, b = _build(graph), _build(graph, shares=(0.2, 0.3, 0.5))
    assert a.live is b.live and [s.signature for s in a.segments] == [s.signature for s in b.segments]
    assert a.nodes[0].options == b.nodes[0].options
    assert a.nodes[0].compute_seconds != b.nodes[0].compute_seconds      # prices are not shared
    other = _traced(Chain(depth=3, width=12), torch.randn(6, 12), torch.randn(6, 12)).graph
    assert _build(other).live is not a.live


def test_segments_that_run_out_of_states_are_remembered_for_later_searches_of_the_graph(monkeypatch):
    """They are eliminated exactly (synth/elimination.py) without the A* trying them again,
    or beamed, and the plan marked inexact, where the elimination would be too wide."""
    from synth import elimination

    graph = _traced(Chain(depth=4, width=12), torch.randn(6, 12), torch.randn(6, 12)).graph
    first = Searcher(_build(graph))
    first.segment_budget = 0
    assert first.run().exact
    later = _build(graph)
    assert later.hard_segments                     # remembered for the graph on this cluster
    searcher = Searcher(later)
    assert searcher.run().exact and searcher.expanded == 0
    monkeypatch.setattr(elimination, "MAX_TABLE_ENTRIES", 1)
    result = search(_build(graph))
    assert not result.exact and result.cost_seconds > 0
    monkeypatch.undo()
    elsewhere = _build(graph, cluster=load_cluster(THREE_UNEVEN))    # another cluster object
    assert not elsewhere.hard_segments and search(elsewhere).exact


def test_running_out_of_time_is_not_remembered():
    graph = _traced(Chain(depth=4, width=12), torch.randn(6, 12), torch.randn(6, 12)).graph
    rushed = search(_build(graph), time_budget_seconds=1e-9)
    assert not rushed.exact
    assert not _build(graph).hard_segments
    assert search(_build(graph)).exact


def test_warm_start_is_the_same_program_at_the_new_shares():
    graph = _traced(TwoLayer(), torch.randn(6, 12), torch.randn(6, 5)).graph
    cluster = load_cluster(THREE_UNEVEN)
    space = _build(graph)
    result = search(space)
    prog = to_program(space, result, space.prices.shares)
    cand = Candidate("hapc", prog, simulate(prog, cluster), result, space)
    even = (1 / 3, 1 / 3, 1 / 3)
    warm = _reshared(cand, even, cluster, "adamw")
    assert warm is not None and warm.program.shares == even
    assert [repr(s) for s in warm.program.steps] == [repr(s) for s in prog.steps]
    assert warm.seconds == simulate(to_program(space, result, even), cluster).iteration_seconds
    assert _reshared(Candidate("dp-even", prog, cand.sim), even, cluster, "adamw") is None


def test_even_all_to_all_in_closed_form_equals_the_pairwise_sum():
    import random

    from costmodel import collectives

    rng = random.Random(0)
    clusters = [load_cluster("configs/clusters/hap-8gpu-v100x4-p100x4.yaml"),
                load_cluster({"nodes": [{"count": 3, "devices": [{"type": "A100-80GB", "count": 4}], "intra_link": "nvlink3"},
                                        {"count": 2, "devices": [{"type": "V100-32GB", "count": 2}], "intra_link": "pcie3"}],
                              "network": {"bandwidth_Gbps": 100, "latency_us": 10}})]
    for cluster in clusters:
        for _ in range(10):
            ranks = sorted(rng.sample(range(cluster.world), rng.randint(2, cluster.world)))
            pieces = [rng.random() * 1e6 for _ in ranks]
            p = len(ranks)
            matrix = [[x / p if s != r else 0.0 for s in range(p)] for r, x in enumerate(pieces)]
            slow = collectives._pairwise(matrix, cluster, ranks)
            assert abs(collectives._pairwise_uniform([x / p for x in pieces], cluster, ranks) - slow) <= 1e-12 * slow
            gather = [[x if s != r else 0.0 for s in range(p)] for r, x in enumerate(pieces)]
            slow = collectives._pairwise(gather, cluster, ranks)
            assert abs(collectives._pairwise_uniform(pieces, cluster, ranks) - slow) <= 1e-12 * slow


def test_stopping_at_beaten_exits_keeps_every_segment_result(monkeypatch):
    """Segments stop once every exit layout is beaten by a settled exit (see
    :class:`synth.bounds.TargetBound`): the optimum and each segment's useful exits are
    those of a search that drops no state early, on two clusters, shares and overlaps."""
    import synth.search as search_module
    from bench.common import HAP8, small_config, trace_model

    graphs = [trace_model("gpt", **small_config("gpt")).graph,
              _traced(Chain(depth=4, width=12), torch.randn(6, 12), torch.randn(6, 12)).graph]
    pruned_states = 0
    three, hap8 = load_cluster(THREE_UNEVEN), load_cluster(str(HAP8))
    settings = ((three, [1.0 / three.world] * three.world, 0.75), (hap8, hap8.flops_shares(), 0.0))
    for graph in graphs:
        for cluster, shares, overlap in settings:
            runs = {}
            for label in ("pruned", "full"):
                if label == "full":
                    monkeypatch.setattr(search_module.TargetBound, "of_segment", staticmethod(lambda *a: None))
                space = SearchSpace.build(graph, Prices(graph, cluster, shares, grad_sync_overlap=overlap))
                searcher = Searcher(space)
                runs[label] = (searcher.run(), searcher)
                monkeypatch.undo()
            (pruned, p), (full, f) = runs["pruned"], runs["full"]
            assert pruned.exact and full.exact
            assert abs(pruned.cost_seconds - full.cost_seconds) <= 1e-12 * max(1.0, full.cost_seconds)
            assert p.expanded <= f.expanded
            pruned_states += f.expanded - p.expanded
            segments = {seg.signature: seg for seg in space.segments}
            for key, exits in f._memo.items():   # the same useful exits at the same costs
                mine = p._memo.get(key)
                if mine is not None:
                    assert _useful(f, segments[key[0]], mine) == _useful(f, segments[key[0]], exits)
    assert pruned_states > 0


def _useful(searcher, seg, exits) -> dict:
    """A segment's exits that no other converts into for less, with their costs."""
    kept = searcher._prune_frontier(seg, {st: (g, None) for st, (g, _, _) in exits.items()})
    return {st: round(g, 15) for st, (g, _) in kept.items()}


def test_data_parallel_baselines_are_propagated_once_with_the_same_result():
    from synth.baselines import baseline_program, baseline_programs

    graph = _traced(TwoLayer(), torch.randn(6, 12), torch.randn(6, 5)).graph
    shared = baseline_programs(("dp-even", "dp-flops"), graph, _CLUSTER)
    for name in ("dp-even", "dp-flops"):
        alone = baseline_program(name, graph, _CLUSTER)
        assert shared[name].shares == alone.shares
        assert shared[name].source_layouts == alone.source_layouts
        assert [repr(s) for s in shared[name].steps] == [repr(s) for s in alone.steps]
    assert shared["dp-even"].shares != shared["dp-flops"].shares


def test_the_loops_shortcuts_find_what_the_plain_loop_finds(monkeypatch):
    """Prices shared between simulations (costmodel.simcache), memory made only for programs
    that could win, and baselines propagated once per repeated situation: the same plan, the
    same baselines and the same numbers as the plain loop, to the last bit."""
    import costmodel.simulator as simulator_module
    import synth.baselines as baselines_module
    import synth.synthesize as synthesize_module
    from synth.builder import propagate
    from tests.costmodel.test_cm_simcache import _Uncached

    graph = _traced(Chain(depth=4, width=12), torch.randn(6, 12), torch.randn(6, 12)).graph

    def outcome(syn):
        best = syn.best
        return (best.name, [repr(s) for s in best.program.steps], best.program.shares, best.sim.to_dict(),
                {k: c.sim.to_dict() for k, c in syn.baselines.items()}, syn.rounds)

    fast = outcome(synthesize_module.synthesize_program(graph, _CLUSTER))
    monkeypatch.setattr(simulator_module, "SimulationCache", _Uncached)
    monkeypatch.setattr(synthesize_module, "SimulationCache", _Uncached)
    monkeypatch.setattr(baselines_module, "propagate",
                        lambda *a, situation=None, **k: propagate(*a, **k))
    assert outcome(synthesize_module.synthesize_program(graph, _CLUSTER)) == fast


def test_better_asks_a_slower_program_nothing_about_memory():
    """ahead() equals 'fitting first, then faster' on every case, and never makes the memory
    report of a program no faster than a fitting incumbent (it loses either way)."""
    from itertools import product

    from costmodel.simulator import ahead

    class _Sim:
        def __init__(self, seconds, fits):
            self.iteration_seconds, self._fits, self.asked = seconds, fits, False

        @property
        def memory(self):
            self.asked = True
            return type("Report", (), {"all_fit": self._fits})()

    for (ta, fa), (tb, fb) in product(product((1.0, 2.0), (True, False)), repeat=2):
        a, b = Candidate("a", None, _Sim(ta, fa)), Candidate("b", None, _Sim(tb, fb))
        plain = fa if fa != fb else ta < tb * (1 - 1e-9)
        assert ahead(a, b) == plain
        assert not (a.sim.asked and fb and ta >= tb)
