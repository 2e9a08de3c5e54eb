"""Every registered rule passes the checker on uneven 3-way shards, and the checker catches
wrong rules (it is only worth something if it can fail)."""

from __future__ import annotations

import pytest

from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules import rules
from hapc.rules.check import check_rule, check_strategy
from hapc.rules.registry import Sample
from hapc.rules.samples import T


@pytest.mark.parametrize("op", sorted(rules()))
def test_rule_passes_checker(op):
    report = check_rule(rules()[op])
    assert not report.no_samples, f"{op} has no samples"
    assert not report.wrong, "\n".join(map(str, report.wrong))


# Sharded dims of one strategy are cut into gcd-of-lengths blocks: the mis-wired ones below use equal
# lengths, since coprime ones leave a single block on one rank (the others hold empty pieces, and
# any strategy is then right: that rank computes the whole).
@pytest.mark.parametrize("op, sample, strategy", [
    ("aten.relu.default", Sample((T(5, 7),)), Strategy((P,), (P,))),                      # relu is not linear
    ("aten.add.Tensor", Sample((T(5, 7), 1.0)), Strategy((P,), (P,))),                    # x + 1 on every rank
    ("aten.mm.default", Sample((T(10, 10), T(10, 5))), Strategy((Shard(1), Shard(0)), (Shard(0),))),
    ("aten.sum.dim_IntList", Sample((T(7, 7), [1])), Strategy((Shard(1),), (Shard(0),))),
    ("aten.mean.default", Sample((T(5, 7),)), Strategy((Shard(0),), (P,))),              # mean needs rescale
    ("aten.softmax.int", Sample((T(5, 7), 1)), Strategy((Shard(1),), (Shard(1),))),
])
def test_checker_rejects_wrong_strategies(op, sample, strategy):
    assert check_strategy(op, sample, strategy) is not None


def test_checker_accepts_row_parallel_matmul():
    assert check_strategy("aten.mm.default", Sample((T(7, 10), T(10, 5))),
                          Strategy((Shard(1), Shard(0)), (P,))) is None
    assert check_strategy("aten.mm.default", Sample((T(7, 10), T(10, 5))),
                          Strategy((R, Shard(1)), (Shard(1),))) is None
