"""Gradient accumulation in one-stage plans: the batch runs as ``m`` equal micro-batches over
all devices (or a node alone, the others idle), their gradients summed and synchronised once
per step.

It is a pipeline of one stage (:class:`synth.stages.Pipeline`), so it shares the pipelines'
runtime, exact loss weighting (:mod:`synth.microbatching`), pricing, plan.json form and
``--verify``. It holds one micro-batch's activations instead of the batch's, for ``m`` times
the per-step overheads, so it is chosen when memory binds the one-stage plan (``hapc.api``)
or forced with ``--microbatches``. Its shares are not the one-stage plan's: with less memory
per sample, the share LP may give fast devices back the work memory had moved off them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace


from hapc.ir.program import DistProgram
from synth.loads import snapped_to_blocks, with_shares
from synth.stages import Pipeline, StagePlanner
from synth.stagespace import Group
from synth.levers import with_recompute, without_recompute
from synth.zero import with_fitted_states, with_sharded_storage

# How far over a device's memory the leanest variant may be and still be fitted (ZeRO's rows of what
# it keeps replicated may close that much).
REACH_MARGIN = 1.1


def accumulation(planner: StagePlanner, microbatches: int | None = None,
                 programs: Sequence[DistProgram] = (), ranks: Sequence[int] | None = None,
                 incumbent_seconds: float | None = None) -> Pipeline | None:
    """Gradient accumulation: one stage over all devices that runs the batch as ``m`` equal
    micro-batches, summing their gradients and synchronising them once (a pipeline of one
    stage, so the same runtime, loss weighting and verification). It holds one micro-batch's
    activations instead of the batch's, for ``m`` times the per-step overheads.

    The fastest that fits over ``m`` (``microbatches`` forces one) and over the group programs:
    the planner's own (searched without memory limits) and ``programs`` (the one-stage search's
    best, searched with them, which may store more of the model sharded). A program that does
    not fit as it is is tried with the memory levers, cheapest first: its layers recomputed in
    backward (:func:`synth.levers.with_recompute`) or its replicated weights stored sharded
    (ZeRO-3, :func:`synth.zero.with_sharded_storage`), then both; a lever costs time at the same
    shares, so one is tried only where the program without it does not fit. Each try runs at the
    program's shares and, on a mixed cluster, at those the share LP gives it under the
    micro-batch's memory, and one that does not fit is tried again with its optimizer state
    sharded over the ranks (ZeRO-1, :mod:`synth.zero`). Counts are tried from the fewest
    micro-batches up, while some program that could beat the best so far does not fit yet: each
    doubling halves the activations held (so a cheaper lever, or the LP's shares that give fast
    devices more, may fit) for more per-step overheads. None when none fits (found at once when
    not even the leanest variant fits at the most micro-batches) or the model's samples are
    coupled (:mod:`synth.microbatching`). ``ranks``: the devices it runs on (default all; a node
    alone, :func:`synth.stages.best_sub_cluster`), ``programs`` then over those.

    ``incumbent_seconds`` (the best plan found otherwise) prunes: a program is not fitted (the
    share LP, ZeRO's rows: a dozen pricings) where it is no faster than that even before its
    memory is fitted, at its own shares and at the fastest program's, whose shares the LP gives
    without memory limits."""
    ranks = tuple(range(planner.cluster.world) if ranks is None else ranks)
    whole = planner.group(ranks)
    if microbatches is not None:
        counts = [microbatches]
    else:
        counts = [m for m in planner.microbatch_counts([whole]) if m > 1]
    if not counts:
        return None
    prices = _Prices(planner, ranks)
    fastest = planner.group_program(whole)
    levels = []
    for program in (fastest, *(without_recompute(p) for p in programs)):
        recomputed, sharded = with_recompute(program), with_sharded_storage(program)
        both = with_sharded_storage(recomputed) if recomputed is not None else None
        levels.append([[program], [p for p in (recomputed, sharded) if p is not None], [p for p in (both,) if p]])
    if all(_beyond_reach(prices, [p for level in program_levels for p in level], counts[-1], whole)
           for program_levels in levels):
        return None            # not even the leanest variant at the most micro-batches fits
    best: Pipeline | None = None
    for m in counts:
        bound = min(s for s in (incumbent_seconds, best.iteration_seconds if best else None, math.inf)
                    if s is not None)
        unfitted = False       # a program under the bound that does not fit yet: more micro-batches may fit it
        for program_levels in levels:
            for level in program_levels:
                fitted = False
                for program in level:
                    if _floor(prices, program, fastest.shares, m) >= bound:
                        continue
                    pipes = _fitting(prices, program, m, whole)
                    unfitted = unfitted or not pipes
                    for pipe in pipes:
                        fitted = True
                        if best is None or pipe.iteration_seconds < best.iteration_seconds:
                            best = pipe
                if fitted:
                    break           # the next levers cost more time at the same shares
        if not unfitted:
            break          # all that could win fits already: more micro-batches only add overheads
    return best


def _beyond_reach(prices: _Prices, variants: list[DistProgram], m: int, group: Group) -> bool:
    """Whether no variant of a program can fit with ``m`` micro-batches (the most tried): the
    leanest (the last lever, fewest bytes) at ``m`` needs more than some device of a group of
    equal devices has, or more than all the devices of a mixed group have together (shares
    move bytes between devices, but what is sharded adds up to the same whole, and what is
    replicated only grows with the devices that hold it). A margin keeps ZeRO's rows, which it
    does not try, from being ruled out."""
    used = prices.memory(variants[-1], m)
    capacity = [prices.planner.cluster.devices[r].memory_bytes for r in prices.ranks]
    if group.cluster.is_homogeneous:
        return any(u > REACH_MARGIN * c for u, c in zip(used, capacity))
    return sum(used) > REACH_MARGIN * sum(capacity)


def _floor(prices: _Prices, program: DistProgram, fastest: tuple[float, ...], m: int) -> float:
    """What ``program`` costs with ``m`` micro-batches before its memory is fitted, at its own
    shares or the fastest program's, whichever is less: fitting it (ZeRO's rows, the share LP
    under memory) only adds time to that."""
    own = prices.one_stage(program, m, require_fit=False).iteration_seconds
    if tuple(program.shares) == tuple(fastest):
        return own
    return min(own, prices.one_stage(with_shares(program, fastest), m, require_fit=False).iteration_seconds)


def _fitting(prices: _Prices, program: DistProgram, m: int, group: Group) -> list[Pipeline]:
    """``program`` as one stage of ``m`` micro-batches at its shares and, on a mixed group, at
    the share LP's (and those without slivers of a block, :mod:`synth.loads`), each with ZeRO-1
    rows where it does not fit: those that fit."""
    pipe = prices.one_stage(program, m, require_fit=False)
    tries = [pipe]
    if not group.cluster.is_homogeneous:
        rebalanced = _rebalanced(prices, program, m, pipe)
        if rebalanced is not None:
            snapped = with_shares(rebalanced, snapped_to_blocks(rebalanced, rebalanced.shares))
            tries += [prices.one_stage(rebalanced, m), prices.one_stage(snapped, m)]
    out = []
    for pipe in tries:
        if pipe is not None and not pipe.fits_in(prices.planner.cluster):
            pipe = _with_zero(prices, pipe, m)
        if pipe is not None and pipe.fits_in(prices.planner.cluster):
            out.append(pipe)
    return out


class _Prices:
    """One-stage pricings of programs over ``ranks``, each program's pricer built once for every
    micro-batch count (:class:`costmodel.pipeline.ProgramPricer` takes a program apart once)."""

    def __init__(self, planner: StagePlanner, ranks: tuple[int, ...]) -> None:
        self.planner, self.ranks = planner, ranks
        self._solo: dict[int, tuple[DistProgram, StagePlanner]] = {}

    def one_stage(self, program: DistProgram, m: int, require_fit: bool = True) -> Pipeline | None:
        """``program`` over the ranks as one stage of ``m`` micro-batches, priced."""
        held = self._solo.get(id(program))
        if held is None or held[0] is not program:
            planner = self.planner
            solo = StagePlanner(planner.graph, planner.cluster, optimizer=planner.optimizer, like=planner,
                                group_synthesizer=lambda graph, group: program)
            held = self._solo[id(program)] = (program, solo)
        solo = held[1]
        return solo._price([(solo.group(self.ranks), 0, len(solo.cuts) - 1)], m, "1f1b", require_fit=require_fit)

    def memory(self, program: DistProgram, m: int) -> Sequence[float]:
        """Each rank's predicted peak bytes under ``program`` with ``m`` micro-batches."""
        return self.one_stage(program, m, require_fit=False).cost.stage_memory_bytes[0]


def _with_zero(prices: _Prices, pipe: Pipeline, m: int) -> Pipeline | None:
    """``pipe`` with its optimizer state sharded over the ranks as much as makes it fit (ZeRO-1:
    the gradients accumulate whole over the micro-batches, :mod:`synth.zero`); None when no
    state shares fit."""
    capacity = [prices.planner.cluster.devices[r].memory_bytes for r in prices.ranks]
    program = with_fitted_states(pipe.stages[0].program, capacity, lambda other: prices.memory(other, m))
    return None if program is None else prices.one_stage(program, m)


def _rebalanced(prices: _Prices, program: DistProgram, m: int, priced: Pipeline) -> DistProgram | None:
    """``program`` at the shares the share LP finds for it with the memory of ``m``
    micro-batches (affine in the shares, from two pricings); None when no shares fit."""
    from costmodel.simulator import simulate
    from synth.loads import MemoryInfeasible, device_loads, memory_coefficients
    from synth.ratios import solve_shares

    planner = prices.planner
    cluster = planner.group(prices.ranks).cluster
    loads = device_loads(program, simulate(program, cluster, optimizer=planner.optimizer), cluster,
                         planner.optimizer)
    mem, fixed = memory_coefficients(program, priced.cost.stage_memory_bytes[0], lambda other: prices.memory(other, m))
    try:
        solution = solve_shares(replace(loads, m=mem, c=fixed).problem())
    except MemoryInfeasible:
        return None
    return with_shares(program, solution.device_shares(cluster.world))
