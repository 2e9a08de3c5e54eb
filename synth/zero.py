"""ZeRO as a plan choice: shard the optimizer state of replicated parameters over the ranks.

A parameter stored replicated costs every rank its whole gradient and optimizer state (16
bytes per parameter under AdamW with float32 master weights, of which 12 are gradient and
moments). ZeRO's first two stages keep the weights whole but let rank ``r`` own a share
``z[r]`` of each such parameter's rows: it keeps only those rows' optimizer state (ZeRO-1) and,
in a one-stage program, only their gradient (ZeRO-2), receives them by a reduce-scatter instead
of an all-reduce, updates them, and all-gathers the updated rows back. A reduce-scatter and an
all-gather move what one all-reduce moves, so even shares cost nearly nothing in time; uneven
ones cost the padding of the largest piece (:func:`costmodel.memory.zero_sync_factor`).
ZeRO-3 is a storage layout: a ``Shard`` parameter gathered whole just before use and gathered
again in backward (the search chooses it per parameter, see :mod:`synth.moves`).
:func:`with_sharded_storage` applies it to every replicated weight of a program that computes
fast but does not fit, keeping how it computes: what FSDP does to a data-parallel model.

The shares are a memory choice, made after a program is found, because the state's bytes do not
depend on the compute shares: a device's total is ``base[r] + z[r] * state[r]``, affine in
``z`` and measured from two pricings (without ZeRO, and with even shares). Even shares when they fit; otherwise
each device is filled up to its headroom by a water level, which gives the fewest bytes to the
most loaded device and so the smallest largest piece (the collectives' padding): an
A100-80GB beside a V100-32GB keeps the larger slice of the state. Pipelined programs under
micro-batches accumulate whole gradients between synchronisations, so there only the optimizer
state is sharded (:mod:`costmodel.pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from costmodel.memory import zero_buffer_bytes
from hapc.ir.layout import Replicate, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute
from hapc.ir.shards import storage_dim

# What the rounding of shares to whole rows may add to a device, as a fraction of its state
# bytes: a rank gets at most one row more than its share of a parameter, and parameters worth
# sharding have thousands of rows.
ROW_ROUNDING_MARGIN = 0.002

Totals = Callable[[DistProgram], Sequence[float]]


def shardable(program: DistProgram) -> bool:
    """Whether ``program`` has state ZeRO would shard: a trainable parameter stored replicated
    with a row for every rank (:meth:`DistProgram.state_rows`)."""
    if program.world == 1:
        return False
    even = with_state_shares(program, (1.0 / program.world,) * program.world)
    return any(even.state_rows(p) is not None for p in program.graph.params)


def with_state_shares(program: DistProgram, state_shares: Sequence[float] | None) -> DistProgram:
    """``program`` with its replicated parameters' state sharded at ``state_shares`` (None: not)."""
    shares = None if state_shares is None else tuple(float(z) for z in state_shares)
    return replace(program, steps=list(program.steps), state_shares=shares, _blocks=program.blocks(), _pieces=None)


def fitted_state_shares(base: Sequence[float], state: Sequence[float],
                        capacity: Sequence[float]) -> tuple[float, ...] | None:
    """Shares ``z`` (summing to 1) with ``base[r] + z[r] * state[r] <= capacity[r]`` on every
    device, even when even shares fit, else water-filled to each device's headroom (the
    smallest largest share); None when the headrooms add up to less than the whole state."""
    world = len(base)
    even = 1.0 / world
    room = [(c - b) / s - ROW_ROUNDING_MARGIN if s > 0 else float("inf")
            for b, s, c in zip(base, state, capacity)]
    if all(r >= even for r in room):
        return (even,) * world
    room = [max(0.0, r) for r in room]
    if sum(min(r, 1.0) for r in room) < 1.0:
        return None
    low, high = 0.0, 1.0          # the water level t with sum(min(room, t)) == 1
    for _ in range(60):
        level = (low + high) / 2
        if sum(min(r, level) for r in room) < 1.0:
            low = level
        else:
            high = level
    shares = [min(r, high) for r in room]
    total = sum(shares)
    return tuple(z / total for z in shares)


def with_fitted_states(program: DistProgram, capacity: Sequence[float], totals: Totals) -> DistProgram | None:
    """``program`` with the state shares that make it fit (``totals`` prices a program's bytes
    per device), or None when it has nothing to shard or no shares fit."""
    if not shardable(program):
        return None
    world = program.world
    whole = totals(with_state_shares(program, None))
    zero = with_state_shares(program, (1.0 / world,) * world)
    even, buffers = totals(zero), zero_buffer_bytes(zero)
    # whole = rest + state; even = rest + buffers + state / world
    state = [(w - e + buffers) * world / (world - 1) for w, e in zip(whole, even)]
    base = [w - s + buffers for w, s in zip(whole, state)]
    shares = fitted_state_shares(base, state, capacity)
    return None if shares is None else with_state_shares(program, shares)


def with_sharded_storage(program: DistProgram) -> DistProgram | None:
    """``program`` with every trainable weight it stores replicated and reads whole stored
    sharded instead (on its largest dimension, as the ``zero3`` baseline) and gathered just
    before its first reader (ZeRO-3); how it computes is unchanged. None when no weight
    qualifies: one redistributed to another layout by the program keeps its storage."""
    graph = program.graph
    moved = {s.src for s in program.steps if isinstance(s, Redistribute)}
    dims: dict[str, int] = {}
    for p in graph.params:
        shape = graph.meta(p).shape
        if not graph.values[p].requires_grad or p in moved or \
                not isinstance(program.source_layouts.get(p, Replicate()), Replicate):
            continue
        d = storage_dim(shape)
        if d is not None and shape[d] >= program.world:
            dims[p] = d
    if not dims:
        return None
    steps: list = []
    gathered: set[str] = set()
    for step in program.steps:
        if isinstance(step, Compute) and any(r in dims for r in step.inputs):
            for r in dict.fromkeys(r for r in step.inputs if r in dims and r not in gathered):
                steps.append(Redistribute(r, f"{r}@R", Shard(dims[r]), Replicate()))
                gathered.add(r)
            step = Compute(step.node, step.strategy, tuple(f"{r}@R" if r in dims else r for r in step.inputs))
        steps.append(step)
    layouts = {**program.source_layouts, **{p: Shard(d) for p, d in dims.items()}}
    return DistProgram(graph, program.shares, layouts, steps, program.state_shares, program.recompute)
