"""The emitted program by block (issue 13): repeated layers found in the distributed program,
written once as a function and called per layer, with per-layer tables written as loops.

Fast checks here; a 3-rank torchrun ``--verify`` of a block-emitted GPT with dropout is in
tests/e2e/test_torchrun.py (slow).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import re
from pathlib import Path

import pytest
import torch

import hapc
import hapc.codegen.emitter as emitter
from costmodel.cluster import load_cluster
from hapc.codegen import emit, render
from hapc.ir.blocks import find_blocks
from hapc.codegen.indexed import compress, render_dict, render_rows, render_tuple
from hapc.ir.repeats import longest_repeat
from hapc.ir.layout import Replicate
from hapc.ir.program import Compute, Strategy
from synth.baselines import baseline_program

REPO = Path(__file__).resolve().parents[2]
GPT = REPO / "configs" / "models" / "gpt.py"
SMALL_MIXED = REPO / "configs" / "clusters" / "small-mixed.yaml"


@functools.cache
def traced_gpt(layers: int, dropout: float = 0.3):
    from conftest import load_model_file

    module = load_model_file(GPT)
    kwargs = dict(module.SMALL, layers=layers, dropout=dropout)
    torch.manual_seed(0)
    return hapc.trace(module.model(**kwargs), tuple(module.inputs(**kwargs))), kwargs


def gpt_program(layers: int, plan: str = "dp-flops", dropout: float = 0.3):
    traced, _ = traced_gpt(layers, dropout)
    return baseline_program(plan, traced.graph, load_cluster(SMALL_MIXED))


# ---- finding blocks ---------------------------------------------------------------------------

def test_longest_repeat_finds_the_layers_and_ignores_short_periods():
    tokens = list("xy") + list("abcdefgh") * 5 + list("zz")
    found = longest_repeat(tokens, min_period=4)
    assert (found.start, found.period, found.copies) == (2, 8, 5)
    assert longest_repeat(list("abcabc"), min_period=4) is None


@pytest.mark.parametrize("plan, first", [("dp-flops", 0), ("megatron-tp", 1)])
def test_identical_layers_are_one_block_called_per_layer(plan, first):
    """Under Megatron the first layer reads the embedding's output in another layout, so it is
    planned differently and stays inline; the other layers are one block."""
    program = gpt_program(3, plan)
    blocks = find_blocks(program)
    assert len(blocks) == 1
    calls = blocks[0].calls
    assert len(calls) == 3 - first
    # Each call reads its own layer's parameters and the previous call's result.
    targets = program.graph.values
    for k, call in enumerate(calls):
        layers = {targets[v].target.split(".")[1] for v in call.inputs if v in targets and targets[v].kind == "param"}
        assert layers == {str(k + first)}, (k, layers)
        if k:
            assert calls[k - 1].outputs[0] in call.inputs
    # The last call's result is what the final LayerNorm reads; nothing else leaves a call.
    assert all(len(c.outputs) == 1 for c in calls)
    after = [s for s in program.steps[calls[-1].stop:] if isinstance(s, Compute)]
    assert calls[-1].outputs[0] in after[0].inputs
    # Every call's local ops are named per call (dropout masks are keyed by node name).
    assert len({c.nodes for c in calls}) == len(calls)


def test_a_layer_planned_differently_is_not_a_call_of_the_block():
    program = gpt_program(3)
    calls = find_blocks(program)[0].calls
    # Give one step of the third layer another strategy (here: replicated instead of sharded).
    i = next(i for i in range(calls[2].start, calls[2].stop)
             if isinstance(program.steps[i], Compute) and not program.steps[i].strategy.is_replicated
             and program.steps[i].strategy.local is None)
    step = program.steps[i]
    changed = dataclasses.replace(program, steps=list(program.steps))
    changed.steps[i] = Compute(step.node, Strategy(tuple(Replicate() for _ in step.strategy.inputs),
                                                   tuple(Replicate() for _ in step.strategy.outputs)), step.inputs)
    blocks = find_blocks(changed)
    starts = [c.start for b in blocks for c in b.calls]
    assert calls[2].start not in starts
    assert not any(c.start <= i < c.stop for b in blocks for c in b.calls)
    # The unchanged layers are still written once: layers 0-1 as one block (2 calls).
    assert [c.start for c in blocks[0].calls][:2] == [calls[0].start, calls[1].start]


def test_no_block_in_a_model_without_repeats():
    program = gpt_program(1)
    assert find_blocks(program) == []


# ---- tables as loops --------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [
    [(f"p_blocks_{i}_{s}", f"blocks.{i}.{s}") for i in range(7) for s in ("w", "b", "ln1")],
    [(f"view_{3 * k}",) for k in range(1, 9)] + [("view",), ("odd{1}'\"",)],
    [(f"x{k:02d}", k) for k in range(5)],             # leading zeros: written out
    [(f"a_{k * k}", 1) for k in range(6)],            # not affine: written out
    [(f"h.{47 - k}.w",) for k in range(10)],
])
def test_tables_written_as_loops_evaluate_back_to_their_rows(rows):
    for source, want in [(render_rows("T", rows), tuple(rows)),
                         (render_tuple("T", [r[0] for r in rows]), tuple(r[0] for r in rows))]:
        assert eval(source.split(" = ", 1)[1]) == want, source
    if all(len(r) == 2 for r in rows) and len({r[0] for r in rows}) == len(rows):
        source = render_dict("T", rows)
        got = eval(source.split(" = ", 1)[1])
        assert got == dict(rows) and list(got) == [r[0] for r in rows]


def test_per_layer_rows_become_one_comprehension():
    rows = [("p_tok",)] + [(f"p_blocks_{i}_ln1_weight", ) for i in range(48)] + [("p_ln_f",)]
    items = compress(rows)
    assert len(items) == 3 and items[1].loop == "range(48)"
    assert "for i in range(48)" in render_tuple("T", [r[0] for r in rows])


def test_per_rank_tables_and_summary_rows_read_as_runs():
    from hapc.codegen.emitter import _same_ranks_once
    from hapc.codegen.indexed import literal

    shares = (0.004328,) * 128 + (0.003485,) * 128
    assert literal(shares) == "(0.004328,) * 128 + (0.003485,) * 128" and eval(literal(shares)) == shares
    assert literal((0, (2, 1, 1, 1))) == "(0, (2, 1, 1, 1))"          # short: as it is
    assert eval(literal((1, tuple(range(20))))) == (1, tuple(range(20)))
    rows = ["rank node device"] + [f"{r:4d} {r // 8:4d} A100  0.004  18.5" for r in range(16)] + \
        [f"{r:4d} {r // 8:4d} V100  0.003  18.6" for r in range(16, 18)]
    assert _same_ranks_once(rows) == [rows[0], rows[1], "   ... ranks 0-15 (nodes 0-1) alike", rows[17], rows[18]]


# ---- the emitted program ----------------------------------------------------------------------

def test_emitted_gpt_defines_the_layer_once_and_calls_it_in_a_loop():
    program = gpt_program(3)
    source = render(program, "gpt.py", model_kwargs={})
    tree = ast.parse(source)
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions.count("block_0") == 1 and "block_1" not in functions
    assert "for params, nodes in zip(BLOCK_0_PARAMS, BLOCK_0_NODES):" in source
    # Three layers cost no more lines than two: the program grows with distinct blocks, not depth.
    two = render(gpt_program(2), "gpt.py", model_kwargs={})
    assert len(source.splitlines()) <= len(two.splitlines()) + 4
    unrolled = _unrolled(lambda: render(program, "gpt.py", model_kwargs={}))
    assert len(unrolled.splitlines()) > len(source.splitlines()) + 40


def _unrolled(make):
    saved = emitter.find_blocks
    emitter.find_blocks = lambda program: []
    try:
        return make()
    finally:
        emitter.find_blocks = saved


def _losses(path: Path, steps: int, capsys) -> list[str]:
    import os

    spec = importlib.util.spec_from_file_location(f"emitted_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    try:
        assert module.main(["--steps", str(steps), "--verify"]) == 0
    finally:
        for k, x in env.items():
            os.environ.pop(k, None) if x is None else os.environ.__setitem__(k, x)
    out = capsys.readouterr().out
    assert "verify: ok" in out, out
    return re.findall(r"loss (\S+)", out)


@pytest.mark.parametrize("calls", ["looped", "one line each"])
def test_block_program_trains_exactly_as_the_unrolled_one_with_per_layer_dropout(calls, tmp_path, capsys,
                                                                                 monkeypatch):
    """One rank (so it runs in-process): dropout masks come from torch's generator seeded per
    node and step, so a block that reused one layer's node name everywhere would drop the same
    units in every layer and its losses would part from the unrolled program's. "one line each":
    the middle layer is left inline, so the block's two calls are not a chain (no loop)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))
    traced, kwargs = traced_gpt(3)
    one = load_cluster({"nodes": [{"devices": [{"type": "cpu", "count": 1}]}]})
    program = baseline_program("dp-even", traced.graph, one)
    blocks = find_blocks(program)
    assert blocks and len(blocks[0].calls) == 3
    if calls == "one line each":
        blocks = [dataclasses.replace(blocks[0], calls=blocks[0].calls[::2])]
        monkeypatch.setattr(emitter, "find_blocks", lambda program: blocks)
    blocked = Path(emit(program, str(GPT), str(tmp_path / "blocked"), model_kwargs=kwargs))
    looped = "for params, nodes in zip(BLOCK_0_PARAMS, BLOCK_0_NODES):" in blocked.read_text()
    assert looped == (calls == "looped")
    assert "def block_0(" in blocked.read_text()
    if "gpt3" not in _UNROLLED_LOSSES:       # the reference run, once per process
        unrolled = Path(_unrolled(lambda: emit(program, str(GPT), str(tmp_path / "unrolled"), model_kwargs=kwargs)))
        assert "def block_0(" not in unrolled.read_text()
        _UNROLLED_LOSSES["gpt3"] = _losses(unrolled, 2, capsys)
    assert _losses(blocked, 2, capsys) == _UNROLLED_LOSSES["gpt3"]


_UNROLLED_LOSSES: dict[str, list[str]] = {}


@pytest.mark.slow
def test_tensor_parallel_gpt_by_block_verifies_on_three_gloo_ranks_and_trains_as_unrolled(tmp_path):
    """Collectives inside the block function, uneven pieces, dropout: ``--verify`` on 3 ranks,
    and the same losses step by step as the unrolled program of the same plan."""
    from tests.runs import torchrun, verify_line

    cluster = load_cluster({"nodes": [{"devices": [
        {"name": f"cpu{i}", "tflops": t, "memory_GB": 8, "hbm_GBps": 20, "count": 1}
        for i, t in enumerate((0.3, 0.2, 0.1))], "intra_link": "loopback"}]})
    traced, kwargs = traced_gpt(3)
    program = baseline_program("megatron-tp", traced.graph, cluster)
    program.shares = (0.5, 0.3, 0.2)      # uneven pieces (Megatron's own shares are even)
    program.invalidate()
    blocks = find_blocks(program)
    assert blocks and len(blocks[0].calls) >= 2
    blocked = Path(emit(program, str(GPT), str(tmp_path / "blocked"), model_kwargs=kwargs, cluster=cluster))
    unrolled = Path(_unrolled(lambda: emit(program, str(GPT), str(tmp_path / "unrolled"), model_kwargs=kwargs,
                                           cluster=cluster)))
    text = blocked.read_text()
    body = text.split("def block_0(")[1].split("def forward(")[0]
    assert any(f"rt.{c}(" in body for c in ("all_reduce", "reduce_scatter", "all_gather"))
    runs = {}
    for name, path in (("blocked", blocked), ("unrolled", unrolled)):
        proc = torchrun(path, 3, "--verify", "--steps", "2")
        assert verify_line(proc).startswith("verify: ok") and proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = re.findall(r"^step \d+ loss (\S+)", proc.stdout, re.M)
    assert len(runs["blocked"]) == 2 and runs["blocked"] == runs["unrolled"]
