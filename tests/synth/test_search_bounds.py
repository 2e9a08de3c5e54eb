"""The A*'s bounds checked against the exact cost to go in *every* reachable state, not only
along the optimum: the heuristic (each live value's relaxation, passed on to what its readers
produce) must be a lower bound and consistent, and the per-exit-layout bounds that stop a
segment early must be lower bounds too. An inadmissible bound would not fail loudly: the
search would return a plan that is merely good, and call it optimal."""

from __future__ import annotations

import math

import pytest
import torch

import hapc
from bench.common import HAP8, small_config, trace_model
from costmodel import load_cluster
from synth.costs import Prices
from synth.bounds import TargetBound, ValueBound
from synth.search import Searcher
from synth.space import SearchSpace
from tests.synth.test_search import THREE_UNEVEN, Chain

_SETTINGS = (("hap8-flops", str(HAP8), None, 0.0), ("three-even", THREE_UNEVEN, "even", 0.75))


@pytest.fixture(scope="module")
def graphs():
    torch.manual_seed(0)
    chain = hapc.trace(Chain(depth=3, width=12), (torch.randn(6, 12), torch.randn(6, 12))).graph
    return {"gpt": trace_model("gpt", **small_config("gpt")).graph, "chain": chain}


_CASES = [("gpt", _SETTINGS[0]), pytest.param("gpt", _SETTINGS[1], marks=pytest.mark.slow),   # ~8 s on 2 cores
          ("chain", _SETTINGS[0]), ("chain", _SETTINGS[1])]


@pytest.mark.parametrize(("model", "setting"), _CASES)
def test_bounds_never_exceed_the_exact_cost_to_go_in_any_reachable_state(graphs, model, setting):
    _, cluster_file, shares, overlap = setting
    graph, cluster = graphs[model], load_cluster(cluster_file)
    shares = [1.0 / cluster.world] * cluster.world if shares == "even" else cluster.flops_shares()
    space = SearchSpace.build(graph, Prices(graph, cluster, shares, grad_sync_overlap=overlap))
    searcher = Searcher(space)
    frontier: dict = {(): (0.0, [])}
    checked, seen = 0, set()
    for seg in space.segments:
        if seg.signature not in seen:
            seen.add(seg.signature)
            checked += _check_segment(searcher, seg, set(frontier))
        frontier = searcher._prune_frontier(seg, searcher.solve_segment(seg, frontier))
    assert checked >= (1000 if model == "gpt" else 10)


def _check_segment(searcher: Searcher, seg, entries: set) -> int:
    """Enumerate every state the segment can reach from ``entries``, price the exact cost to
    go backwards (to any exit, and to an exit of each layout the target bounds know), and
    compare each bound with it. Returns how many (state, bound) pairs were checked."""
    nodes = searcher.space.nodes
    moves: list[dict] = []
    reached = entries
    for i in range(seg.start, seg.stop):
        moves.append({st: searcher._expand(nodes[i], st) for st in reached})
        reached = {after for out in moves[-1].values() for after, *_ in out}
    value_bound = ValueBound(searcher, seg)
    towards = TargetBound.of_segment(searcher, seg, value_bound)
    targets: dict = {None: None, **(towards.producers if towards else {})}
    checked = 0
    for code, options in targets.items():
        to_go = {st: 0.0 for st in reached}
        for j in range(len(moves) - 1, -1, -1):
            i = seg.start + j
            allowed = options if i == seg.stop - 1 else None
            here = {}
            for st, out in moves[j].items():
                here[st] = min((c + to_go[after] for after, c, k, _ in out if allowed is None or k in allowed),
                               default=math.inf)
                if code is None:
                    bound = value_bound.of(i, st)
                    for after, c, _, _ in out:          # consistent: never drops by more than a move costs
                        assert bound <= c + value_bound.of(i + 1, after) + 1e-12, (seg.start, i, st, after)
                else:
                    bound = towards._bound(code, i, st)
                assert bound <= here[st] + 1e-12, (code, seg.start, i, st, bound, here[st])
                checked += 1
            to_go = here
    return checked
