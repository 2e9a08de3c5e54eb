"""Gradient accumulation in one-stage plans: the batch runs as ``m`` equal micro-batches over
all devices, their gradients summed and synchronised once per step.

It is a pipeline of one stage (:class:`synth.stages.Pipeline`), so it shares the pipelines'
runtime, exact loss weighting (:mod:`synth.microbatching`), pricing, plan.json form and
``--verify``. It holds one micro-batch's activations instead of the batch's, for ``m`` times
the per-step overheads, so it is chosen when memory binds the one-stage plan (``hapc.api``)
or forced with ``--microbatches``. Its shares are not the one-stage plan's: with less memory
per sample, the share LP may give fast devices back the work memory had moved off them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace


from hapc.ir.program import DistProgram
from synth.loads import snapped_to_blocks, with_shares
from synth.stages import Pipeline, StagePlanner
from synth.levers import without_recompute
from synth.zero import with_fitted_states, with_sharded_storage


def accumulation(planner: StagePlanner, microbatches: int | None = None,
                 programs: Sequence[DistProgram] = ()) -> Pipeline | None:
    """Gradient accumulation: one stage over all devices that runs the batch as ``m`` equal
    micro-batches, summing their gradients and synchronising them once (a pipeline of one
    stage, so the same runtime, loss weighting and verification). It holds one micro-batch's
    activations instead of the batch's, for ``m`` times the per-step overheads.

    The fastest that fits over ``m`` (``microbatches`` forces one) and over the group programs:
    the planner's own (searched without memory limits), ``programs`` (the one-stage search's
    best, searched with them, which may store more of the model sharded), each of those with
    its replicated weights stored sharded (ZeRO-3, :func:`synth.zero.with_sharded_storage`),
    and on a mixed cluster each of them at the shares the share LP gives it under the
    micro-batch's memory. Counts are
    tried from the fewest micro-batches up, until one is no faster than the fewer before it:
    each doubling halves the activations held (so the LP may give fast devices more) for more
    per-step overheads. A try that does not fit is tried again with its optimizer state sharded
    over the ranks (ZeRO-1, :mod:`synth.zero`). None when none fits or the model's samples are
    coupled (:mod:`synth.microbatching`)."""
    whole = planner.group(range(planner.cluster.world))
    if microbatches is not None:
        counts = [microbatches]
    else:
        counts = [m for m in planner.microbatch_counts([whole]) if m > 1]
    if not counts:
        return None
    # A pipeline's stage forwards are written inline (no block functions), so none recomputes.
    candidates = [planner.group_program(whole), *(without_recompute(p) for p in programs)]
    candidates += [p for p in map(with_sharded_storage, candidates) if p is not None]     # ZeRO-3
    best: Pipeline | None = None
    for m in counts:
        before = best
        for program in candidates:
            pipe = _one_stage(planner, program, m, require_fit=False)
            tries = [pipe]
            if not planner.cluster.is_homogeneous:
                rebalanced = _rebalanced(planner, program, m, pipe)
                if rebalanced is not None:      # and without slivers of a block (synth.loads)
                    snapped = with_shares(rebalanced, snapped_to_blocks(rebalanced, rebalanced.shares))
                    tries += [_one_stage(planner, rebalanced, m), _one_stage(planner, snapped, m)]
            for pipe in tries:
                if pipe is not None and not pipe.fits_in(planner.cluster):
                    pipe = _with_zero(planner, pipe, m)
                if pipe is not None and pipe.fits_in(planner.cluster) and \
                        (best is None or pipe.iteration_seconds < best.iteration_seconds):
                    best = pipe
        if before is not None and best is before:
            break          # more micro-batches freed no memory worth their overheads
    return best


def _with_zero(planner: StagePlanner, pipe: Pipeline, m: int) -> Pipeline | None:
    """``pipe`` with its optimizer state sharded over the ranks as much as makes it fit (ZeRO-1:
    the gradients accumulate whole over the micro-batches, :mod:`synth.zero`); None when no
    state shares fit."""
    program = with_fitted_states(pipe.stages[0].program, planner.cluster.memory_bytes(),
                                 lambda other: _one_stage(planner, other, m, require_fit=False).cost.stage_memory_bytes[0])
    return None if program is None else _one_stage(planner, program, m)


def _one_stage(planner: StagePlanner, program: DistProgram, m: int, require_fit: bool = True) -> Pipeline | None:
    """``program`` over all devices as one stage of ``m`` micro-batches, priced."""
    solo = StagePlanner(planner.graph, planner.cluster, optimizer=planner.optimizer, like=planner,
                        group_synthesizer=lambda graph, group: program)
    return solo._price([(solo.group(range(planner.cluster.world)), 0, len(solo.cuts) - 1)], m, "1f1b",
                       require_fit=require_fit)


def _rebalanced(planner: StagePlanner, program: DistProgram, m: int, priced: Pipeline) -> DistProgram | None:
    """``program`` at the shares the share LP finds for it with the memory of ``m``
    micro-batches (affine in the shares, from two pricings); None when no shares fit."""
    from costmodel.simulator import simulate
    from synth.loads import MemoryInfeasible, device_loads, memory_coefficients
    from synth.ratios import solve_shares

    cluster = planner.cluster

    def totals_of(other: DistProgram) -> Sequence[float]:
        return _one_stage(planner, other, m, require_fit=False).cost.stage_memory_bytes[0]

    loads = device_loads(program, simulate(program, cluster, optimizer=planner.optimizer), cluster,
                         planner.optimizer)
    mem, fixed = memory_coefficients(program, priced.cost.stage_memory_bytes[0], totals_of)
    try:
        solution = solve_shares(replace(loads, m=mem, c=fixed).problem())
    except MemoryInfeasible:
        return None
    return with_shares(program, solution.device_shares(cluster.world))
