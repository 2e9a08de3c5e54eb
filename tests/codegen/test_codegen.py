"""The code generator: emitted programs are standalone, readable SPMD source, and one of them
trains on 4 real gloo ranks and matches one device (``--verify``).

Breadth (every model, every plan family, N = 2..4, every collective variant) lives in
tests/e2e/test_torchrun.py, marked slow; here each example model is emitted and inspected, and a
single synthesized GPT plan runs for real.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hapc
from costmodel.cluster import load_cluster
from hapc.codegen import emit, render
from hapc.ir.layout import Partial, Replicate, Shard
from hapc.ir.program import Redistribute
from synth.builder import ProgramBuilder, propagate

from tests.runs import MODELS, REPO, SMALL_MIXED, emit_model, plan_for, torchrun, traced_small, verify_line  # noqa: F401


# ---- static checks of emitted source ---------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_emitted_program_is_standalone_and_readable(name, tmp_path):
    cluster = load_cluster(SMALL_MIXED)
    program = plan_for(name, "dp-flops", cluster)
    path = emit_model(name, program, tmp_path, cluster)
    source = path.read_text()
    compile(source, str(path), "exec")
    tree = ast.parse(source)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "hapc" not in imported and "synth" not in imported and "costmodel" not in imported
    assert imported <= {"__future__", "argparse", "contextlib", "datetime", "hashlib", "importlib", "inspect", "io", "math", "os",
                        "shutil", "statistics", "sys", "threading", "time", "zlib", "pathlib", "collections", "typing", "torch"}
    # The siblings it loads by path are there, and need no hapc either.
    for sibling in ("hapc_local_ops.py", "hapc_random_ops.py", "hapc_collectives.py", f"{name}.py"):
        text = (tmp_path / sibling).read_text()
        assert "import hapc" not in text and "from hapc" not in text, sibling
    # One forward (and a function per repeated block it calls), a line per step, the user's
    # source lines quoted, the rank as data.
    forwards = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "forward"]
    assert len(forwards) == 1
    blocks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("block_")]
    body = "\n".join(ast.get_source_segment(source, f) for f in blocks + forwards)
    assert f"# {name}.py:" in body
    graph = program.graph
    for node in graph.nodes:
        assert f"{node.op}(" in body or f"# {node.op} ->" in body, node.op
    assert "SHARDS: dict" in source and "rank ==" not in body
    assert f"WORLD = {program.world}" in source
    # Sanitised names are identifiers; values sharded by the plan are in the table.
    assert "@" not in "".join(ln.split("#")[0].split("'")[0] for ln in body.splitlines())
    assert "'x': (0," in source or name != "mlp"


def test_every_layout_change_is_emitted_with_its_collective(tmp_path):
    """A hand-built MLP program that uses each redistribution once."""
    traced, _, small = traced_small("mlp")
    graph = traced.graph
    prog = propagate(graph, (0.5, 0.3, 0.2), {"x": Shard(0)})      # data parallel, then extra moves
    b = ProgramBuilder(graph, prog.shares, {"x": Shard(0)})
    b.ensure("x", Replicate())                          # S -> R
    b.ensure("x", Partial(), source=Shard(0))           # S -> P
    b.ensure("p_linears_0_weight", Shard(1))            # R -> S
    b.ensure("p_linears_0_weight", Partial(), source=Replicate())   # R -> P
    prog.steps = b.build().steps + prog.steps
    prog.steps += [Redistribute("x@P", "x@P@R", Partial(), Replicate(), "hierarchical"),
                   Redistribute("x@P", "x@P@S(1)", Partial(), Shard(1), "grouped"),
                   Redistribute("p_linears_0_weight@S(1)", "p_linears_0_weight@S(0)", Shard(1), Shard(0))]
    prog.invalidate()
    source = render(prog, "mlp.py", model_kwargs=small)
    compile(source, "program.py", "exec")
    for call, comment in [("rt.all_gather(x, 'x', 'auto')", "x: S(0) -> R, all-gather (padded)"),
                          ("rt.pad_partial(x, 'x')", "zero padding"),
                          ("rt.slice(p_linears_0_weight, 'p_linears_0_weight@S(1)')", "a local slice"),
                          ("rt.keep_on_rank0(p_linears_0_weight)", "rank 0 keeps it"),
                          ("rt.all_reduce(x_P, 'hierarchical')", "all-reduce (hierarchical)"),
                          ("rt.reduce_scatter(x_P, 'x@P@S(1)', 'grouped')", "reduce-scatter (grouped)"),
                          ("rt.all_to_all(p_linears_0_weight_S_1, 'p_linears_0_weight@S(1)', 'p_linears_0_weight@S(0)'",
                           "all-to-all")]:
        assert call in source and comment in source, call
    assert "HIERARCHICAL = True" in source
    # Uneven pieces of every sharded value are tables indexed by rank.
    assert "'x': (0, (3, 1, 1))" in source or "'x': (0, (2, 2, 1))" in source


def test_emit_is_deterministic_and_checks_its_options(tmp_path):
    cluster = load_cluster(SMALL_MIXED)
    program = plan_for("gpt", "dp-flops", cluster)
    a = emit_model("gpt", program, tmp_path / "a", cluster)
    b = emit_model("gpt", program, tmp_path / "b", cluster)
    assert a.read_text() == b.read_text()
    _, path, small = traced_small("gpt")
    with pytest.raises(ValueError, match="optimizer"):
        emit(program, str(path), str(tmp_path / "c"), optimizer="lamb")
    # The plan summary and the usage example land in the docstring.
    text = render(program, "gpt.py", model_kwargs=small, plan_summary="dp-flops, 1.23 ms/iter")
    doc = ast.get_docstring(ast.parse(text))
    assert "dp-flops, 1.23 ms/iter" in doc and "torchrun --nproc_per_node=4" in doc
    assert "params, step = program.build(" in doc


def test_program_refuses_a_wrong_world_size(tmp_path, monkeypatch, capsys):
    """Run outside torchrun (or with another N), the program says how to run it, in one line."""
    import importlib.util

    cluster = load_cluster(SMALL_MIXED)
    path = emit_model("mlp", plan_for("mlp", "dp-flops", cluster), tmp_path)
    spec = importlib.util.spec_from_file_location("emitted_mlp_program", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert module.main([]) == 2
    err = capsys.readouterr().err
    assert "torchrun --nproc_per_node=4" in err and "WORLD_SIZE is 2" in err and len(err.splitlines()) == 1


# ---- one real run ------------------------------------------------------------------------------

def test_synthesized_gpt_with_dropout_trains_on_four_gloo_ranks_and_verifies(tmp_path):
    """Dropout on: --verify gives the one-device reference the masks the program drew."""
    from conftest import load_model_file
    from synth.synthesize import synthesize_program

    path = REPO / "configs" / "models" / "gpt.py"
    module = load_model_file(path)
    kwargs = {**module.SMALL, "dropout": 0.2}
    traced = hapc.trace(module.model(**kwargs), tuple(module.inputs(**kwargs)))
    assert sum(n.op == "aten.dropout.default" for n in traced.graph.nodes) >= 3
    cluster = load_cluster(SMALL_MIXED)
    program = synthesize_program(traced.graph, cluster, baselines=("dp-flops",)).best.program
    path = Path(emit(program, str(path), str(tmp_path), model_kwargs=kwargs, cluster=cluster,
                     constants=traced.constants))
    proc = torchrun(path, 4, "--verify", "--steps", "2")
    line = verify_line(proc)
    assert line.startswith("verify: ok"), line + proc.stderr[-3000:]
    assert proc.returncode == 0
    steps = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("step ")]
    assert [s[1] for s in steps] == ["1", "2"]
    losses = [float(s[3]) for s in steps]
    assert losses[1] < losses[0]            # AdamW stepped the shards
    assert float(line.split("max_abs_err=")[1]) < 1e-4
