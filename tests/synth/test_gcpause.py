"""synthesize() runs with the cyclic collector paused (hapc.process.collector.gc_paused). That is
only safe while the loop makes no reference cycles: a finished search, its eliminated segments and its
prices must be freed by reference counting alone."""

from __future__ import annotations

import weakref

import torch

import hapc
from costmodel import load_cluster
from synth.costs import Prices
from hapc.process.collector import gc_paused
from synth.search import Searcher
from synth.space import SearchSpace
from tests.synth.test_elimination import Gate  # (several live values: its segment is eliminated)

TWO_UNEVEN = {"nodes": [{"devices": [{"name": "a", "tflops": 0.3, "memory_GB": 8, "hbm_GBps": 30, "count": 1},
                                     {"name": "b", "tflops": 0.1, "memory_GB": 8, "hbm_GBps": 10, "count": 1}],
                         "intra_link": "loopback"}]}


def test_a_finished_search_is_freed_without_the_cyclic_collector():
    torch.manual_seed(0)
    traced = hapc.trace(Gate(), (torch.randn(6, 8),))
    cluster = load_cluster(TWO_UNEVEN)
    prices = Prices(traced.graph, cluster, cluster.flops_shares())
    space = SearchSpace.build(traced.graph, prices)
    with gc_paused():
        searcher = Searcher(space)
        searcher.segment_budget = 0            # every segment eliminated: transfers are kept
        assert searcher.run().exact
        assert searcher.elimination.eliminations >= 1
        freed = weakref.ref(searcher), weakref.ref(space), weakref.ref(prices)
        del searcher, space, prices
        assert [ref() for ref in freed] == [None, None, None]
