"""Expert parallelism for Hugging Face's grouped matmul (``transformers::grouped_mm_fallback``):
every strategy against the unsharded op on uneven pieces, ``ExpertRows`` strategies with each
rank holding its experts' rows, the row-local ops between two grouped matmuls, and which values
of a real Mixtral graph may be held as expert rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hapc.ir.layout import E, P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.check import check_rule, check_strategy
from hapc.rules.registry import Sample, rules
from hapc.rules.samples import T

pytest.importorskip("transformers")

OP = "transformers.grouped_mm_fallback.default"
FAMILIES = Path(__file__).resolve().parents[1] / "e2e" / "families"


def _sample(counts=(3, 0, 4, 2, 1), owners="experts") -> Sample:
    import transformers.integrations.moe  # noqa: F401  (registers the op)

    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
    return Sample((T(sum(counts), 6), T(len(counts), 6, 7), offs), owners=owners)


def test_every_registered_strategy_matches_the_op():
    report = check_rule(rules()[OP])
    assert report.samples == 3 and report.strategies >= 15
    assert not report.wrong, [str(f) for f in report.wrong]


@pytest.mark.parametrize("shares", [(0.5, 0.3, 0.2), (0.25, 0.25, 0.25, 0.25), (0.1,) * 7])
@pytest.mark.parametrize("strategy", [
    Strategy((R, Shard(0), R), (E,), local="grouped_mm_experts"),
    Strategy((E, Shard(0), R), (E,), local="grouped_mm_experts"),
    Strategy((E, Shard(0), R), (P,), local="grouped_mm_experts_padded"),
    Strategy((R, Shard(0), R), (P,), local="grouped_mm_experts_padded"),
], ids=repr)
def test_expert_parallel_strategies_hold_their_experts_rows(strategy, shares):
    """Seven ranks for five experts: two hold no expert, and their pieces are empty."""
    for counts in ((3, 0, 4, 2, 1), (0, 0, 9, 1, 0)):
        assert check_strategy(OP, _sample(counts), strategy, shares) is None


def test_expert_rows_are_not_any_rows():
    """The checker would catch a rule that read expert rows other ranks hold."""
    wrong = check_strategy(OP, _sample(owners="any"), Strategy((E, Shard(0), R), (E,), local="grouped_mm_experts"))
    assert wrong is not None


@pytest.mark.parametrize("op, sample, strategy", [
    ("aten.silu.default", Sample((T(9, 4),)), Strategy((E,), (E,))),
    ("aten.sigmoid.default", Sample((T(9, 4),)), Strategy((E,), (E,))),
    ("aten.mul.Tensor", Sample((T(9, 4), T(9, 4))), Strategy((E, E), (E,))),
    ("aten.mul.Tensor", Sample((T(9, 4), T(4))), Strategy((E, R), (E,))),
    ("aten.add.Tensor", Sample((T(1, 4), T(9, 4))), Strategy((R, E), (E,))),
    ("aten.chunk.default", Sample((T(9, 8), 2, -1)), Strategy((E,), (E, E))),
    ("aten.slice.Tensor", Sample((T(9, 8), 1, 0, 8, 2)), Strategy((E,), (E,))),
    ("aten.to.dtype", Sample((T(9, 4), torch.float32)), Strategy((E,), (E,))),
])
def test_row_local_ops_keep_expert_rows(op, sample, strategy):
    assert check_strategy(op, sample, strategy) is None


@pytest.fixture(scope="module")
def mixtral_graph():
    sys.path.insert(0, str(FAMILIES))
    import mixtral

    import hapc

    torch.manual_seed(0)
    return hapc.trace(mixtral.model(), mixtral.inputs()).graph


def test_the_expert_mlp_between_two_grouped_matmuls_may_stay_on_expert_rows(mixtral_graph):
    from hapc.rules.expert_rows import GROUPED_MM_OPS, expert_row_values
    from hapc.rules.registry import strategies

    graph = mixtral_graph
    held = expert_row_values(graph)
    up, down = [n for n in graph.nodes if n.op in GROUPED_MM_OPS]
    assert up.outputs[0] in held and down.input_refs()[0] in held
    # The down projection's output is scaled by per-row routing weights ([rows, 1]), which only
    # whole rows can meet: it is not offered as expert rows, so it ends as a Partial.
    assert down.outputs[0] not in held
    down_outputs = {s.outputs for s in strategies(down, graph) if s.local}
    assert (E,) not in down_outputs and (P,) in down_outputs
    between = [n for n in graph.nodes if graph.nodes.index(up) < graph.nodes.index(n) < graph.nodes.index(down)]
    assert between and all(any(E in s.inputs for s in strategies(n, graph)) for n in between)
    # Nodes far from the experts see no such choice.
    assert not any(E in s.inputs + s.outputs for n in graph.nodes[:20] for s in strategies(n, graph))


@pytest.mark.parametrize("shares", [(0.5, 0.3, 0.2), (0.1,) * 7])
def test_a_routed_lookup_takes_the_rows_of_its_experts(shares):
    """GPT-OSS's expert biases, ``bias[sorted expert ids]``: each rank its experts' rows."""
    ids = torch.tensor([0, 0, 0, 2, 2, 2, 2, 3, 3, 4])
    sample = Sample((T(5, 7), [ids]), owners="routed")
    strategy = Strategy((Shard(0), R), (E,), local="index_expert_rows")
    assert check_strategy("aten.index.Tensor", sample, strategy, shares) is None
    assert check_strategy("aten.index.Tensor", Sample((T(5, 7), [ids]), owners="any"), strategy, shares) is not None
