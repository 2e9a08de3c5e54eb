"""How many fuzz cases run, and from which seed: fixed in the default and slow runs (CI), from
the environment in ``make fuzz`` (``FUZZ_SEED``, ``FUZZ_CASES``, ``FUZZ_RULE_CASES``)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, seed, settings

FIXED_SEED = 16          # issue 16


def fuzz_seed() -> int:
    return int(os.environ.get("FUZZ_SEED", FIXED_SEED))


def cases(env: str, default: int) -> int:
    """``default`` unless the environment variable ``env`` says otherwise."""
    return int(os.environ.get(env, default))


def fuzz(max_examples: int):
    """Hypothesis settings for a fuzz test: ``max_examples`` cases from :func:`fuzz_seed`, no
    deadline (a case traces and plans a model), no example database (runs are reproducible from
    the seed alone, and a failing case is printed as a literal to paste into a regression test)."""
    def wrap(test):
        test = settings(max_examples=max_examples, deadline=None, database=None, print_blob=False,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                               HealthCheck.data_too_large])(test)
        return seed(fuzz_seed())(test)
    return wrap
