"""Rule fuzzing (issue 16): every registered rule on random shapes and random uneven splits,
empty pieces included (see :mod:`tests.fuzz.rules`). A few dozen cases in the default run; the
big count with the fixed seed under ``-m slow``; ``make fuzz`` from a fresh seed."""

from __future__ import annotations

import pytest
from hypothesis import event, given

from tests.fuzz.rules import check_rule_case, describe, ops_with_samples, rule_cases
from tests.fuzz.settings import cases, fuzz


def _check(case) -> None:
    event(case.op.split(".")[1])
    error = check_rule_case(case)
    assert error is None, f"{describe(case)}: {error}"


@fuzz(cases("FUZZ_QUICK_RULE_CASES", 40))
@given(rule_cases())
def test_rules_quick(case):
    _check(case)


@pytest.mark.slow
@fuzz(cases("FUZZ_RULE_CASES", 20_000))
@given(rule_cases())
def test_rules(case):
    _check(case)


def test_every_rule_with_samples_is_drawn():
    """The generator draws from every rule that ships samples (all of them, today)."""
    from hapc.rules.registry import rules

    assert set(ops_with_samples()) == {op for op, r in rules().items() if r.samples}
    assert len(ops_with_samples()) == len(rules())
