"""Shares that respect whole blocks (synth.loads.snapped_to_blocks) and a data-parallel baseline
balanced by the share LP when it beats every searched program (synth.synthesize): with one
sample per device on a cluster whose slow devices are 50x slower, rounding gives any positive
share a whole sample, so the LP's "almost nothing" for the slow ones must become nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.cluster import load_cluster
from costmodel.simcache import SimulationCache
from costmodel.simulator import simulate
from hapc.frontend.modelfile import load_model_file
from hapc.frontend.tracer import trace
from synth.baselines import baseline_program
from synth.loads import snapped_to_blocks, with_shares
from synth.synthesize import Candidate, _balanced_baseline

ROOT = Path(__file__).resolve().parents[2]
SKEWED = {"name": "skewed", "nodes": [{"intra_link": "loopback", "devices": [
    {"name": "fast", "tflops": 0.2, "memory_GB": 8, "hbm_GBps": 20, "count": 2},
    {"name": "crawl", "tflops": 0.004, "memory_GB": 8, "hbm_GBps": 0.4, "count": 2}]}]}


@pytest.fixture(scope="module")
def one_sample_each():
    """The example GPT with a batch of 4 for 4 devices, data parallel at even shares."""
    mf = load_model_file(str(ROOT / "configs" / "models" / "gpt.py"),
                         {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "batch": 4, "dropout": 0.0})
    graph = trace(mf.build_model(), mf.build_inputs()).graph
    cluster = load_cluster(SKEWED)
    return graph, cluster, baseline_program("dp-even", graph, cluster)


def test_a_sliver_of_a_block_becomes_zero_and_the_rest_is_rescaled(one_sample_each):
    _, _, program = one_sample_each
    assert min(program.blocks().values()) == 4                  # the batch: one row per device
    assert snapped_to_blocks(program, (0.45, 0.45, 0.05, 0.05)) == pytest.approx((0.5, 0.5, 0.0, 0.0))
    assert snapped_to_blocks(program, (0.3, 0.3, 0.2, 0.2)) == (0.3, 0.3, 0.2, 0.2)   # each worth a row
    assert snapped_to_blocks(program, (0.25,) * 4) == (0.25,) * 4


def test_rounding_would_give_the_sliver_a_whole_sample(one_sample_each):
    graph, cluster, program = one_sample_each
    sliver, snapped = (0.45, 0.45, 0.05, 0.05), (0.5, 0.5, 0.0, 0.0)
    slow = simulate(with_shares(program, sliver), cluster).iteration_seconds
    assert slow == pytest.approx(simulate(program, cluster).iteration_seconds)    # one row each, as even
    # (the slow devices still update their replicated parameters: not 50x faster, but faster)
    assert simulate(with_shares(program, snapped), cluster).iteration_seconds < 0.7 * slow


def test_a_winning_baseline_is_balanced_into_hapcs_plan(one_sample_each):
    graph, cluster, program = one_sample_each
    even = Candidate("dp-even", program, simulate(program, cluster))
    balanced = _balanced_baseline(even, cluster, "adamw", "highs", SimulationCache(graph, cluster))
    assert balanced.name == "hapc" and balanced.program.shares[2:] == (0.0, 0.0)
    assert balanced.seconds < 0.7 * even.seconds and balanced.fits
