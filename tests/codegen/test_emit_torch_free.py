"""Writing a plan's files needs no torch (issue 15: ``hapc replan`` in a second, when importing
torch alone takes seconds; issue 13: a compile from a cached trace).

What the emitter needs from torch is recorded in the graph at trace time (hapc.frontend.torchfacts) and
travels in plan.json; what it needs from the runtime is read from the runtime's source
(hapc.codegen.runtime_facts). Here: those facts agree with torch and the runtime, a plan.json
is emitted in a fresh process that never imports torch, and its program is byte for byte the
one written when torch answers the same questions itself. Also plan.json's fast writer (same
data, one record per line) and Plan.load leaving the simulation until it is read.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hapc
from costmodel.cluster import load_cluster
from hapc.codegen import runtime_facts
from hapc.ir.graph import Graph, Node, Ref, TensorMeta, Value
from hapc.ir.graph import TorchFacts
from hapc.plan.plan import Plan
from hapc.frontend.torchfacts import record

REPO = Path(__file__).resolve().parents[2]
SMALL_MIXED = REPO / "configs" / "clusters" / "small-mixed.yaml"
TWO_NODES = REPO / "configs" / "clusters" / "cpu-2nodes-2x2.yaml"

# Ops whose program lines need torch's answers: a Tensor[] result (split), two results of
# which one is used (max.dim), dtype constants (.to(torch.float64), .float()).
TINY_MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(8, 4)

    def forward(self, x, y):
        u, w = self.a(x).split(8, dim=-1)
        top, _ = torch.max(u * w, dim=-1, keepdim=True)
        z = self.b(u - top).to(torch.float64).softmax(-1)
        return nn.functional.cross_entropy(z.float(), y)


def model():
    return Net()


def inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)
'''


def test_runtime_facts_read_from_source_agree_with_the_imported_runtime():
    from hapc.runtime import collectives, local_ops, random_ops

    for name in list(collectives._METHODS) + ["no-such-variant"]:
        assert runtime_facts.method_of(name) == collectives.method_of(name), name
    assert runtime_facts.hierarchical() == collectives.HIERARCHICAL
    assert not set(local_ops.LOCAL_OPS) & set(random_ops.LOCAL_OPS)     # one name, one module
    generators = {name: inspect.isgeneratorfunction(fn)
                  for name, fn in (*local_ops.LOCAL_OPS.items(), *random_ops.LOCAL_OPS.items())}
    assert {n: runtime_facts.is_generator_local_op(n) for n in generators} == generators
    assert {n: runtime_facts.local_op_module(n) for n in generators} == {
        n: "L" if n in local_ops.LOCAL_OPS else "R" for n in generators}
    assert any(generators.values()) and not all(generators.values())
    with pytest.raises(KeyError):
        runtime_facts.is_generator_local_op("no_such_local_op")


def _graph(args: tuple, op: str = "aten.split.Tensor") -> Graph:
    x = Value("x", TensorMeta((4, 6), "float32"), "input")
    return Graph({"x": x, "y": Value("y", TensorMeta((4, 3), "float32"), "activation")},
                 [Node("n", op, (Ref("x"),) + args, {"layout": "torch.strided"}, ("y",))], ["x"], [], [], "y")


def test_recorded_facts_are_torchs_answers_and_travel_with_the_graph():
    graph = _graph((3, -1, "float32", ["tanh", "cpu", "torch.contiguous_format", "torch.no_such_thing"]))
    graph.nodes.append(Node("m", "aten.native_layer_norm.default", (), {}, ()))
    graph.nodes.append(Node("k", "nolib.no_such_op.default", (), {}, ()))
    facts = record(graph)
    assert facts.op_results == {"aten.split.Tensor": None, "aten.native_layer_norm.default": 3,
                                "nolib.no_such_op.default": None}      # None: a list, or unknown
    assert facts.torch_names == {"float32": "torch.float32", "torch.strided": "torch.strided",
                                 "torch.contiguous_format": "torch.contiguous_format", "tanh": None, "cpu": None,
                                 "torch.no_such_thing": None}
    before = graph.hash()
    graph.torch_facts = facts
    assert graph.hash() == before                       # facts describe torch, not the model
    again = Graph.from_dict(json.loads(json.dumps(graph.to_dict())))
    assert again.torch_facts == facts
    assert Graph.from_dict({k: v for k, v in graph.to_dict().items() if k != "torch_facts"}).torch_facts is None


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Three saved plans with model files: the tiny model above (data parallel), a SMALL GPT in
    two pipeline stages of two ranks (its micro-batch graph recorded by save), and a SMALL
    GPT under Megatron tensor parallelism (local ops that drive collectives, uneven collectives)."""
    from conftest import load_model_file

    root = tmp_path_factory.mktemp("plans")
    cluster = load_cluster(SMALL_MIXED)
    tiny = root / "tiny_model.py"
    tiny.write_text(textwrap.dedent(TINY_MODEL))
    gpt = REPO / "configs" / "models" / "gpt.py"
    made = {}
    for name, path, kwargs, strategy in [("tiny", tiny, {}, "dp-flops"), ("pipelined", gpt, {"batch": 4}, "stages"),
                                         ("gpt", gpt, None, "megatron-tp")]:
        module = load_model_file(path)
        kwargs = dict(module.SMALL) | (kwargs or {}) if path == gpt else kwargs
        traced = hapc.trace(module.model(**kwargs), tuple(module.inputs(**kwargs)))
        assert traced.graph.torch_facts is not None
        if strategy == "stages":
            plan = hapc.synthesize(traced, None, str(TWO_NODES), stages=2, microbatches=2, model_file=str(path),
                                   model_kwargs=kwargs)
            assert plan.pipeline is not None and plan.microbatch_record is None
        else:
            plan = hapc.baseline(traced, None, cluster, strategy, model_file=str(path), model_kwargs=kwargs)
        plan.save(root / f"{name}.json")
        made[name] = root / f"{name}.json"
    return made


def test_a_plan_emits_without_torch_the_program_torch_would_write(plans, tmp_path):
    """In a fresh interpreter: each plan emitted from plan.json, then a whole ``hapc replan``
    with its program (quick: no search, whose rules would need the replan cache)."""
    code = textwrap.dedent("""
        import sys
        from hapc.cli import main
        from hapc.plan.plan import Plan
        *pairs, replanned = sys.argv[1:]
        for plan_file, out in zip(pairs[::2], pairs[1::2]):
            Plan.load(plan_file).emit(out)
        rc = main(["replan", pairs[-2], "--drop", "1", "--quick", "-o", replanned, "-q"])
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "hapc.runtime")))
        print("replan:", rc, "loaded:", loaded)
    """)
    argv = [x for name, path in plans.items() for x in (str(path), str(tmp_path / f"{name}-no-torch"))]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code, *argv, str(tmp_path / "replanned")], capture_output=True,
                          text=True, cwd=REPO, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "replan: 0 loaded: []" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "replanned" / "program.py").exists()
    for name, path in plans.items():
        plan = Plan.load(path)
        # A plan without the record of torch's answers: torch answers, as before (what autograd
        # saves is kept: the memory figures in the program's docstring are priced from it).
        plan.graph.torch_facts = TorchFacts(saved=plan.graph.torch_facts.saved)
        plan.microbatch_record = None       # and a pipelined one traces its micro-batch again
        torch_answers = plan.emit(tmp_path / f"{name}-torch").read_text()
        written = (tmp_path / f"{name}-no-torch" / "program.py").read_text()
        assert written == torch_answers, name
    tiny = (tmp_path / "tiny-no-torch" / "program.py").read_text()
    assert "torch.float64" in tiny and ", *_ = aten.split.Tensor(" in tiny
    assert "rt.drive(L." in (tmp_path / "gpt-no-torch" / "program.py").read_text()
    assert "STAGE_FORWARDS = (stage_0, stage_1,)" in (tmp_path / "pipelined-no-torch" / "program.py").read_text()


def test_a_pipelined_plan_records_its_micro_batch_graph(plans, tmp_path):
    """save() records what the micro-batch trace changes (shapes with the batch, view sizes,
    how the micro-batches' losses add up: the GPT's cross-entropy is a mean over counted
    targets); a record for another micro-batch, or from before exact weighing (no loss node),
    is not used (traced again)."""
    plan = Plan.load(plans["pipelined"])
    record = plan.microbatch_record
    assert record is not None and record["rows"] == 2
    assert (record["loss_reduction"], record["loss_node"]) == ("count", "cross_entropy_loss")
    assert record["values"] and record["nodes"]
    first_input = plan.graph.inputs[0]
    assert plan.graph.meta(first_input).shape[0] == 4 and record["values"][first_input][0][0] == 2   # 4 -> 2 rows
    assert "microbatch_graph" in json.loads(plans["pipelined"].read_text())["pipeline"]
    from hapc.codegen.pipeline_emit import micro_batch_graph

    rebuilt = micro_batch_graph(plan).graph
    plan.microbatch_record = dict(record, rows=3)                        # another micro-batch's record
    traced = micro_batch_graph(plan)
    assert traced.record == record and traced.graph.values == rebuilt.values
    plan.microbatch_record = {k: v for k, v in record.items() if k != "loss_node"}    # an older record
    assert micro_batch_graph(plan).record == record
    assert [(n.args, n.kwargs) for n in traced.graph.nodes] == [(n.args, n.kwargs) for n in rebuilt.nodes]


def test_plan_json_is_one_record_per_line_and_loads_to_the_same_plan(plans, tmp_path):
    plan = Plan.load(plans["gpt"])
    assert plan.__dict__["_sim"] is None                # loading does not simulate...
    assert plan.recorded_seconds == plan.recorded["iteration_seconds"]
    assert plan.__dict__["_sim"] is None
    assert plan.cost == pytest.approx(plan.recorded_seconds, rel=1e-8)   # ...until the cost is read
    text = plans["gpt"].read_text()
    data = json.loads(text)
    lines = {line.strip().removesuffix(",") for line in text.splitlines()}
    for record_ in data["steps"] + data["graph"]["nodes"] + data["graph"]["values"]:
        assert json.dumps(record_, sort_keys=True) in lines
    plan.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == text             # byte-stable through a load
    # The old writer's data; a loaded plan holds its model file absolute (the file, relative to
    # plan.json when the two share a folder below the root: a checkout under /tmp does).
    from hapc.plan.paths import loaded_model_path

    data["model"] = {**data["model"], "file": loaded_model_path(data["model"]["file"], plans["gpt"])}
    assert json.loads(json.dumps(plan.to_dict(), sort_keys=True, indent=1)) == data
