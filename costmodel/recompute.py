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

_RECENT: dict[tuple, tuple[object, list[Call]]] = {}


def recomputed_calls(program: DistProgram) -> list[Call]:
    """The block calls ``program`` recomputes in backward, in program order (none unless
    ``program.recompute``). Found once per graph, steps, shares and source layouts (what the
    blocks depend on): the levers and the share LP price many copies of one program that differ
    only in their ZeRO rows or shares, and finding blocks is a tenth of a second on an LLM."""
    if not program.recompute:
        return []
    key = (id(program.graph), tuple(map(id, program.steps)), program.shares,
           tuple(sorted(program.source_layouts.items())))
    hit = _RECENT.get(key)
    if hit is not None:
        return hit[1]
    calls = sorted((c for block in find_blocks(program) for c in block.calls), key=lambda c: c.start)
    if len(_RECENT) > 16:
        _RECENT.clear()
    _RECENT[key] = ((program.graph, tuple(program.steps)), calls)     # held: their ids stay theirs
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

