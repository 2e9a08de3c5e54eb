"""Canonical node order and names (hapc.frontend.canonical): a graph that does not depend on the
order Python ran independent code in, so that a model iterating a ``set`` (Gemma3, ModernBERT)
compiles to the same plan.json and program.py under every ``PYTHONHASHSEED``, and a pipelined
compile's micro-batch trace matches the cached whole-batch trace from another process."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hapc.codegen.micro_graph import _check_same_structure
from hapc.errors import UserError
from hapc.frontend.canonical import canonicalize
from hapc.ir.graph import Graph, Node, Ref, SourceLoc, TensorMeta, Value

ROOT = Path(__file__).resolve().parents[2]
SET_MASKS = ROOT / "tests" / "frontend" / "models" / "set_masks.py"
CLUSTER = ROOT / "configs" / "clusters" / "cpu-3nodes-1-2-3.yaml"
META = TensorMeta((4, 4), "float32")


def _graph(order: list[str], names: dict[str, str], buffer_write: bool = False) -> Graph:
    """Two independent mask chains (``full``: one op; ``sliding``: two) read by a sum, traced
    in ``order`` and named by ``names`` (as a set-iterating forward gives, by hash seed)."""
    def src(line: int) -> SourceLoc:
        return SourceLoc("model.py", line, callers=(("model.py", 40),))

    n = names
    chains = {
        "full": [Node(n["f"], "aten.tril.default", (Ref("x"),), {}, (n["f"],), source=src(10))],
        "sliding": [Node(n["s"], "aten.tril.default", (Ref("x"),), {}, (n["s"],), source=src(10)),
                    Node(n["s2"], "aten.triu.default", (Ref(n["s"]), -2), {}, (n["s2"],), source=src(12))],
    }
    nodes = [node for kind in order for node in chains[kind]]
    nodes.append(Node("add", "aten.add.Tensor", (Ref(n["f"]), Ref(n["s2"])), {}, ("add",), source=SourceLoc("model.py", 41)))
    nodes.append(Node("sum_1", "aten.sum.default", (Ref("add"),), {}, ("sum_1",), source=SourceLoc("model.py", 42)))
    values = {"x": Value("x", META, "input"), "b": Value("b", META, "buffer")}
    for node in nodes:
        values[node.outputs[0]] = Value(node.outputs[0], TensorMeta(() if node.op == "aten.sum.default" else (4, 4),
                                                                     "float32"), "activation")
    if buffer_write:        # reads the buffer's old value, then (independently) writes it back
        nodes.insert(0, Node("mul", "aten.mul.Tensor", (Ref("b"), 2.0), {}, ("mul",), source=SourceLoc("model.py", 50)))
        nodes.insert(1, Node("add_", "aten.add.Tensor", (Ref("b"), 1.0), {}, ("add_",), source=SourceLoc("model.py", 5),
                             mutates="b"))
        values["mul"] = Value("mul", META, "activation")
        values["add_"] = Value("add_", META, "activation")
    return Graph(values, nodes, ["x"], [], ["b"] if buffer_write else [], "sum_1")


def test_trace_order_and_trace_names_do_not_change_the_graph():
    a = _graph(["full", "sliding"], {"f": "tril", "s": "tril_1", "s2": "triu"})
    b = _graph(["sliding", "full"], {"f": "tril_1", "s": "tril", "s2": "triu"})
    assert a.to_json() != b.to_json()
    assert canonicalize(a).to_json() == canonicalize(b).to_json()
    assert canonicalize(a).hash() == canonicalize(b).hash()


def test_a_graph_in_program_order_is_left_as_it_is():
    """Lines in program order, names numbered as torch.export numbers them: nothing moves,
    nothing is renamed (so plans of ordinary models keep their graph hash)."""
    g = _graph(["full", "sliding"], {"f": "tril", "s": "tril_1", "s2": "triu"})
    assert canonicalize(g).to_json() == g.to_json()


def test_sources_and_inputs_keep_their_names_and_source_lines_stay():
    g = canonicalize(_graph(["sliding", "full"], {"f": "tril_1", "s": "tril", "s2": "triu"}))
    assert list(g.values)[:2] == ["x", "b"]
    assert g.inputs == ["x"]
    assert all(n.source is not None for n in g.nodes)
    assert g.node("triu").source.line == 12


def test_a_buffer_written_back_comes_after_the_readers_of_its_old_value():
    """``add_`` (written back into ``b``) is independent of ``mul`` by data flow and earlier in
    program order, but ``mul`` reads the old ``b``: it must stay first."""
    g = canonicalize(_graph(["full", "sliding"], {"f": "tril", "s": "tril_1", "s2": "triu"}, buffer_write=True))
    order = [n.op for n in g.nodes]
    reader = next(i for i, n in enumerate(g.nodes) if n.op == "aten.mul.Tensor")
    writer = next(i for i, n in enumerate(g.nodes) if n.mutates == "b")
    assert reader < writer, order


def test_a_structure_mismatch_names_what_differs():
    """Two nodes with one name and op that read different values: the message says which input
    differs and what each side reads, never the same words twice."""
    a = _graph(["full", "sliding"], {"f": "tril", "s": "tril_1", "s2": "triu"})
    b = _graph(["full", "sliding"], {"f": "tril", "s": "tril_1", "s2": "triu"})
    b.nodes[3] = Node("add", "aten.add.Tensor", (Ref("tril_1"), Ref("triu")), {}, ("add",), source=b.nodes[3].source)
    with pytest.raises(UserError) as err:
        _check_same_structure(a, b, 4, 2)
    msg = str(err.value)
    assert "add (aten.add.Tensor) at model.py:41 reads tril_1 (aten.tril.default, float32[4, 4]) as its input 0 " \
           "instead of tril (aten.tril.default, float32[4, 4])" in msg, msg


# ---- the whole path, in processes with other hash seeds ------------------------------------------

def _set_order(seed: int) -> tuple[str, ...]:
    out = subprocess.run([sys.executable, "-c", "print(*set(['full', 'sliding']))"], capture_output=True,
                         text=True, env={**os.environ, "PYTHONHASHSEED": str(seed)}, check=True).stdout
    return tuple(out.split())


def _seeds_of_both_orders() -> tuple[int, int]:
    """Two hash seeds under which the model's ``set`` iterates in different orders."""
    first = _set_order(0)
    other = next(s for s in range(1, 50) if _set_order(s) != first)
    return 0, other


def _compile(seed: int, out: Path, cache: Path, *extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "HAPC_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "hapc.cli", "compile", str(SET_MASKS), "--cluster", str(CLUSTER),
                          "-o", str(out), "-q", *extra], capture_output=True, text=True, env=env, cwd=ROOT)
    assert run.returncode == 0, f"PYTHONHASHSEED={seed}: {run.stderr.strip()[-2000:]}"
    return {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in ("plan.json", "program.py")}


def test_a_pipelined_compile_agrees_with_a_trace_cached_under_another_hash_seed(tmp_path):
    """The cache is filled under one set order; the micro-batch trace runs under the other.
    Before canonical order this failed with "node 55 is to_3 (aten.to.device) instead of to_3
    (aten.to.device)"; now both compiles write the same plan and program."""
    a, b = _seeds_of_both_orders()
    cache = tmp_path / "cache"
    pipelined = ("--stages", "2", "--microbatches", "2")
    first = _compile(a, tmp_path / "a", cache, *pipelined)
    second = _compile(b, tmp_path / "b", cache, *pipelined)
    assert first == second


@pytest.mark.slow
@pytest.mark.parametrize("shared_cache", [False, True], ids=["fresh-cache", "shared-cache"])
def test_every_hash_seed_writes_the_same_plan_and_program(tmp_path, shared_cache):
    """PYTHONHASHSEED 0 to 9, one stage and two pipelined stages, each in a fresh process, with
    a fresh trace cache each time or one cache shared by all: one plan.json, one program.py."""
    for extra, label in (((), "one-stage"), (("--stages", "2", "--microbatches", "2"), "pipelined")):
        written = {}
        for seed in range(10):
            cache = tmp_path / ("cache" if shared_cache else f"cache-{label}-{seed}")
            written[seed] = _compile(seed, tmp_path / f"{label}-{seed}", cache, *extra)
        assert len({tuple(sorted(w.items())) for w in written.values()}) == 1, (label, written)


def test_where_the_model_file_lies_does_not_change_the_graph(tmp_path):
    """The MoE example's top-2 routing makes nodes whose program position ties; their order must
    not follow the checkout's path (a CI clone elsewhere got another graph hash than the golden
    plan's). Its graph is traced from the repository and from copies in other folders."""
    from bench.golden import small_config
    from hapc.frontend.modelfile import load_model_file
    from hapc.frontend.tracer import trace

    paths = [ROOT / "configs" / "models" / "moe.py"]
    for folder in ("elsewhere/deep/er", "a/deeper/checkout", "b", "ci/clone/configs/models"):
        paths.append(tmp_path / folder / "moe.py")
        paths[-1].parent.mkdir(parents=True)
        paths[-1].write_text(paths[0].read_text())
    hashes = set()
    for path in paths:
        mf = load_model_file(str(path), small_config("moe"))
        hashes.add(trace(mf.build_model(device="meta"), tuple(x.to("meta") for x in mf.build_inputs())).graph.hash())
    assert len(hashes) == 1


def test_every_layer_puts_its_chains_in_one_order():
    """Hugging Face Llama with grouped-query attention: its q and k rotary ops are all attributed
    to one wrapper's line (the kernels hub), so only their content tells them apart. Ordered by
    the whole upstream digest (every layer before included), each layer interleaved them its
    own way and the layers did not match as calls of one block (2 of 6 did); by what they
    compute a few producers deep, all six match."""
    import torch

    from conftest import load_model_file
    from costmodel.cluster import load_cluster
    from hapc import trace
    from hapc.ir.blocks import find_blocks
    from synth.baselines import baseline_program

    module = load_model_file(ROOT / "configs" / "models" / "hf_llama.py")
    kwargs = dict(layers=6, hidden=64, heads=8, kv_heads=2, mlp=128, seq=16, batch=4, vocab=101)
    torch.manual_seed(0)
    traced = trace(module.model(**kwargs), tuple(module.inputs(**kwargs)))
    program = baseline_program("dp-even", traced.graph, load_cluster(ROOT / "configs" / "clusters" / "cpu4.yaml"))
    assert [len(b.calls) for b in find_blocks(program)] == [6]


@pytest.mark.parametrize("family", ["phi3", "mamba"])
def test_the_order_does_not_depend_on_the_batch_size(family):
    """A pipelined compile traces the model again at a micro-batch and checks the graph node
    for node. Phi-3 makes two like chains at one line (lifted constants) and Mamba two like
    splits; their tie was broken by a digest of sizes, which change with the batch, so the two
    traces came out in other orders and pipelining was refused."""
    pytest.importorskip("transformers")
    import torch

    import hapc
    from bench import zoo

    torch.manual_seed(0)
    model = zoo.model(family)
    whole, micro = (hapc.trace(model, zoo.inputs(family, batch)).graph for batch in (6, 3))
    assert [(n.name, n.op, n.input_refs()) for n in whole.nodes] == \
        [(n.name, n.op, n.input_refs()) for n in micro.nodes]
