"""Random rule cases: every registered rule on random shapes and random uneven splits.

A rule case is one strategy of one rule, checked by :func:`hapc.rules.check.check_strategy`
(the rule checker: the strategy's local computation on every rank's piece, reassembled,
against the unsharded op, forward and gradients, float64) on

* **random shapes**: one of the rule's own samples with its sizes remapped. Every distinct
  dimension size above 1 of the sample's tensors is mapped to a new size (1, primes, small
  composites), consistently across tensors, and so are equal integers inside list arguments
  (a layer norm's ``normalized_shape``); integer tensors (ids, targets) are redrawn within the
  new sizes. A remapped sample the op itself rejects is discarded (``assume``); rules whose
  samples only run at their own sizes (views given a literal target shape) still get random
  splits of those.
* **random uneven splits** over 1-9 ranks: shares spread up to 100x, zero shares, dimensions
  shorter than the rank count, hence **empty pieces**.

:func:`rule_cases` draws a :class:`RuleCase`; :func:`check_rule_case` returns ``None`` or
what went wrong.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import reduce
from math import gcd
from typing import Any

import torch
from hypothesis import assume
from hypothesis import strategies as st

from hapc.ir.layout import Partial, Shard
from hapc.ir.program import Strategy
from hapc.ir.shards import largest_remainder
from hapc.rules.check import check_strategy, sample_graph
from hapc.rules.registry import Sample, rules, strategies

NEW_SIZES = (1, 2, 3, 4, 5, 7, 8, 11, 13)
SHARE_LEVELS = (0.0, 0.01, 0.05, 0.2, 0.5, 1.0, 3.0)


@dataclass(frozen=True)
class RuleCase:
    op: str
    sample: int                          # index into the rule's samples
    sizes: tuple[tuple[int, int], ...]   # (old size, new size) remapping; () keeps the sample's
    shares: tuple[float, ...]
    strategy: int                        # index into strategies(node, graph) of the new sample
    seed: int = 0


def ops_with_samples() -> list[str]:
    return [op for op, rule in rules().items() if rule.samples]


@st.composite
def shares_strategy(draw, max_ranks: int = 9) -> tuple[float, ...]:
    world = draw(st.integers(1, max_ranks))
    levels = [draw(st.sampled_from(SHARE_LEVELS)) for _ in range(world)]
    if not any(levels):
        levels[draw(st.integers(0, world - 1))] = 1.0
    total = sum(levels)
    return tuple(x / total for x in levels)


@st.composite
def rule_cases(draw, ops: list[str] | None = None) -> RuleCase:
    op = draw(st.sampled_from(ops or ops_with_samples()))
    samples = rules()[op].samples()
    index = draw(st.integers(0, len(samples) - 1))
    old = sorted({n for t in _tensors(samples[index]) for n in t.shape if n > 1})
    sizes: tuple[tuple[int, int], ...] = ()
    if old and draw(st.integers(0, 3)):           # 3 in 4 cases: new shapes
        sizes = tuple((n, draw(st.sampled_from(NEW_SIZES))) for n in old)
    shares = draw(shares_strategy())
    return RuleCase(op, index, sizes, shares, draw(st.integers(0, 63)), draw(st.integers(0, 2**16)))


def case_sample(case: RuleCase) -> Sample:
    """The case's sample: the rule's own, with its sizes remapped (see module docstring)."""
    sample = rules()[case.op].samples()[case.sample]
    if not case.sizes or sample.owners != "any":
        # A sample whose tensors hold each other's structure (a grouped matmul's offsets count
        # its rows, sorted expert ids) is checked at its own sizes: redrawn, they would not.
        return sample
    remap = dict(case.sizes)
    gen = torch.Generator().manual_seed(case.seed)
    return Sample(_remap(sample.args, remap, gen), {k: _remap(v, remap, gen) for k, v in sample.kwargs.items()},
                  sample.frozen)


def check_rule_case(case: RuleCase) -> str | None:
    """``None`` when the case's strategy reproduces the op; else the checker's finding.

    Calls ``assume(False)`` for a remapped sample the op rejects (not a rule case at all).
    """
    sample = case_sample(case)
    if case.sizes:
        try:
            node, graph, _ = sample_graph(case.op, sample)
        except Exception:          # the op itself rejects these sizes: not a valid case
            assume(False)
            raise                  # unreachable: assume(False) raises
    else:
        node, graph, _ = sample_graph(case.op, sample)
    options = strategies(node, graph)
    strat: Strategy = options[case.strategy % len(options)]
    if any(isinstance(x, Partial) for x in strat.inputs) and has_empty_piece(node, graph, strat, case.shares):
        # Known limitation (see test_fuzz_regressions): a summand input (a bias) beside empty
        # pieces of a contraction, which the search has not produced; drawn only on request.
        assume(os.environ.get("FUZZ_PARTIAL_EMPTY", "") not in ("", "0"))
    return check_strategy(case.op, sample, strat, case.shares)


def has_empty_piece(node, graph, strat: Strategy, shares: tuple[float, ...]) -> bool:
    """Whether some rank gets an empty piece: all sharded dims of one strategy share one block
    count, the gcd of their lengths (as ``DistProgram.blocks`` finds for a one-node program)."""
    dims = [graph.meta(v).shape[lay.dim] for v, lay in zip(node.input_refs(), strat.inputs) if isinstance(lay, Shard)]
    dims += [graph.meta(v).shape[lay.dim] for v, lay in zip(node.outputs, strat.outputs) if isinstance(lay, Shard)]
    if not dims:
        return False
    return 0 in largest_remainder(reduce(gcd, dims), shares)


def describe(case: RuleCase) -> str:
    sample = case_sample(case)
    node, graph, _ = sample_graph(case.op, sample)
    options = strategies(node, graph)
    shapes = [tuple(t.shape) for t in _tensors(sample)]
    return f"{case} -> shapes {shapes}, strategy {options[case.strategy % len(options)]}"


def _tensors(sample: Sample) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def walk(a: Any) -> None:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                walk(x)
        elif isinstance(a, dict):
            for x in a.values():
                walk(x)

    walk(sample.args)
    walk(sample.kwargs)
    return found


def _remap(a: Any, remap: dict[int, int], gen: torch.Generator, in_list: bool = False) -> Any:
    if isinstance(a, torch.Tensor):
        return _redraw(a, remap, gen)
    if isinstance(a, (list, tuple)):
        return type(a)(_remap(x, remap, gen, in_list=True) for x in a)
    if in_list and isinstance(a, int) and not isinstance(a, bool) and a > 2:
        return remap.get(a, a)            # a shape-like list: normalized_shape, sizes
    return a


def _redraw(t: torch.Tensor, remap: dict[int, int], gen: torch.Generator) -> torch.Tensor:
    shape = tuple(remap.get(n, n) for n in t.shape)
    if t.dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if t.is_floating_point():
        x = torch.randn(shape, generator=gen, dtype=t.dtype)
        if t.numel() and bool((t > 0).all()):          # a positive input (log, sqrt, divisor)
            x = x.abs() + 0.5
        return x
    # Ids, targets, indices: values below the new size of the smallest dimension that bounded
    # them; negative markers (ignore_index) kept in place.
    if not t.numel():
        return t.new_zeros(shape)
    bound = int(t.max()) + 1
    olds = [n for n in remap if n >= bound]
    high = remap[min(olds)] if olds else bound
    x = torch.randint(0, max(high, 1), shape, generator=gen, dtype=t.dtype)
    if shape == tuple(t.shape):
        x = torch.where(t < 0, t, x)
    return x
