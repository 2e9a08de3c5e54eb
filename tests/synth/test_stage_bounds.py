"""Stage planner speed-ups that must not change its answer: the lower bounds that price a device
group before it has a program (every bound below what any program on the group costs), and the
planner with groups synthesised lazily against the planner with every group synthesised first."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from costmodel.cluster import load_cluster

REPO = Path(__file__).resolve().parents[2]
TWO_NODES = REPO / "configs" / "clusters" / "cpu-2nodes-2x2.yaml"
SMALL_MIXED = REPO / "configs" / "clusters" / "small-mixed.yaml"
GPT2L = {"layers": 2, "hidden": 64, "heads": 4, "seq": 64, "vocab": 101, "batch": 32, "dropout": 0.0}


@pytest.fixture(scope="module")
def gpt2l(load_model):
    import torch

    from hapc.frontend.tracer import trace

    mod = load_model("gpt")
    with torch.device("meta"):
        model = mod.model(**GPT2L)
    return trace(model, tuple(t.to("meta") for t in mod.inputs(**GPT2L)))


def _groups(planner):
    seen = {}
    for nodes in planner.device_orders():
        for groups in planner.groups_of(nodes)[1].values():
            for g in groups:
                seen.setdefault(g.key, g)
    return list(seen.values())


@pytest.mark.parametrize("cluster_file", [TWO_NODES, SMALL_MIXED])
def test_group_bounds_never_exceed_what_a_program_costs(gpt2l, cluster_file):
    """For the searched program and for plain even data parallelism on every group, at two
    micro-batch counts: steps, forward parts and tails bounded below, in-flight room above."""
    from synth.baselines import baseline_program
    from synth.stages import StagePlanner

    cluster = load_cluster(str(cluster_file))
    searched = StagePlanner(gpt2l.graph, cluster)
    even = StagePlanner(gpt2l.graph, cluster, group_synthesizer=lambda graph, group: baseline_program("dp-even", graph, group))
    upper = np.triu(np.ones((len(searched.cuts),) * 2, dtype=bool), 1)
    for planner in (searched, even):
        for group in _groups(planner):
            for m in (1, 4):
                real, bound = planner.matrices(group, m), planner.bound_matrices(group, m)
                for name in ("fwd", "bwd", "step"):
                    assert (bound[name][upper] <= real[name][upper] * (1 + 1e-12) + 1e-15).all(), (group.key, m, name)
                assert (bound["tail"] + bound["exposed"] <= real["tail"] + real["exposed"] + 1e-15)[upper].all()
                assert (bound["inflight_max"] >= real["inflight_max"])[upper].all()
                # tight where nothing but compute is paid: a one-device group's step is exact
                if len(group.ranks) == 1:
                    np.testing.assert_allclose(bound["step"][upper], real["step"][upper], rtol=1e-9)


@pytest.mark.parametrize("cluster_file, memory_bytes", [(TWO_NODES, None), (SMALL_MIXED, 1.3e6)])
def test_lazy_groups_find_the_same_plan_as_synthesising_every_group(gpt2l, cluster_file, memory_bytes):
    from synth.stages import StagePlanner

    cluster = load_cluster(str(cluster_file))
    if memory_bytes:
        cluster = replace(cluster, devices=[replace(d, memory_bytes=memory_bytes) for d in cluster.devices])
    eager = StagePlanner(gpt2l.graph, cluster).plan()
    lazy_planner = StagePlanner(gpt2l.graph, cluster, lazy_groups=True)
    lazy = lazy_planner.plan()
    assert lazy is not None and eager is not None
    assert lazy.iteration_seconds == pytest.approx(eager.iteration_seconds, rel=1e-12)
    assert lazy.search["exact"] and eager.search["exact"]
    assert lazy.search["group_syntheses"] + lazy.search["groups_bounded_only"] == eager.search["group_syntheses"]
    # against an incumbent only just above the optimum, groups that cannot help stay unsynthesised
    tight = StagePlanner(gpt2l.graph, cluster, lazy_groups=True).plan(incumbent_seconds=eager.iteration_seconds * 1.0001)
    assert tight is not None and tight.iteration_seconds == pytest.approx(eager.iteration_seconds, rel=1e-12)
    assert tight.search["group_syntheses"] <= eager.search["group_syntheses"]
