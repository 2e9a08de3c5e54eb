"""Pipelined programs (issue 12): the emitted tables and schedule order in-process (fast), and
real runs on gloo ranks that print ``verify: ok`` against one device (slow): the example GPT
on two nodes of two (two torchrun launchers), a 3-stage plan on groups of 1 + 2 + 3 ranks with
uneven shares inside, and Hugging Face GPT-2 across two nodes under GPipe."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from hapc.errors import UserError
from hapc.runtime.pipeline import BACKWARD, FORWARD, schedule_order

from tests.e2e.pipeline_plans import forced_pipeline
from tests.runs import step_losses

REPO = Path(__file__).resolve().parents[2]
GPT = REPO / "configs" / "models" / "gpt.py"
HF_GPT2 = REPO / "configs" / "models" / "hf_gpt2.py"
TWO_NODES = REPO / "configs" / "clusters" / "cpu-2nodes-2x2.yaml"
THREE_NODES = REPO / "configs" / "clusters" / "cpu-3nodes-1-2-3.yaml"
TINY = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "dropout": 0.0}


# ---- the schedule ------------------------------------------------------------------------------

def _run_schedule(schedule: str, stages: int, m: int) -> list[int]:
    """Play every stage's order with blocking receives (a forward needs the previous stage's
    forward of that micro-batch, a backward the next stage's backward); returns each stage's
    peak of micro-batches held. Fails on a deadlock."""
    orders = [schedule_order(schedule, stages, s, m) for s in range(stages)]
    done: set[tuple[str, int, int]] = set()
    pos, held, peak = [0] * stages, [0] * stages, [0] * stages
    while any(p < len(o) for p, o in zip(pos, orders)):
        moved = False
        for s in range(stages):
            if pos[s] == len(orders[s]):
                continue
            phase, i = orders[s][pos[s]]
            ready = (s == 0 or (FORWARD, i, s - 1) in done) if phase == FORWARD else \
                ((FORWARD, i, s) in done and (s == stages - 1 or (BACKWARD, i, s + 1) in done))
            if ready:
                done.add((phase, i, s))
                pos[s] += 1
                held[s] += 1 if phase == FORWARD else -1
                peak[s] = max(peak[s], held[s])
                moved = True
        assert moved, f"{schedule} deadlocks at {pos}"
    return peak


@pytest.mark.parametrize("stages, m", [(2, 1), (2, 4), (3, 2), (3, 8), (4, 3)])
def test_1f1b_runs_every_microbatch_without_deadlock_and_holds_at_most_the_stages_left(stages, m):
    for s in range(stages):
        order = schedule_order("1f1b", stages, s, m)
        assert sorted(order) == sorted([(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)])
        assert all(order.index((FORWARD, i)) < order.index((BACKWARD, i)) for i in range(m))
    assert _run_schedule("1f1b", stages, m) == [min(m, stages - s) for s in range(stages)]
    assert _run_schedule("gpipe", stages, m) == [m] * stages


def test_comm_nodes_come_from_the_plans_node_sizes(monkeypatch):
    from hapc.runtime.collectives import _ranks_per_node

    monkeypatch.delenv("HAPC_RANKS_PER_NODE", raising=False)
    assert _ranks_per_node([0, 1, 2, 3], None, (2, 2)) == 2
    assert _ranks_per_node([0, 1, 2, 3, 4, 5], None, (1, 2, 3)) == 6        # unequal nodes: flat forms
    assert _ranks_per_node([3, 4, 5], None, (1, 2, 3)) == 3                   # one node of the group
    assert _ranks_per_node([1, 2, 3, 4], None, (1, 2, 2)) == 2


# ---- the emitted program -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def three_stage_program(tmp_path_factory):
    """GPT on 1 + 2 + 3 ranks (FLOP-proportional, so uneven, shares inside each group), 2
    micro-batches of 6 samples; emitted and imported (nothing runs on ranks)."""
    plan = forced_pipeline(GPT, {**TINY, "batch": 12}, THREE_NODES, [(0,), (1, 2), (3, 4, 5)], [0.2, 0.5], 2,
                           group_program="dp-flops")
    out = tmp_path_factory.mktemp("three_stages")
    path = plan.emit(out)                   # (the slow runs below emit from a saved and loaded plan)
    spec = importlib.util.spec_from_file_location(f"pipelined_program_{abs(hash(str(out)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return plan, module


def test_emitted_tables_describe_each_stage_at_micro_batch_shapes(three_stage_program):
    plan, program = three_stage_program
    stages = program.STAGES
    assert [st["ranks"] for st in stages] == [(0,), (1, 2), (3, 4, 5)]
    assert program.MICROBATCHES == 2 and program.INPUT_SPLIT == (True, True)
    assert program.LOSS_SCALE == 1.0 and program.LOSS_COUNT["node"] == "cross_entropy_loss"    # counted targets
    assert [st["inputs"] for st in stages] == [("idx",), (), ("targets",)]
    for a, b in zip(stages, stages[1:]):                 # what one stage sends, the next receives
        assert [s[:4] for s in a["send"]] == list(b["recv"]) and b["recv"]
        rows = [shape[0] for _, shape, _, _ in b["recv"]]
        assert 6 in rows and 12 not in rows              # 12 samples / 2 micro-batches (and the positions)
    hidden, _, _, grad = stages[2]["recv"][0]
    piece = next(n for n, (base, layout) in stages[2]["needs"].items() if base == hidden and layout == "S")
    dim, lengths = stages[2]["shards"][piece]
    assert grad and sum(lengths) == 6 and len(set(lengths)) > 1        # uneven shares of the micro-batch
    assert stages[1]["shares"] != (0.5, 0.5) and len(stages[2]["shares"]) == 3
    # Every parameter is held by a stage; the LM head tied to the embedding by the first and last.
    assert set(program.PARAM_OWNER) == set(program.PARAMS)
    assert program.SHARED_PARAMS == {"p_tok_weight": (0, 2)}
    # TINY's dropouts have p = 0: listed (the reference counts every F.dropout call), drawing nothing
    assert program.RANDOM_NODES and {op for op, _ in program.RANDOM_NODES} == {"aten.dropout.default"}
    assert [program.STAGE_FORWARDS[k].__name__ for k in range(3)] == ["stage_0", "stage_1", "stage_2"]


def test_pipelined_program_needs_only_torch_and_its_siblings(three_stage_program):
    import ast

    _, program = three_stage_program
    path = Path(program.__file__)
    tree = ast.parse(path.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"hapc", "synth", "costmodel"}
    runtime = (path.parent / "hapc_pipeline.py").read_text()
    assert "import hapc" not in runtime and "from hapc" not in runtime
    assert "def stage_2(rt: Rank, v: dict[str, torch.Tensor])" in path.read_text()


def test_micro_batches_must_divide_the_batch(tmp_path):
    plan = forced_pipeline(GPT, {**TINY, "batch": 12}, TWO_NODES, [(0,), (1,)], [0.5], 5, group_program="dp-flops")
    with pytest.raises(UserError, match=r"--microbatches 5 does not divide the batch of 12"):
        plan.emit(tmp_path)


def test_how_micro_batch_losses_add_up_is_read_from_the_graph():
    import torch
    import torch.nn.functional as F

    from hapc.codegen.pipeline_emit import loss_split_of
    from hapc.frontend.tracer import trace

    class Tiny(torch.nn.Module):
        def __init__(self, reduction: str) -> None:
            super().__init__()
            self.lin, self.reduction = torch.nn.Linear(4, 3), reduction

        def forward(self, x, y):
            if self.reduction == "mse":
                return F.mse_loss(self.lin(x), F.one_hot(y, 3).float())
            return F.cross_entropy(self.lin(x), y, reduction=self.reduction)

    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    assert loss_split_of(trace(Tiny("mean"), (x, y)).graph, 2).kind == "count"     # ignored labels change the divisor
    assert loss_split_of(trace(Tiny("sum"), (x, y)).graph, 2).kind == "sum"
    assert loss_split_of(trace(Tiny("mse"), (x, y)).graph, 2).kind == "mean"
    assert loss_split_of(trace(Tiny("mean"), (x, y)).graph, 1).kind == "mean"


def test_drawing_nodes_are_found_so_that_verify_can_replay_them():
    import torch
    import torch.nn.functional as F

    from hapc.codegen.pipeline_emit import drawing_nodes
    from hapc.frontend.tracer import trace

    class Tiny(torch.nn.Module):
        def __init__(self, p: float) -> None:
            super().__init__()
            self.lin, self.drop = torch.nn.Linear(4, 3), torch.nn.Dropout(p)

        def forward(self, x, y):
            return F.cross_entropy(self.drop(self.lin(x)), y)

    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    assert drawing_nodes(trace(Tiny(0.1).train(), (x, y)).graph)
    # A dropout of p = 0 draws nothing, but the reference counts it among the F.dropout calls
    # whose k-th replays the k-th node: it is listed too.
    assert drawing_nodes(trace(Tiny(0.0).train(), (x, y)).graph) == [("aten.dropout.default", "dropout")]


# ---- real runs on gloo ranks -----------------------------------------------------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(path: Path, node_sizes: list[int], *args: str) -> list[str]:
    """One torchrun launcher per node of the plan's cluster (--nnodes), all on this host."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(node_sizes)}",
                               f"--node_rank={i}", f"--nproc_per_node={k}", "--master_addr=127.0.0.1",
                               f"--master_port={port}", str(path), "--device", "cpu", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=path.parent,
                              env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
             for i, k in enumerate(node_sizes)]
    outs = [p.communicate(timeout=420)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n----\n".join(o[-3000:] for o in outs)
    return outs


def _emit(plan, out: Path) -> Path:
    from hapc.plan.plan import Plan

    plan.save(out / "plan.json")
    return Path(Plan.load(out / "plan.json").emit(out))


@pytest.mark.slow
def test_gpt_on_two_nodes_of_two_with_uneven_stages_verifies(tmp_path):
    plan = forced_pipeline(GPT, {**TINY, "layers": 4, "batch": 8}, TWO_NODES, [(0, 1), (2, 3)], [0.3], 2)
    assert plan.stages[0].stop_node - plan.stages[0].first_node != plan.stages[1].stop_node - plan.stages[1].first_node
    outs = _launch(_emit(plan, tmp_path), [2, 2], "--steps", "2", "--verify")
    assert "verify: ok" in outs[0] and "step 2 loss" in outs[0]


@pytest.mark.slow
def test_three_stages_on_groups_of_one_two_and_three_ranks_verify(tmp_path):
    plan = forced_pipeline(GPT, {**TINY, "batch": 12}, THREE_NODES, [(0,), (1, 2), (3, 4, 5)], [0.2, 0.5], 2)
    assert [len(set(st.program.shares)) for st in plan.stages] == [1, 2, 3]     # uneven inside each group
    outs = _launch(_emit(plan, tmp_path), [1, 2, 3], "--steps", "1", "--verify")
    assert "verify: ok" in outs[0]


@pytest.mark.slow
def test_hugging_face_gpt2_pipelined_across_two_nodes_under_gpipe_verifies_with_dropout(tmp_path):
    """Dropout and attention dropout draw per micro-batch their rows of the whole batch's masks,
    which the one-device reference replays (issue 23)."""
    hf = {**TINY, "batch": 8, "dropout": 0.1, "attn_dropout": 0.1}
    plan = forced_pipeline(HF_GPT2, hf, TWO_NODES, [(0, 1), (2, 3)], [0.5], 4, schedule="gpipe",
                           group_program="dp-flops")
    outs = _launch(_emit(plan, tmp_path), [2, 2], "--steps", "1", "--verify")
    assert "verify: ok" in outs[0]


@pytest.mark.slow
@pytest.mark.parametrize("sharded", [False, True])
def test_pipelined_stages_that_recompute_their_layers_verify_with_dropout(tmp_path, sharded):
    """Activation recomputation in a pipeline (issue 22): each stage's layer calls run through
    rt.recompute, redrawing the forward's dropout masks for the micro-batch it recomputes; and
    with the stages' weights stored sharded too (ZeRO-3 in each group, the lever pass
    synth.stages.LeverPlanner plans), gathered again when a layer is recomputed."""
    from synth.stages import price_stages
    from synth.zero import with_sharded_storage

    plan = forced_pipeline(GPT, {**TINY, "layers": 4, "batch": 8, "dropout": 0.1}, TWO_NODES, [(0, 1), (2, 3)],
                           [0.45], 2, recompute=True)
    if sharded:
        plan.pipeline = price_stages(plan.graph, plan.cluster, [
            (st.first_node, st.stop_node, st.ranks, with_sharded_storage(st.program)) for st in plan.pipeline.stages],
            2, "1f1b")
    path = _emit(plan, tmp_path)
    stages = path.read_text().split("\ndef stage_")[1:]
    assert len(stages) == 2 and all("rt.recompute(" in stage for stage in stages)
    outs = _launch(path, [2, 2], "--steps", "2", "--verify")
    assert "verify: ok" in outs[0], outs[0][-2000:]


LOSSES = REPO / "tests" / "e2e" / "families" / "losses.py"
RANDOM_MASKING = REPO / "tests" / "e2e" / "families" / "random_masking.py"


@pytest.mark.slow
def test_random_ops_in_a_pipeline_verify(tmp_path):
    """MAE masking noise, drop path (rand and timm's new_empty().bernoulli_), randn_like and
    bernoulli, pipelined in 2 micro-batches over groups of two (issue 24)."""
    plan = forced_pipeline(RANDOM_MASKING, {"batch": 8}, TWO_NODES, [(0, 1), (2, 3)], [0.5], 2,
                           group_program="dp-flops")
    outs = _launch(_emit(plan, tmp_path), [2, 2], "--steps", "2", "--verify")
    assert "verify: ok" in outs[0], outs[0][-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("loss, cluster, groups, m", [
    ("masked_mean", TWO_NODES, [(0, 1), (2, 3)], 2),           # counts 4 and 24: mean of means is off by 0.27
    ("class_weights", TWO_NODES, [(0, 1, 2), (3,)], 2),        # a replicated loss on one rank
    ("nothing_counted", THREE_NODES, [(0,), (1, 2), (3, 4, 5)], 4),   # micro-batches that count nothing
    ("sum", TWO_NODES, [(0, 1), (2, 3)], 4),
])
def test_micro_batched_losses_add_up_to_the_whole_batchs(tmp_path, loss, cluster, groups, m):
    """Losses whose micro-batches weigh differently (issue 24): a mean over counted targets
    weighs each micro-batch by its count, and every gradient is divided by the batch's."""
    plan = forced_pipeline(LOSSES, {"loss": loss, "batch": 8}, cluster, groups, [0.5] if len(groups) == 2 else
                           [0.3, 0.6], m, group_program="dp-flops")
    outs = _launch(_emit(plan, tmp_path), [len(n.devices) for n in plan.cluster.nodes], "--steps", "2", "--verify")
    assert "verify: ok" in outs[0], outs[0][-2000:]


def _losses_of(outs: list[str]) -> list[float]:
    return list(step_losses(outs[0]).values())


@pytest.mark.slow
def test_pipelined_checkpoints_resume_exactly_under_either_plan(tmp_path):
    """A pipeline's ranks each save their stage's pieces (and optimizer state); the checkpoint
    resumes the same pipeline, a one-stage plan, and the other way round, with the losses of an
    uninterrupted run (issue 23: pipelines support --save/--load across plans)."""
    import hapc

    cfg = {**TINY, "batch": 12}
    (tmp_path / "pipe").mkdir()
    pipe = _emit(forced_pipeline(GPT, cfg, THREE_NODES, [(0,), (1, 2), (3, 4, 5)], [0.3, 0.6], 2,
                                 group_program="dp-flops"), tmp_path / "pipe")
    one = Path(hapc.synthesize(str(GPT), None, str(THREE_NODES), model_kwargs=cfg).emit(tmp_path / "one"))
    straight = _losses_of(_launch(pipe, [1, 2, 3], "--steps", "4"))
    for first, then in ((pipe, pipe), (pipe, one), (one, pipe)):
        saved = tmp_path / f"ck-{first.parent.name}-{then.parent.name}"
        assert _losses_of(_launch(first, [1, 2, 3], "--steps", "2", "--save", str(saved))) == straight[:2]
        assert _losses_of(_launch(then, [1, 2, 3], "--steps", "2", "--load", str(saved))) == straight[2:], \
            (first.parent.name, then.parent.name)


GROUP_WORKER = """
import torch, torch.distributed as dist
from hapc.runtime import collectives as C

dist.init_process_group("gloo")
me = dist.get_rank()
# Stage groups of 2 and 4 ranks on three nodes of two: the second spans nodes 1 and 2, so its
# hierarchical forms run on subgroups inside it; both run at once on disjoint groups.
comm = C.stage_comms([[0, 1], [2, 3, 4, 5]], [False, True], (2, 2, 2))
ok = True
if comm.world == 4:
    ok &= comm.hierarchical and comm.ranks_per_node == 2 and comm.rank == me - 2
    gen = torch.Generator().manual_seed(0)
    X = [torch.randn(5, 3, generator=gen, dtype=torch.float64) for _ in range(4)]
    lengths, offsets = [2, 1, 1, 1], [0, 2, 3, 4]
    lo, n = offsets[comm.rank], lengths[comm.rank]
    for method in ("hierarchical", "padded", "all_to_all", "grouped"):
        total = C.all_reduce(comm, X[comm.rank].clone(), method)
        ok &= torch.allclose(total, sum(X))
        piece = X[0][lo:lo + n].clone().requires_grad_()
        whole = C.all_gather(comm, piece, 0, lengths, method)
        ok &= torch.equal(whole, X[0])
        whole.backward(torch.ones_like(whole))          # reduce-scatter of 4 ranks' ones
        ok &= torch.equal(piece.grad, torch.full_like(piece, 4.0))
        mine = C.reduce_scatter(comm, X[comm.rank].clone(), 0, lengths, method)
        ok &= torch.allclose(mine, sum(X)[lo:lo + n])
else:
    ok &= not comm.hierarchical and comm.world == 2
    ok &= bool(C.all_reduce(comm, torch.full((3,), float(me)), "auto").eq(1.0).all())
import os
os.write(1, f"group collectives {'ok' if ok else 'FAILED'} {me}\\n".encode())   # one write: lines stay whole
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_stage_groups_run_their_collectives_and_hierarchical_subgroups_inside_them(tmp_path):
    import os

    worker = tmp_path / "group_worker.py"
    worker.write_text(GROUP_WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("HAPC_RANKS_PER_NODE", None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=6",
                           f"--master_port={_free_port()}", str(worker)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("group collectives ok") == 6, proc.stdout
