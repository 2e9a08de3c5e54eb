"""A floor under a program's simulated iteration time, from its layout changes alone.

In the simulator (:mod:`costmodel.simulator`) every collective is a synchronisation point
on one network channel shared by all of them: it starts once every rank has arrived and the
channel is free, and every rank's clock moves past its end. So the iteration lasts at least
the sum of the collectives' durations, whatever the compute does. The collectives a
``Redistribute`` makes, forward and backward (:mod:`costmodel.transfers`), each cost at
least the cheapest variant that could price it; summing those gives a floor that needs no
timeline, no memory model and no per-node compute, and is priced once per distinct (shape,
dtype, layout change): a 48-layer GPT's program has a handful.

Left out, so the floor stays a floor: local moves (memory traffic), the all-reduces inside
local ops and the gradient all-reduces. ``hapc replan`` uses the floor to drop the old
program on a resized cluster without simulating it when the floor alone says it cannot win
(a tensor-parallel program whose collectives now cross the nodes' slow links).
"""

from __future__ import annotations

from costmodel.cluster import Cluster
from costmodel.collectives import VARIANTS, collective_seconds
from costmodel.transfers import Move, backward_move, forward_move, meta_of, requires_grad
from hapc.ir.program import DistProgram, Redistribute


def blocking_comm_floor_seconds(program: DistProgram, cluster: Cluster) -> float:
    """Seconds no simulation of ``program`` on ``cluster`` can undercut: the sum over its
    Redistribute steps of their forward and backward collectives, each at its cheapest
    variant (see the module docstring)."""
    priced: dict[tuple, float] = {}
    total = 0.0
    for step in program.steps:
        if not isinstance(step, Redistribute) or step.src_layout == step.dst_layout:
            continue
        key = (meta_of(program, step.src), meta_of(program, step.out), requires_grad(program, step.src),
               step.src_layout, step.dst_layout)
        seconds = priced.get(key)
        if seconds is None:
            seconds = priced[key] = (_cheapest(forward_move(program, step), cluster)
                                     + _cheapest(backward_move(program, step), cluster))
        total += seconds
    return total


def _cheapest(move: Move | None, cluster: Cluster) -> float:
    """The fewest seconds any variant of ``move``'s collective takes (0 for none or a local copy)."""
    if move is None or move.kind == "local":
        return 0.0
    best = float("inf")
    for variant in VARIANTS[move.kind]:
        try:
            seconds = collective_seconds(move.kind, move.piece_bytes, cluster, None, variant,
                                         send_matrix=move.send_matrix)
        except ValueError:          # a variant this group cannot run: it cannot be the one that ran
            continue
        best = min(best, seconds)
    return 0.0 if best == float("inf") else best
