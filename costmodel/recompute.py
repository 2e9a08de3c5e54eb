"""Activation recomputation: which steps of a program keep nothing for backward.

A program with ``recompute`` set runs every call of a repeated block (a layer; see
:mod:`hapc.ir.blocks`) under ``torch.utils.checkpoint``: forward keeps only the call's inputs,
and backward runs the call's forward again just before its backward, keeping that one call's
activations while it does. It is Megatron's full recomputation at layer granularity: a layer's
activations (56 bytes per token and hidden unit for a bf16 Llama layer) for its input (2), for
one more forward of the layer (a third more compute, and its collectives again).

The memory model and both time models ask here which steps are inside a recomputed call
(:func:`recomputed_calls`); the emitter calls those same blocks through ``rt.recompute``.
"""

from __future__ import annotations

from hapc.ir.blocks import Call, find_blocks
from hapc.ir.program import DistProgram

_RECENT: dict[int, tuple[DistProgram, int, list[Call]]] = {}


def recomputed_calls(program: DistProgram) -> list[Call]:
    """The block calls ``program`` recomputes in backward, in program order (none unless
    ``program.recompute``); found once per program and step count."""
    if not program.recompute:
        return []
    hit = _RECENT.get(id(program))
    if hit is not None and hit[0] is program and hit[1] == len(program.steps):
        return hit[2]
    calls = sorted((c for block in find_blocks(program) for c in block.calls), key=lambda c: c.start)
    if len(_RECENT) > 8:
        _RECENT.clear()
    _RECENT[id(program)] = (program, len(program.steps), calls)
    return calls


def call_of_steps(program: DistProgram) -> dict[int, Call]:
    """Step index -> the recomputed call it is in (steps outside every call are absent)."""
    return {i: call for call in recomputed_calls(program) for i in range(call.start, call.stop)}


def saved_inputs(program: DistProgram, call: Call) -> list[str]:
    """What the checkpoint of ``call`` keeps: its inputs that are activations (parameters,
    buffers and constants are kept by the model anyway)."""
    values = program.graph.values
    return [name for name in call.inputs
            if values[name.split("@", 1)[0]].kind not in ("param", "buffer", "constant")]

