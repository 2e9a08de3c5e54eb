"""Pipeline stages (issue 12): device groups, the stage cost model, the stage planner, plans
with stages on disk and in the summary, and the one-line errors for stage requests that do not
fit. Everything here is the cost model's view; nothing runs on ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costmodel.cluster import load_cluster
from costmodel.groups import group_key, link_between, sub_cluster
from costmodel.pipeline import ProgramPricer, StageCost, inflight_microbatches, schedule_cost
from costmodel.simulator import simulate
from hapc.errors import UserError
from hapc.codegen.launch import launch_lines

REPO = Path(__file__).resolve().parents[2]
TWO_NODES = REPO / "configs" / "clusters" / "cpu-2nodes-2x2.yaml"
HAP8 = REPO / "configs" / "clusters" / "hap-8gpu-v100x4-p100x4.yaml"
HAP64 = REPO / "configs" / "clusters" / "hap-paper-v100x16-p100x48.yaml"
GPT4 = {"layers": 4, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "batch": 8, "dropout": 0.0}


def _trace_gpt_on_meta(load_model, config: dict):
    import torch

    from hapc.frontend.tracer import trace

    mod = load_model("gpt")
    with torch.device("meta"):
        model = mod.model(**config)
    return trace(model, tuple(t.to("meta") for t in mod.inputs(**config)))


@pytest.fixture(scope="module")
def gpt4(load_model):
    return _trace_gpt_on_meta(load_model, GPT4)


@pytest.fixture(scope="module")
def two_node_plan(gpt4):
    """The best two-stage plan on two CPU nodes of two (auto prefers the first node alone:
    test_a_node_alone_is_a_candidate_and_auto_is_never_slower)."""
    from hapc.api import synthesize

    return synthesize(gpt4, None, str(TWO_NODES), stages=2)


# ---- device groups -----------------------------------------------------------------------------

def test_sub_cluster_renumbers_and_keeps_links():
    cl = load_cluster(str(HAP64))
    group = sub_cluster(cl, range(8, 24))                     # the second V100 node and the first P100 node
    assert group.world == 16 and [d.index for d in group.devices] == list(range(16))
    assert [d.node for d in group.devices] == [0] * 8 + [1] * 8
    assert group.network == cl.network and group.nodes[1].intra_link == cl.nodes[2].intra_link
    one_node = sub_cluster(cl, range(16, 24))
    assert one_node.network is None and len(one_node.nodes) == 1
    # identical nodes anywhere in the cluster price alike: one synthesis serves them all
    assert group_key(sub_cluster(cl, range(16, 24))) == group_key(sub_cluster(cl, range(40, 48)))
    assert group_key(sub_cluster(cl, range(0, 8))) != group_key(sub_cluster(cl, range(16, 24)))
    assert link_between(cl, range(0, 4), range(4, 8)) == cl.nodes[0].intra_link
    assert link_between(cl, range(0, 8), range(8, 16)) == cl.network


# ---- the schedule --------------------------------------------------------------------------------

def _stage(f, b, x=0.0, sync=0.0, tail=0.0, static=0.0, act=1.0):
    return StageCost(f, b, x, x, sync, tail, (static,), (act,))


@pytest.mark.parametrize("stages, m", [(2, 1), (2, 8), (4, 4), (3, 16)])
def test_uniform_pipeline_has_the_textbook_bubble(stages, m):
    cost = schedule_cost([_stage(1.0, 2.0)] * stages + [_stage(1.0, 2.0)][:0], m, "1f1b")
    assert cost.pipeline_seconds == pytest.approx((m + stages - 1) * 3.0)
    assert cost.bubble_fraction == pytest.approx((stages - 1) / (m + stages - 1))
    assert cost.inflight == tuple(min(m, stages - s) for s in range(stages))


def test_gpipe_holds_every_microbatch_and_1f1b_at_most_the_stage_count():
    stages = [_stage(1.0, 2.0, act=10.0)] * 3
    one_f = schedule_cost(stages, 8, "1f1b")
    gpipe = schedule_cost(stages, 8, "gpipe")
    assert [max(m) for m in one_f.stage_memory_bytes] == [30.0, 20.0, 10.0]
    assert [max(m) for m in gpipe.stage_memory_bytes] == [80.0] * 3
    assert inflight_microbatches("gpipe", 3, 8, 2) == 8
    assert gpipe.pipeline_seconds <= one_f.pipeline_seconds + 1e-12


def test_slow_link_is_a_pipeline_step_and_tails_end_the_iteration():
    fast_link = schedule_cost([_stage(1.0, 1.0, x=0.0), _stage(1.0, 1.0)], 4)
    slow_link = schedule_cost([_stage(1.0, 1.0, x=3.0), _stage(1.0, 1.0)], 4)
    assert slow_link.pipeline_seconds == pytest.approx(2 + 2 + 6 + 3 * 6)    # the link is the bottleneck
    # stage 0 finishes last (its backward drains last): its gradient sync + optimizer tail shows
    tail = schedule_cost([_stage(1.0, 1.0, sync=5.0, tail=1.0), _stage(1.0, 1.0)], 4, comm_overlap=1.0)
    assert tail.iteration_seconds == pytest.approx(fast_link.pipeline_seconds + (5.0 - 1.0) + 1.0)


# ---- pricing a group's program per node -----------------------------------------------------------

def test_profile_of_the_whole_graph_on_one_device_matches_the_simulator(gpt4):
    from synth.baselines import baseline_program

    cl = sub_cluster(load_cluster(str(TWO_NODES)), [0])
    program = baseline_program("dp-even", gpt4.graph, cl)
    sim = simulate(program, cl)
    pricer = ProgramPricer(program, cl)
    whole = pricer.profile(1)
    n = len(gpt4.graph.nodes)
    fwd, bwd = whole.range_seconds(0, n)
    assert fwd == pytest.approx(sim.forward_seconds, rel=1e-9)
    assert bwd == pytest.approx(sim.backward_seconds, rel=1e-9)
    # two micro-batches: each does half the batch's work (kernel launches stay whole)
    half = pricer.profile(2)
    f2, b2 = half.range_seconds(0, n)
    launches = cl.launch_latency_seconds * sum(1 for i in range(n) if pricer.fwd_launch[i, 0] > 0)
    assert f2 == pytest.approx((fwd - launches) / 2 + launches, rel=0.05)
    assert f2 < fwd and b2 < bwd
    # a range is priced by subtraction: the parts add up to the whole
    mid = n // 2
    assert whole.range_seconds(0, mid)[0] + whole.range_seconds(mid, n)[0] == pytest.approx(fwd)


# ---- the planner ------------------------------------------------------------------------------------

def test_two_node_plan_pipelines_and_beats_every_baseline(two_node_plan):
    plan = two_node_plan
    assert plan.pipeline is not None and len(plan.stages) >= 2
    assert plan.cost < plan.sim.iteration_seconds               # faster than one stage over all devices
    assert plan.cost >= plan.lower_bound                         # no plan beats total FLOPs over total FLOPS
    assert "pipeline-even" in plan.baselines
    assert all(plan.cost <= v * (1 + 1e-9) for v in plan.baselines.values())
    stages = plan.stages
    assert stages[0].first_node == 0 and stages[-1].stop_node == len(plan.graph.nodes)
    assert all(a.stop_node == b.first_node for a, b in zip(stages, stages[1:]))
    used = [r for st in stages for r in st.ranks]
    assert len(used) == len(set(used))
    assert plan.fits and len(plan.memory) == 4 and len(plan.ratios) == 4
    text = plan.summary()
    assert "pipeline:" in text and "micro-batches" in text and "bubble" in text and "gpt.py:" in text


def test_pipelined_plan_file_round_trips_byte_identically(two_node_plan, tmp_path):
    from hapc.plan.plan import Plan

    first = tmp_path / "a.json"
    two_node_plan.save(first)
    loaded = Plan.load(first)
    assert loaded.cost == pytest.approx(two_node_plan.cost, rel=1e-9)
    assert [(s.first_node, s.stop_node, s.ranks) for s in loaded.stages] == \
        [(s.first_node, s.stop_node, s.ranks) for s in two_node_plan.stages]
    second = tmp_path / "b.json"
    loaded.save(second)
    assert first.read_bytes() == second.read_bytes()
    data = json.loads(first.read_text())
    assert data["pipeline"]["microbatches"] == two_node_plan.pipeline.microbatches
    assert "seconds" not in data["pipeline"]["search"]          # nothing from the clock


def test_planner_is_deterministic(gpt4, two_node_plan):
    from synth.stages import StagePlanner

    a = two_node_plan.pipeline
    b = StagePlanner(gpt4.graph, load_cluster(str(TWO_NODES))).plan()
    assert a is not None and b is not None
    assert [(s.first_node, s.stop_node, s.ranks) for s in a.stages] == \
        [(s.first_node, s.stop_node, s.ranks) for s in b.stages]
    assert (a.microbatches, a.schedule, a.iteration_seconds) == (b.microbatches, b.schedule, b.iteration_seconds)


@pytest.mark.slow
def test_one_stage_plans_are_unchanged_without_stages(gpt4):
    from hapc.api import synthesize

    plan = synthesize(gpt4, None, str(TWO_NODES))
    assert plan.pipeline is None and len(plan.stages) == 1
    assert plan.stages[0].ranks == (0, 1, 2, 3) and plan.cost == plan.sim.iteration_seconds
    assert "pipeline" not in plan.to_dict()


def test_more_stages_than_places_to_cut_names_the_number(gpt4):
    from synth.stages import StagePlanner

    with pytest.raises(UserError, match=r"\-\-stages 99"):
        StagePlanner(gpt4.graph, load_cluster(str(TWO_NODES))).plan(stages=99)
    with pytest.raises(UserError, match=r"\-\-stages 5: the cluster's 4 devices"):
        StagePlanner(gpt4.graph, load_cluster(str(TWO_NODES))).plan(stages=5)


@pytest.mark.parametrize("options, needle", [
    ({"stages": "auto", "microbatches": 9}, "--microbatches 9"),
    ({"stages": 0}, "--stages 0"),
    ({"stages": "auto", "schedule": "zigzag"}, "--schedule zigzag"),
])
def test_stage_requests_that_do_not_fit_name_the_number(gpt4, options, needle):
    from hapc.api import synthesize

    with pytest.raises(UserError, match=needle.replace("-", r"\-")):
        synthesize(gpt4, None, str(TWO_NODES), **options)


def test_a_model_with_no_place_to_cut_says_so(load_model):
    import torch

    from hapc.frontend.tracer import trace
    from synth.stages import StagePlanner

    mod = load_model("mlp")
    kw = {"layers": 1, "features": 8, "hidden": 16, "classes": 3, "batch": 4}
    traced = trace(mod.model(**kw), tuple(mod.inputs(**kw)))
    with pytest.raises(UserError, match="no place to cut"):
        StagePlanner(traced.graph, load_cluster(str(TWO_NODES))).plan(stages=2)
    assert torch is not None


def test_compile_prints_one_torchrun_line_per_node():
    lines = launch_lines(load_cluster(str(HAP8)), "out/program.py")
    assert len(lines) == 2
    assert "--nnodes=2 --node_rank=0 --nproc_per_node=4" in lines[0]
    assert "--nnodes=2 --node_rank=1 --nproc_per_node=4" in lines[1]
    assert all(line.split("#")[0].rstrip().endswith("out/program.py --device cuda --verify") for line in lines)
    assert launch_lines(load_cluster(str(REPO / "configs" / "clusters" / "cpu4.yaml")), "p.py") == \
        ["torchrun --nproc_per_node=4 p.py --device cpu --verify"]


# ---- launching across nodes -------------------------------------------------------------------------

def _emitted_two_node_program(gpt4, load_model, out: Path):
    import importlib.util

    from hapc.codegen import emit
    from synth.baselines import baseline_program

    cluster = load_cluster(str(TWO_NODES))
    model_file = Path(load_model("gpt").__file__)
    path = emit(baseline_program("dp-flops", gpt4.graph, cluster), str(model_file), str(out), model_kwargs=GPT4,
                cluster=cluster, constants=gpt4.constants)
    spec = importlib.util.spec_from_file_location(f"two_node_program_{abs(hash(str(out)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Path(path), module


def test_emitted_program_checks_each_rank_is_on_its_planned_node(gpt4, load_model, tmp_path):
    _, program = _emitted_two_node_program(gpt4, load_model, tmp_path)
    assert program.NODE_SIZES == (2, 2)
    assert len(program.launch_lines("p.py")) == 2 and "--node_rank=1 --nproc_per_node=2" in program.launch_lines()[1]
    ok = {"GROUP_WORLD_SIZE": "2", "RANK": "3", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert program.node_mismatch(ok) is None
    assert program.node_mismatch({"RANK": "3"}) is None                  # one launcher runs all ranks
    wrong_node = program.node_mismatch({**ok, "GROUP_RANK": "0"})
    assert "rank 3 runs on node 0" in wrong_node and "plan puts it on node 1" in wrong_node
    assert "launched on 3 nodes" in program.node_mismatch({**ok, "GROUP_WORLD_SIZE": "3"})
    uneven = program.node_mismatch({**ok, "RANK": "1", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "3"})
    assert "with 3 ranks there" in uneven


@pytest.mark.slow
def test_two_launchers_shaped_as_the_clusters_nodes_verify(gpt4, load_model, tmp_path):
    """Two torchrun launchers on this host, --nnodes=2, one per node of the plan's cluster."""
    import socket
    import subprocess
    import sys

    path, _ = _emitted_two_node_program(gpt4, load_model, tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={i}",
                               "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={port}", str(path),
                               "--device", "cpu", "--steps", "1", "--verify"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "verify: ok" in outs[0]


def test_explain_walks_each_stage_with_its_group_and_source_lines(two_node_plan, tmp_path):
    from hapc.report.explain import explain
    from hapc.plan.plan import Plan

    two_node_plan.save(tmp_path / "plan.json")
    text = explain(Plan.load(tmp_path / "plan.json"))
    assert text.count("\nstage ") == len(two_node_plan.stages)
    assert "fwd ms/mb" in text and "gpt.py:" in text and "bubble" in text
    for st in two_node_plan.stages:
        assert f"nodes {st.first_node}-{st.stop_node - 1} on rank" in text


def test_sends_block_both_stages_where_communication_cannot_overlap():
    stages = [_stage(1.0, 1.0, x=0.5), _stage(1.0, 1.0)]
    hidden = schedule_cost(stages, 4, comm_overlap=1.0)
    blocking = schedule_cost(stages, 4, comm_overlap=0.0)
    # each stage waits for its 0.5 s send and 0.5 s receive: every step grows by 1 s, the max too
    assert blocking.pipeline_seconds == pytest.approx(hidden.pipeline_seconds + 2 * 1.0 + 3 * 1.0)


def test_forced_stages_microbatches_and_schedule_are_kept(gpt4):
    from synth.stages import StagePlanner

    pipe = StagePlanner(gpt4.graph, load_cluster(str(TWO_NODES))).plan(stages=3, microbatches=2, schedule="gpipe")
    assert pipe is not None
    assert (len(pipe.stages), pipe.microbatches, pipe.schedule) == (3, 2, "gpipe")
    assert pipe.cost.inflight == (2, 2, 2)


def test_hapc_check_compares_a_pipelined_plan_by_its_pipeline_time(two_node_plan, tmp_path, capsys):
    from hapc.cli import main

    two_node_plan.save(tmp_path / "plan.json")
    assert main(["check", str(tmp_path / "plan.json"), "--baseline", str(tmp_path / "plan.json")]) == 0
    assert f"{two_node_plan.cost * 1e3:.4f} ms/iter" in capsys.readouterr().out


@pytest.mark.parametrize("flags, needle", [(["--stages", "two"], "--stages two"),
                                           (["--stages", "auto", "--microbatches", "50"], "--microbatches 50")])
def test_compile_rejects_stage_flags_in_one_line(tmp_path, capsys, flags, needle):
    from hapc.cli import main

    mlp = str(REPO / "configs" / "models" / "mlp.py")
    small = ["--set", "layers=2", "--set", "features=8", "--set", "hidden=16", "--set", "classes=3", "--set", "batch=4"]
    rc = main(["compile", mlp, "--cluster", str(TWO_NODES), "-o", str(tmp_path), "-q", *small, *flags])
    out = capsys.readouterr()
    text = out.out + out.err
    assert rc == 2 and needle in text and "Traceback" not in text and len(text.strip().splitlines()) == 1


def test_report_names_stages_and_charts_them(two_node_plan, tmp_path):
    from hapc.report.pipeline import stage_time_split
    from hapc.report.summary import write_report

    text = write_report(two_node_plan, tmp_path).read_text()
    assert "pipeline:" in text and "micro-batches" in text
    work, tail, idle = stage_time_split(two_node_plan)
    total = two_node_plan.cost * 1e3
    assert all(abs(w + t + i - total) < 1e-6 or w + t > total for w, t, i in zip(work, tail, idle))
    assert max(work) > 0


def test_simulate_reprices_a_pipelined_plan_on_another_cluster(two_node_plan, tmp_path, capsys):
    from hapc.cli import main

    two_node_plan.save(tmp_path / "plan.json")
    assert main(["simulate", str(tmp_path / "plan.json")]) == 0
    same = capsys.readouterr().out
    assert f"{two_node_plan.cost * 1e3:.3f} ms" in same and "pipeline stages" in same
    assert main(["simulate", str(tmp_path / "plan.json"), "--cluster", str(REPO / "configs/clusters/small-mixed.yaml")]) == 0
    assert "small-mixed" in capsys.readouterr().out


# ---- exactness: the planner against brute force ----------------------------------------------------

GPT2L = {"layers": 2, "hidden": 64, "heads": 4, "seq": 64, "vocab": 101, "batch": 32, "dropout": 0.0}
SMALL_MIXED = REPO / "configs" / "clusters" / "small-mixed.yaml"


@pytest.fixture(scope="module")
def gpt2l(load_model):
    return _trace_gpt_on_meta(load_model, GPT2L)


def _every_pipeline(planner, schedules=("1f1b", "gpipe"), stages=None):
    """Every plan of the planner's space priced by the schedule model: each device order, each
    chain of groups from the first position, each rising sequence of cuts, each micro-batch
    count and schedule. The best one that fits, and how many were priced."""
    c = len(planner.cuts)
    best, priced = None, 0
    for nodes in planner.device_orders():
        _, starts = planner.groups_of(nodes)

        def chains(pos, cut):
            for g in starts.get(pos, []):
                for stop in range(cut + 1, c):
                    if stop == c - 1:
                        yield [(g, cut, stop)]
                    else:
                        for rest in chains(g.end, stop):
                            yield [(g, cut, stop)] + rest

        for m in planner.microbatch_counts([g for gs in starts.values() for g in gs]):
            for chain in chains(0, 0):
                if len(chain) < 2 or (stages and len(chain) != stages) or \
                        any(len(g.ranks) > max(1, planner.batch // m) for g, _, _ in chain):
                    continue
                for schedule in schedules:
                    priced += 1
                    pipe = planner._price(chain, m, schedule)
                    if pipe is not None and (best is None or pipe.iteration_seconds < best.iteration_seconds):
                        best = pipe
    return best, priced


@pytest.mark.parametrize("cluster_file, comm_overlap, memory_bytes", [
    (TWO_NODES, 0.3, None),            # sends block compute: the steps carry them
    (SMALL_MIXED, 1.0, None),          # unequal devices in one node: halves and quarters
    (TWO_NODES, 1.0, 1.6e6),           # memory binds: three stages, 16 micro-batches
    (SMALL_MIXED, 1.0, 1.3e6),         # memory binds: four stages
])
def test_planner_finds_the_brute_force_optimum(gpt2l, cluster_file, comm_overlap, memory_bytes):
    from dataclasses import replace

    from synth.stages import StagePlanner

    cluster = replace(load_cluster(str(cluster_file)), comm_overlap=comm_overlap)
    if memory_bytes:
        cluster = replace(cluster, devices=[replace(d, memory_bytes=memory_bytes) for d in cluster.devices])
    planner = StagePlanner(gpt2l.graph, cluster)
    found = planner.plan()
    best, priced = _every_pipeline(planner)
    assert priced > 1000 and best is not None and found is not None
    assert found.iteration_seconds == pytest.approx(best.iteration_seconds, rel=1e-12)
    assert found.search["exact"] and found.search["gap"] <= 1e-9
    assert found.search["lower_bound_seconds"] <= found.iteration_seconds * (1 + 1e-12)
    # a forced GPipe plan is bounded below by its 1F1B relaxation and reports the gap
    forced = planner.plan(stages=2, schedule="gpipe")
    gpipe_best, _ = _every_pipeline(planner, ("gpipe",), stages=2)
    if gpipe_best is None:
        assert forced is None
    else:
        assert forced.search["lower_bound_seconds"] <= gpipe_best.iteration_seconds * (1 + 1e-12)
        assert forced.iteration_seconds >= gpipe_best.iteration_seconds * (1 - 1e-12)
        assert forced.search["exact"] == (forced.iteration_seconds <= forced.search["lower_bound_seconds"] * (1 + 1e-9))


def test_gpipe_is_never_faster_than_1f1b_for_the_same_stages():
    """Why the search prices 1F1B only unless GPipe is forced: per stage list, GPipe's steady
    state pays max(f) + max(b) per micro-batch where 1F1B pays max(f + b), and it holds more."""
    import random

    rng = random.Random(7)
    for _ in range(200):
        stages = [StageCost(rng.random(), rng.random(), rng.random() * 0.5, rng.random() * 0.5, rng.random(),
                            rng.random() * 0.1, (1.0,), (rng.random(),)) for _ in range(rng.randint(2, 5))]
        m = rng.choice([1, 2, 4, 8])
        overlap = rng.choice([0.0, 0.5, 1.0])
        one_f = schedule_cost(stages, m, "1f1b", overlap)
        gpipe = schedule_cost(stages, m, "gpipe", overlap)
        assert one_f.iteration_seconds <= gpipe.iteration_seconds + 1e-12
        assert all(a <= b for x, y in zip(one_f.stage_memory_bytes, gpipe.stage_memory_bytes) for a, b in zip(x, y))


def test_forced_pipelines_that_cannot_work_name_the_number(gpt2l):
    from dataclasses import replace

    from synth.stages import StagePlanner

    planner = StagePlanner(gpt2l.graph, load_cluster(str(TWO_NODES)))
    with pytest.raises(UserError, match=r"\-\-microbatches 3 does not divide the batch of 32"):
        planner.plan(microbatches=3)
    tiny = load_cluster(str(TWO_NODES))
    tiny = replace(tiny, devices=[replace(d, memory_bytes=1e5) for d in tiny.devices])
    assert StagePlanner(gpt2l.graph, tiny).plan(stages=2) is None      # the API turns this into its one line


SLOW_SECOND_NODE = {"name": "fast-and-slow", "network": {"bandwidth_Gbps": 0.1, "latency_us": 500}, "nodes": [
    {"devices": [{"type": "A100-80GB", "count": 2}], "intra_link": "nvlink3"},
    {"devices": [{"name": "slow", "tflops": 0.05, "memory_GB": 16, "hbm_GBps": 50, "count": 2}],
     "intra_link": "pcie3"}]}


def test_a_node_alone_is_a_candidate_and_auto_is_never_slower(gpt4):
    """A slow node behind a slow network: one stage on the fast node alone (the slow one idle)
    is a plan the stage search cannot make (it gives every stage work, and wants two); the
    automatic choice is never slower than it (issue 23)."""
    from hapc.api import synthesize
    from synth.stages import StagePlanner, best_sub_cluster

    cluster = load_cluster(SLOW_SECOND_NODE)
    planner = StagePlanner(gpt4.graph, cluster)
    alone = best_sub_cluster(planner)
    assert alone is not None and len(alone.stages) == 1 and alone.microbatches == 1
    assert alone.stages[0].ranks == (0, 1)
    on_cpus = synthesize(gpt4, None, str(TWO_NODES), stages="auto")
    assert on_cpus.cost <= StagePlanner(gpt4.graph, load_cluster(str(TWO_NODES))).plan().iteration_seconds
    assert alone.iteration_seconds < simulate(planner.group_program(planner.group(range(4))), cluster).iteration_seconds
    for ranks in ((0, 1), (2, 3)):      # the fastest of the nodes alone
        priced = planner._price([(planner.group(ranks), 0, len(planner.cuts) - 1)], 1, "1f1b")
        assert priced is None or alone.iteration_seconds <= priced.iteration_seconds
    plan = synthesize(gpt4, None, SLOW_SECOND_NODE, stages="auto")
    assert plan.cost <= alone.iteration_seconds * (1 + 1e-9)
    assert best_sub_cluster(StagePlanner(gpt4.graph, load_cluster({**SLOW_SECOND_NODE,
                                                                   "nodes": SLOW_SECOND_NODE["nodes"][:1]}))) is None


def test_auto_pipelines_when_no_one_stage_plan_fits(gpt4):
    """Devices too small for one stage's activations: --stages auto still tries stages (a stage
    holds some layers and, under 1F1B, a few micro-batches' activations) and finds one that fits,
    where it stopped at the one-stage search's memory error before (issue 22). Without stages
    one stage fits only by giving time for memory (layers recomputed, optimizer state in ZeRO's
    rows), twice as slow. With less memory the stages recompute their layers and store their
    weights sharded (synth.stages.LeverPlanner); with less still, it is the one-stage error."""
    from hapc.api import synthesize
    from synth.ratios import MemoryInfeasible

    def cluster(gb: float) -> dict:
        node = {"devices": [{"name": "n", "tflops": 1.0, "memory_GB": gb, "hbm_GBps": 50, "count": 2}],
                "intra_link": "pcie3"}
        return {"name": "tight", "nodes": [node, node], "network": {"bandwidth_Gbps": 10, "latency_us": 20}}

    one = synthesize(gpt4, None, cluster(0.0015))
    assert one.fits and one.pipeline is None and one.program.recompute and one.program.state_shares is not None
    plan = synthesize(gpt4, None, cluster(0.0015), stages="auto")
    assert plan.fits and len(plan.stages) >= 2 and max(plan.memory) <= 0.0015e9 and plan.cost < one.cost / 2
    # Smaller still, the stages recompute their layers and store their weights sharded
    lean = synthesize(gpt4, None, cluster(0.001), stages="auto")
    assert lean.fits and len(lean.stages) >= 2 and all(st.program.recompute for st in lean.stages)
    assert max(lean.memory) <= 0.001e9 and lean.cost > plan.cost
    with pytest.raises(MemoryInfeasible):
        synthesize(gpt4, None, cluster(0.0008), stages="auto")
