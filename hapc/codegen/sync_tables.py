"""The tables that say how each parameter's gradient and storage travel: which replicated
parameters are synchronised and in what order (``GRAD_SYNC_ORDER``), which of them keep their
optimizer state in owned rows (``STATE_ROWS``, ZeRO-1/2) and which weights stored sharded
travel in low precision (``LOW_GATHERS``, ZeRO-3). Shared by the one-stage and pipeline emitters.
"""

from __future__ import annotations

from costmodel.simulator import factor_synced_params
from costmodel.transfers import low_precision_gather
from hapc.ir.layout import Replicate
from hapc.ir.program import Compute, DistProgram, Redistribute


def low_gathers(program: DistProgram) -> list[tuple[str, str]]:
    """(weight, dtype) of the gathers of weights stored sharded whose readers are all bf16/fp16
    products (:func:`costmodel.transfers.low_precision_gather`)."""
    return [(s.src, low) for s in program.steps if isinstance(s, Redistribute)
            for low in [low_precision_gather(program, s)] if low is not None]


def state_rows(program: DistProgram) -> list[tuple[str, tuple[int, ...]]]:
    """(parameter, rows each rank owns) of the gradient-synchronised parameters ZeRO shards."""
    rows = ((p, program.state_rows(p)) for p in grad_sync_order(program))
    return [(p, tuple(n)) for p, n in rows if n is not None]


def grad_sync_order(program: DistProgram) -> tuple[str, ...]:
    """The trainable parameters stored replicated whose gradients need synchronising (not those
    a sufficient-factor product completes on every rank), in the order backward finishes them:
    last read first, unread last."""
    graph = program.graph
    wanted = {p for p in graph.params if graph.values[p].requires_grad
              and isinstance(program.source_layouts.get(p, Replicate()), Replicate)}
    wanted -= factor_synced_params(program)     # complete on every rank already
    first: dict[str, int] = {}
    for i, step in enumerate(program.steps):
        for name in (step.inputs if isinstance(step, Compute) else (step.src,)):
            if name in wanted and name not in first:
                first[name] = i
    unused = [p for p in graph.params if p in wanted and p not in first]
    return tuple(sorted(first, key=lambda p: -first[p])) + tuple(unused)
