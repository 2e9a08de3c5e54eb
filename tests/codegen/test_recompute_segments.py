"""Recomputed stretches of a pipeline stage (hapc/codegen/recompute_segments.py, issue 22): a
stage's steps inside a recomputed layer call become a nested function called through
``rt.recompute``, reading what the stretch reads from before it and returning what is read
after it, even where a stage begins or ends inside a layer. A 2x2-rank pipelined GPT with
dropout and recomputed layers verifies in tests/e2e/test_pipeline_run.py (slow)."""

from __future__ import annotations

import ast

from costmodel.recompute import recomputed_calls
from hapc.codegen.recompute_segments import recomputed_segments, render_segment
from hapc.ir.program import Compute, Redistribute
from synth.levers import with_recompute

from test_blocks import gpt_program


def _made(program, steps) -> set[str]:
    outputs = {n.name: n.outputs for n in program.graph.nodes}
    return {v for s in steps for v in ([s.out] if isinstance(s, Redistribute) else outputs[s.node])}


def _read(steps) -> set[str]:
    return {v for s in steps for v in ((s.src,) if isinstance(s, Redistribute) else s.inputs)}


def test_a_stage_cut_inside_layers_recomputes_each_part_with_its_own_inputs_and_outputs():
    program = with_recompute(gpt_program(3, dropout=0.1))
    calls = recomputed_calls(program)
    assert len(calls) == 3
    # a stage from the middle of the first layer to the middle of the third
    first = (calls[0].start + calls[0].stop) // 2
    stop = (calls[2].start + calls[2].stop) // 2
    steps, after = program.steps[first:stop], program.steps[stop:]
    sent = sorted(_made(program, steps) & _read(after))        # what the stage sends on
    segments = recomputed_segments(program, steps, returned=sent)
    assert [(s.start, s.stop) for s in segments] == [
        (0, calls[0].stop - first), (calls[1].start - first, calls[1].stop - first),
        (calls[2].start - first, stop - first)]
    for seg in segments:
        inside = steps[seg.start:seg.stop]
        made = _made(program, inside)
        assert set(seg.inputs) == _read(inside) - made          # what it reads from before it
        assert set(seg.outputs) == made & (_read(steps[seg.stop:]) | set(sent))    # read after it
    assert sent and set(segments[-1].outputs) <= set(sent)       # the last part feeds the next stage only
    # a stretch nothing reads after is not worth a function: written inline
    assert len(recomputed_segments(program, steps, returned=())) == 2


def test_no_segments_without_recomputation():
    program = gpt_program(3)
    assert recomputed_segments(program, program.steps, returned=(program.graph.output,)) == []


def test_a_segment_renders_as_a_nested_function_called_through_rt_recompute():
    program = with_recompute(gpt_program(2))
    (seg, *_) = recomputed_segments(program, program.steps, returned=(program.graph.output,))
    body = [f"    {n.replace('@', '_')} = f()" for s in program.steps[seg.start:seg.stop]
            if isinstance(s, Compute) for n in program.graph.node(s.node).outputs]
    lines = render_segment(seg, 0, lambda v: v.replace("@", "_"), body)
    text = "def stage_0(rt, f):\n" + "\n".join(lines) + "\n"
    ast.parse(text)
    assert "    def recomputed_0(" in text and "rt.recompute(" in text and "recomputed_0, " in text
