"""Random ops' rules through the checker: every strategy draws through the counter-based
generator, and the checker (whose reference is that generator's global draw) catches the
wrong ones: torch's own generator, a piece of a non-elementwise draw, a mis-wired shard."""

from __future__ import annotations

import pytest

from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules import rules, strategies
from hapc.rules.check import check_rule, check_strategy, sample_graph
from hapc.rules.registry import Sample
from hapc.rules.samples import Pos, T
from hapc.runtime.random_ops import RANDOM_OPS


def test_every_random_op_has_a_rule_whose_every_strategy_draws_through_the_generator():
    assert RANDOM_OPS <= set(rules())
    for op in sorted(RANDOM_OPS):
        rule = rules()[op]
        for sample in rule.samples():
            node, graph, _ = sample_graph(op, sample)
            found = strategies(node, graph)
            assert any(s.is_replicated for s in found), op
            assert all(s.local in ("random_piece", "random_whole") for s in found), op
        assert not check_rule(rule).wrong, op


def test_elementwise_draws_may_be_born_sharded_and_follow_their_tensor():
    node, graph, _ = sample_graph("aten.rand.default", Sample(([5, 7],)))
    assert {s.outputs for s in strategies(node, graph)} == {(R,), (Shard(0),), (Shard(1),)}
    node, graph, _ = sample_graph("aten.randn_like.default", Sample((T(5, 7),)))
    assert Strategy((P,), (R,), local="random_piece") in strategies(node, graph)


@pytest.mark.parametrize("op, sample, strategy", [
    # The plain op on every rank: torch's generator, not the global draw (and ranks disagree).
    ("aten.rand.default", Sample(([5, 7],)), Strategy((), (R,))),
    ("aten.randn_like.default", Sample((T(6, 6),)), Strategy((Shard(0),), (Shard(0),))),
    # A piece of a non-elementwise draw is not the slice of the whole permutation.
    ("aten.randperm.default", Sample((9,)), Strategy((), (Shard(0),), local="random_piece")),
    ("aten.multinomial.default", Sample((Pos(9), 6)), Strategy((R,), (Shard(0),), local="random_piece")),
    # Whole draws kept whole but declared sharded; a probability shard wired to the wrong dimension.
    ("aten.rand.default", Sample(([6, 6],)), Strategy((), (Shard(0),), local="random_whole")),
    ("aten.bernoulli.Tensor", Sample((T(6, 6), Pos(6, 6) - 0.5)),
     Strategy((Shard(0), Shard(1)), (Shard(0),), local="random_piece")),
])
def test_checker_rejects_wrong_random_strategies(op, sample, strategy):
    assert check_strategy(op, sample, strategy) is not None
