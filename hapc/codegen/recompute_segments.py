"""Recomputed stretches of a pipeline stage's forward, written as nested functions.

A one-stage program that recomputes calls each layer's block function through
``rt.recompute`` (:mod:`hapc.codegen.by_block`). A pipeline stage's forward is written inline,
one line per step, and a stage may begin or end inside a layer. So here a recomputed call is
the stretch of the stage's steps that belong to it (:func:`costmodel.recompute.call_of_steps`:
the steps the cost model prices as run again in backward), written as a function nested in
the stage's forward: it takes what the stretch reads from before it and returns what is read
after it, and the stage calls it through ``rt.recompute``. The nested function's lines are the
inline lines, one level deeper, with the same value names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from costmodel.recompute import call_of_steps
from hapc.codegen.by_block import _wrap as wrap
from hapc.ir.program import Compute, DistProgram, Redistribute


@dataclass(frozen=True)
class Segment:
    """Steps ``[start, stop)`` of a stage's list, inside one recomputed call (its ``call``,
    the call's first step in the program)."""

    start: int
    stop: int
    call: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def recomputed_segments(program: DistProgram, steps: Sequence, returned: Sequence[str]) -> list[Segment]:
    """The stretches of ``steps`` (a stage's, objects of ``program.steps``) inside recomputed
    calls, with what each reads from before it and what is read after it (by a later step or in
    ``returned``, what the stage sends or returns)."""
    calls = call_of_steps(program)
    if not calls:
        return []
    position = {id(s): k for k, s in enumerate(program.steps)}
    mutates = {n.name: n.mutates for n in program.graph.nodes}
    outputs = {n.name: n.outputs for n in program.graph.nodes}

    def call_start(step: object) -> int | None:
        call = calls.get(position.get(id(step), -1))
        return None if call is None else call.start

    runs: list[tuple[int, int, int]] = []
    i = 0
    while i < len(steps):
        start = call_start(steps[i])
        j = i + 1
        if start is not None:
            while j < len(steps) and call_start(steps[j]) == start:
                j += 1
            runs.append((i, j, start))
        i = j
    segments = []
    for i, j, start in runs:
        made: list[str] = []
        reads: list[str] = []
        for step in steps[i:j]:
            for name in _reads(step, mutates):
                if name not in made:
                    reads.append(name)
            made += [step.out] if isinstance(step, Redistribute) else list(outputs[step.node])
        later = {name for step in steps[j:] for name in _reads(step, mutates)} | set(returned)
        segments.append(Segment(i, j, start, tuple(dict.fromkeys(reads)),
                                tuple(name for name in dict.fromkeys(made) if name in later)))
    return [s for s in segments if s.outputs]


def render_segment(segment: Segment, index: int, names: Callable[[str], str], body: list[str]) -> list[str]:
    """The nested function of ``segment`` (its inline ``body`` lines, indented once more) and
    the line that calls it through ``rt.recompute``."""
    fn = f"recomputed_{index}"
    args = [names(x) for x in segment.inputs]
    outs = ", ".join(names(x) for x in segment.outputs)
    lines = ["    # Recomputed: forward keeps only its inputs, backward runs it again first (rt.recompute)."]
    lines += wrap(f"    def {fn}(", args, "):")
    lines += ["    " + line for line in body]
    lines.append(f"        return {outs}")
    lines += wrap(f"    {outs} = rt.recompute(", [fn, *args], ")")
    return lines


def _reads(step: object, mutates: dict[str, str | None]) -> tuple[str, ...]:
    if isinstance(step, Redistribute):
        return (step.src,)
    assert isinstance(step, Compute)
    written = mutates.get(step.node)
    return tuple(step.inputs) + ((written,) if written else ())
