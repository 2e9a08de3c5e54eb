"""What follows planning, made fast for issue 15 (``hapc replan`` in a second) without changing
a byte of what it writes: the skeleton's docstring found without parsing, the runtime's facts
read from the statements asked about, plan.json's graph lines kept from a load, the cyclic
collector paused (hapc.process.collector), ``MODEL_KWARGS`` in one order.
"""

from __future__ import annotations

import ast
import gc
import json
import textwrap
from pathlib import Path

import pytest

from hapc.codegen import emitter, runtime_facts
from hapc.errors import UserError
from hapc.ir.graph import Graph, Node, Ref, TensorMeta, Value
from hapc.ir.layout import Replicate
from hapc.ir.program import Compute, DistProgram, Strategy
from hapc.plan.plan import Plan, _GraphSection

REPO = Path(__file__).resolve().parents[2]
CPU4 = REPO / "configs" / "clusters" / "cpu4.yaml"


def test_the_skeleton_docstring_ends_where_python_says():
    skeleton = emitter.SKELETON.read_text()
    doc_end = ast.parse(skeleton).body[0].end_lineno
    head, rest = skeleton.split(emitter.BEGIN, 1)
    second_half = emitter.SKELETON_MAIN.read_text().split(emitter.CONTINUED, 1)[1]
    assert emitter.skeleton_parts() == ("\n".join(head.splitlines()[doc_end:]),
                                        rest.split(emitter.END, 1)[1] + second_half)


@pytest.mark.parametrize("module", ["L", "R"])
def test_runtime_facts_from_cut_statements_equal_the_whole_file_parse(module):
    path = runtime_facts.LOCAL_OP_MODULES[module]
    whole_ops = {fn.name: runtime_facts._is_generator(fn)
                 for fn in ast.parse(path.read_text()).body if isinstance(fn, ast.FunctionDef)
                 and any(isinstance(d, ast.Name) and d.id == "local_op" for d in fn.decorator_list)}
    assert whole_ops and whole_ops == runtime_facts._local_ops(path)
    for name, generator in whole_ops.items():
        assert runtime_facts._definition(runtime_facts._local_op_chunks(path), name) is not None, name  # no fallback
        assert runtime_facts._local_op(name, path) is generator
        assert runtime_facts.local_op_module(name) == module
    with pytest.raises(KeyError):                # (a module-level helper, not a local op, is not one)
        runtime_facts._local_op("_local_shape" if module == "L" else "_mix32", path)
    with pytest.raises(KeyError):
        runtime_facts.local_op_module("no_such_local_op")


def test_collective_names_from_cut_assignments_equal_the_whole_file_parse():
    text = runtime_facts.COLLECTIVES.read_text()
    cut = runtime_facts._constants_of(runtime_facts._assignments(text))     # no SyntaxError: no fallback
    assert cut == runtime_facts._constants_of(ast.parse(text).body)
    assert {"HIERARCHICAL", "PADDED", "_METHODS"} <= set(cut)


def test_cutting_statements_survives_lines_that_start_at_column_zero(tmp_path):
    """A comment at column 0 inside a function does not end it (its later ``yield`` counts); a
    bracket closed at column 0 stays with its statement; text cut inside a string does not
    parse, and the whole file is read instead."""
    source = textwrap.dedent('''\
        """Doc: x = 1 is prose here."""
        A, B = "a", "b"
        TABLE = {
            "k": A,
        }
        def local_op(fn):
            return fn
        @local_op
        def g(ctx):
        # a comment at column 0
            yield 1
        @local_op
        def h(
            ctx,
        ):
            s = """
        y = 2
        """
            return s
        C = [B,
        A]
    ''')
    chunks = tuple(runtime_facts._top_level_chunks(source))
    assert ast.parse(runtime_facts._definition(chunks, "g")).body[0].decorator_list
    assert runtime_facts._is_generator(ast.parse(runtime_facts._definition(chunks, "g")).body[0])
    with pytest.raises(SyntaxError):        # cut inside h's string: the caller falls back
        ast.parse(runtime_facts._definition(chunks, "h"))
    path = tmp_path / "m.py"
    path.write_text(source)
    assert runtime_facts._module_constants(path) == {"A": "a", "B": "b", "TABLE": {"k": "a"}, "C": ["b", "a"]}


def _tiny_plan() -> Plan:
    from costmodel.cluster import load_cluster

    x = Value("x", TensorMeta((4, 8), "float32"), "input")
    w = Value("w", TensorMeta((8, 8), "float32"), "param", "w", True)
    y = Value("y", TensorMeta((4, 8), "float32"), "activation")
    loss = Value("loss", TensorMeta((), "float32"), "activation")
    graph = Graph({"x": x, "w": w, "y": y, "loss": loss},
                  [Node("y", "aten.mm.default", (Ref("x"), Ref("w")), {}, ("y",)),
                   Node("loss", "aten.sum.default", (Ref("y"),), {}, ("loss",))], ["x"], ["w"], [], "loss")
    cluster = load_cluster(CPU4)
    program = DistProgram(graph, (0.25,) * 4, {"x": Replicate(), "w": Replicate()})
    rep = Replicate()
    program.steps += [Compute("y", Strategy((rep, rep), (rep,)), ("x", "w")),
                      Compute("loss", Strategy((rep,), (rep,)), ("y",))]
    from costmodel.simulator import simulate

    return Plan(program, cluster, simulate(program, cluster), model={"kwargs": {"b": 1, "a": 2}})


def test_a_loaded_graph_is_written_back_from_its_lines_only_while_it_is_unchanged(tmp_path):
    first = tmp_path / "plan.json"
    _tiny_plan().save(first)
    text = first.read_text()
    plan = Plan.load(first)
    section = _GraphSection.of(plan.graph)
    assert section is not None and section.text in text
    plan.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == text
    # The same data laid out otherwise: read whole, written canonically.
    (tmp_path / "indented.json").write_text(json.dumps(json.loads(text), indent=2))
    other = Plan.load(tmp_path / "indented.json")
    assert _GraphSection.of(other.graph) is None
    other.save(tmp_path / "from-indented.json")
    assert (tmp_path / "from-indented.json").read_text() == text
    # A graph that changed after loading (one more value) is encoded anew.
    plan.graph.values["z"] = Value("z", TensorMeta((1,), "float32"), "activation")
    assert _GraphSection.of(plan.graph) is None
    assert plan.to_dict()["graph"]["values"][-1][0] == "z"


def test_saving_and_loading_run_without_the_cyclic_collector(tmp_path, monkeypatch):
    import hapc.plan.plan as plan_module

    seen = []
    real_json, real_split = plan_module.plan_json, plan_module._split_graph
    monkeypatch.setattr(plan_module, "plan_json", lambda *a: seen.append(gc.isenabled()) or real_json(*a))
    monkeypatch.setattr(plan_module, "_split_graph", lambda *a: seen.append(gc.isenabled()) or real_split(*a))
    assert gc.isenabled()
    _tiny_plan().save(tmp_path / "plan.json")
    Plan.load(tmp_path / "plan.json")
    assert seen == [False, False] and gc.isenabled()
    with pytest.raises(UserError):
        Plan.load(tmp_path / "no-such.json")
    assert gc.isenabled()                           # back on after an error too


def test_model_kwargs_are_written_sorted_whatever_order_they_came_in():
    assert emitter.model_kwargs_line({"layers": 2, "batch": 4}) == \
        "MODEL_KWARGS: dict[str, Any] = {'batch': 4, 'layers': 2}"
    assert emitter.model_kwargs_line(None) == "MODEL_KWARGS: dict[str, Any] = {}"


def test_runs_of_a_period_are_the_maximal_stretches_a_plain_scan_finds():
    import random

    from hapc.ir.repeats import Repeat, _runs

    def scanned(ids: list[int], period: int) -> list[Repeat]:
        out, start = [], None
        for i in range(len(ids) - period + 1):
            same = i + period < len(ids) and ids[i] == ids[i + period]
            if same and start is None:
                start = i
            elif not same and start is not None:
                out.append(Repeat(start, i + period, period))
                start = None
        return out

    rng = random.Random(0)
    for _ in range(500):
        ids = [rng.randint(0, 2) for _ in range(rng.randint(0, 30))]
        for period in range(1, len(ids) + 2):
            assert _runs(ids, period) == scanned(ids, period), (ids, period)


def test_a_replanned_plan_writes_the_old_plans_graph_lines_again(tmp_path):
    """The saving above holds because a replan keeps the old plan's Graph object; if it ever
    copies the graph, plan.json stays right but the replan's save pays the full encoding."""
    from costmodel.cluster_edit import surviving_ranks, without_devices
    from hapc.elastic.replan import replan

    _tiny_plan().save(tmp_path / "old.json")
    old = Plan.load(tmp_path / "old.json")
    done = replan(old, without_devices(old.cluster, [3]), survivors=surviving_ranks(4, [3]), effort="quick")
    assert done.plan.graph is old.graph and _GraphSection.of(done.plan.graph) is not None
    done.plan.save(tmp_path / "new.json")
    fresh = json.loads((tmp_path / "new.json").read_text())
    assert fresh["graph"] == json.loads((tmp_path / "old.json").read_text())["graph"]
    assert fresh["graph_hash"] == old.graph.hash()
