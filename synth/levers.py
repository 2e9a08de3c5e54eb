"""Memory levers for a program that computes fast but does not fit: the variants to price.

The search and the share LP find how to compute; when the fastest way does not fit, these keep
that computation and trade time for memory, in the order they usually cost:

* ZeRO-1/2, the optimizer state (and gradients) of replicated weights in rows each rank owns:
  about free in time (:func:`synth.zero.with_fitted_states`);
* activation recomputation, each layer's forward run again in backward instead of keeping its
  activations: a third more compute (:func:`with_recompute`, :mod:`costmodel.recompute`);
* ZeRO-3, replicated weights stored sharded and gathered for use: three transfers of every
  weight per step (:func:`synth.zero.with_sharded_storage`);

and their combinations. Each is priced by the simulator, and the fastest that fits wins: which
lever is cheapest depends on the model and the cluster (recomputation is cheap where compute is
fast and the network slow; ZeRO-3 the other way round).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from costmodel.recompute import recomputed_calls
from hapc.ir.program import DistProgram
from synth.zero import Totals, with_fitted_states, with_sharded_storage


def with_recompute(program: DistProgram) -> DistProgram | None:
    """``program`` recomputing every call of its repeated blocks in backward; None when it has
    no repeated block (or recomputes already)."""
    if program.recompute:
        return None
    recomputing = replace(program, steps=list(program.steps), recompute=True, _pieces=None)
    return recomputing if recomputed_calls(recomputing) else None     # found once, remembered


def without_recompute(program: DistProgram) -> DistProgram:
    """``program`` keeping its layers' activations (for a pipeline stage: its forward is written
    inline, without the block functions ``rt.recompute`` calls)."""
    return replace(program, steps=list(program.steps), recompute=False, _pieces=None) if program.recompute \
        else program


def memory_variants(program: DistProgram, capacity: Sequence[float], totals: Totals) -> Iterator[DistProgram]:
    """The variants of ``program`` with less memory (see the module docstring), each once;
    ``totals`` prices a program's bytes per device (for the ZeRO rows that fit)."""
    def states(p: DistProgram | None) -> DistProgram | None:
        return None if p is None else with_fitted_states(p, capacity, totals)

    recomputed = with_recompute(program)
    sharded = with_sharded_storage(program)
    builders: list[Callable[[], DistProgram | None]] = [
        lambda: states(program),
        lambda: recomputed,
        lambda: states(recomputed),
        lambda: sharded,
        lambda: with_recompute(sharded) if sharded is not None else None,
    ]
    for build in builders:
        variant = build()
        if variant is not None:
            yield variant
