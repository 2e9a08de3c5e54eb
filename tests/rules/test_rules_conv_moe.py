"""Rules for convolution, pooling, batch/instance/group norm and MoE gating/dispatch ops:
every one passes the checker, the strategies that matter exist (so a regression that drops
one fails here), sync batch norm updates running statistics exactly once, and whole traced
programs (a CNN with batch norm, a top-2 MoE gate) match the single-device run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hapc
from hapc.codegen.executor import _compute, run
from hapc.ir.layout import P, R, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute, Strategy
from hapc.rules import rules, strategies
from hapc.rules.check import check_rule, check_strategy, sample_graph
from hapc.rules.registry import Sample
from hapc.rules.samples import Ids, Pos, T
from synth.builder import propagate

SHARES = (0.5, 0.3, 0.2)
MODULES = ("hapc.rules.ops_conv", "hapc.rules.ops_moe")
OURS = sorted(op for op, rule in rules().items() if rule.fn.__module__ in MODULES)


def test_the_families_cover_the_ops_models_emit():
    wanted = {"aten.conv1d.default", "aten.conv2d.default", "aten.conv2d.padding", "aten.convolution.default",
              "aten.conv_transpose2d.input", "aten.batch_norm.default", "aten.max_pool2d.default",
              "aten.avg_pool2d.default", "aten.adaptive_avg_pool2d.default", "aten.topk.default",
              "aten.one_hot.default", "aten.cumsum.default", "aten.sort.default", "aten.argsort.default",
              "aten.max.dim", "aten.argmax.default", "aten.scatter_add.default", "aten.index_add.default"}
    assert wanted <= set(OURS)


@pytest.mark.parametrize("op", OURS)
def test_rule_passes_checker(op):
    report = check_rule(rules()[op])
    assert not report.no_samples, f"{op} has no samples"
    assert not report.wrong, "\n".join(map(str, report.wrong))


def _strategies(op: str, sample: Sample) -> list[Strategy]:
    node, graph, _ = sample_graph(op, sample)
    return strategies(node, graph)


# --- the strategies that matter exist -------------------------------------------------------

CONV_SAMPLE = Sample((T(5, 7, 7, 5), T(4, 7, 3, 3), T(4), [1, 1], [1, 1]))


@pytest.mark.parametrize("strategy", [
    Strategy((Shard(0), R, R), (Shard(0),)),                  # data parallel
    Strategy((R, Shard(0), Shard(0)), (Shard(1),)),           # output channels
    Strategy((Shard(1), Shard(1), P), (P,)),                  # input channels: Partial sum, Partial bias
    Strategy((P, R, P), (P,)),
])
def test_conv2d_strategies_exist(strategy):
    assert strategy in _strategies("aten.conv2d.default", CONV_SAMPLE)


def test_conv_never_offers_partial_output_with_replicated_bias():
    for s in _strategies("aten.conv2d.default", CONV_SAMPLE):
        if s.outputs == (P,):
            assert s.inputs[2] == P, s


def test_depthwise_conv_shards_whole_groups_only_when_groups_align():
    depthwise = Sample((T(4, 5, 7, 5), T(5, 1, 3, 3), T(5), [1, 1], [1, 1], [1, 1], 5))
    group = Strategy((Shard(1), Shard(0), Shard(0)), (Shard(1),), local="conv_groups_local")
    assert group in _strategies("aten.conv2d.default", depthwise)
    # 2 in / 2 out channels per group: the pieces' gcd would cut groups in half.
    misaligned = Sample((T(4, 8, 7, 5), T(4, 4, 3, 3), T(4), [1, 1], [0, 0], [1, 1], 2))
    found = _strategies("aten.conv2d.default", misaligned)
    assert Strategy((Shard(0), R, R), (Shard(0),)) in found
    assert not [s for s in found if Shard(1) in s.inputs + s.outputs]
    # ... and the checker confirms that the naive channel shard of a grouped conv is wrong.
    assert check_strategy("aten.conv2d.default", misaligned,
                          Strategy((Shard(1), Shard(0), Shard(0)), (Shard(1),))) is not None


def test_patch_embedding_conv_shards_whole_patches_spatially():
    patchify = Sample((T(5, 3, 10, 8), T(4, 3, 2, 2), T(4), [2, 2]))
    found = _strategies("aten.conv2d.default", patchify)
    assert Strategy((Shard(2), R, R), (Shard(2),)) in found
    overlapping = _strategies("aten.conv2d.default", CONV_SAMPLE)
    assert not [s for s in overlapping if s.inputs[0] in (Shard(2), Shard(3))]


BN_TRAIN = Sample((T(5, 7, 4, 5), T(7), T(7), T(7), Pos(7), True, 0.1, 1e-5, False), frozen=(3, 4))
BN_EVAL = Sample((T(5, 7, 4, 5), T(7), T(7), T(7), Pos(7), False, 0.1, 1e-5, False), frozen=(3, 4))


def test_batch_norm_training_syncs_statistics_for_batch_shards():
    found = _strategies("aten.batch_norm.default", BN_TRAIN)
    assert Strategy((Shard(0), R, R, R, R), (Shard(0),), local="batch_norm_sync") in found
    assert Strategy((Shard(1), Shard(0), Shard(0), Shard(0), Shard(0)), (Shard(1),)) in found
    # A plain batch shard in training mode would normalise with local statistics: wrong.
    assert Strategy((Shard(0), R, R, R, R), (Shard(0),)) not in found
    assert check_strategy("aten.batch_norm.default", BN_TRAIN,
                          Strategy((Shard(0), R, R, R, R), (Shard(0),))) is not None


def test_batch_norm_eval_shards_freely():
    found = _strategies("aten.batch_norm.default", BN_EVAL)
    for d in (0, 2, 3):
        assert Strategy((Shard(d), R, R, R, R), (Shard(d),)) in found


@pytest.mark.parametrize("op, sample, strategy", [
    ("aten.max_pool2d.default", Sample((T(5, 7, 7, 5), [3, 3])), Strategy((Shard(0),), (Shard(0),))),
    ("aten.max_pool2d.default", Sample((T(5, 7, 7, 5), [3, 3])), Strategy((Shard(1),), (Shard(1),))),
    ("aten.avg_pool2d.default", Sample((T(5, 7, 7, 5), [3, 3])), Strategy((P,), (P,))),
    ("aten.adaptive_avg_pool2d.default", Sample((T(5, 7, 7, 5), [1, 1])),
     Strategy((Shard(2),), (P,), rescale=(0, 2))),                                # global pool of a row shard
    ("aten.topk.default", Sample((T(5, 7), 2)), Strategy((Shard(0),), (Shard(0), Shard(0)))),
    ("aten.max.dim", Sample((T(5, 7, 4), 1)), Strategy((Shard(2),), (Shard(1), Shard(1)))),
    ("aten.one_hot.default", Sample((Ids(5, 7, 4), 5)), Strategy((Shard(0),), (Shard(0),))),
    ("aten.one_hot.default", Sample((Ids(5, 7, 4), 5)), Strategy((R,), (Shard(2),), local="one_hot_class_shard")),
    ("aten.cumsum.default", Sample((T(7, 5), 0)), Strategy((Shard(0),), (Shard(0),), local="cumsum_scan")),
    ("aten.scatter_add.default", Sample((T(7,), 0, Ids(7, 10), T(10))),
     Strategy((P, Shard(0), Shard(0)), (P,))),                                     # counts over sharded tokens
])
def test_strategy_exists(op, sample, strategy):
    assert strategy in _strategies(op, sample)


@pytest.mark.parametrize("op, sample, dim", [
    ("aten.topk.default", Sample((T(5, 7), 2)), 1),
    ("aten.sort.default", Sample((T(5, 7),)), 1),
    ("aten.argmax.default", Sample((T(5, 7), 1)), 1),
])
def test_no_strategy_shards_the_selected_dim(op, sample, dim):
    assert not [s for s in _strategies(op, sample) if Shard(dim) in s.inputs]


# --- sync batch norm: running statistics and float32 ---------------------------------------

def _run_one(op: str, sample: Sample, strategy: Strategy, tensors: list[torch.Tensor]):
    """Run one strategy on 3 uneven ranks over the given (mutable) global tensors."""
    node, graph, _ = sample_graph(op, sample)
    prog = DistProgram(graph, SHARES, {n: R for n in graph.inputs})
    reads = []
    for i, (ref, lay) in enumerate(zip(node.input_refs(), strategy.inputs)):
        reads.append(f"{ref}@{i}")
        prog.steps.append(Redistribute(ref, reads[-1], R, lay))
    env = {}
    for name, t, lay in zip(reads, tensors, strategy.inputs):
        env[name] = (list(torch.split(t, prog.lengths(name, lay.dim), lay.dim)) if isinstance(lay, Shard)
                     else [t] * 3)
    outs = _compute(prog, node, Compute("n", strategy, tuple(reads)), env, seed=0)
    return [torch.cat(p, strategy.outputs[0].dim) for p in outs]


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_sync_batch_norm_updates_running_stats_once(dtype, tol):
    x = (T(5, 7, 4, 5) * 3 + 2).to(dtype)
    w, b = T(7).to(dtype), T(7).to(dtype)
    mean, var = T(7).to(dtype), Pos(7).to(dtype)
    ref_mean, ref_var = mean.clone(), var.clone()
    ref = F.batch_norm(x, ref_mean, ref_var, w, b, training=True, momentum=0.1, eps=1e-5)
    sync = Strategy((Shard(0), R, R, R, R), (Shard(0),), local="batch_norm_sync")
    (out,) = _run_one("aten.batch_norm.default", BN_TRAIN, sync, [x, w, b, mean, var])
    assert (out - ref).abs().max().item() < tol
    # Shared by all simulated ranks, the buffers still got exactly one momentum update.
    assert (mean - ref_mean).abs().max().item() < tol
    assert (var - ref_var).abs().max().item() < tol


def test_channel_sharded_batch_norm_updates_each_slice():
    x, w, b, mean, var = T(5, 7, 4), T(7), T(7), T(7), Pos(7)
    ref_mean, ref_var = mean.clone(), var.clone()
    F.batch_norm(x, ref_mean, ref_var, w, b, training=True, momentum=0.1, eps=1e-5)
    channel = Strategy((Shard(1), Shard(0), Shard(0), Shard(0), Shard(0)), (Shard(1),))
    sample = Sample((x, w, b, mean.clone(), var.clone(), True, 0.1, 1e-5, False), frozen=(3, 4))
    _run_one("aten.batch_norm.default", sample, channel, [x, w, b, mean, var])
    assert torch.allclose(mean, ref_mean, atol=1e-12) and torch.allclose(var, ref_var, atol=1e-12)


# --- whole traced programs ------------------------------------------------------------------

class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False)
        self.bn2 = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 5)

    def forward(self, x, y):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        h = F.relu(self.bn2(self.dw(h)))
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return F.cross_entropy(self.fc(h), y)


class Top2Gate(nn.Module):
    """GShard-style gate: top-2 experts, capacity positions by cumsum over tokens, dense
    dispatch/combine with einsum, and the load-balancing loss."""

    def __init__(self, model=6, experts=4, capacity=3):
        super().__init__()
        self.wg = nn.Linear(model, experts, bias=False)
        self.w = nn.Parameter(torch.randn(experts, model, model) * 0.3)
        self.experts, self.capacity = experts, capacity

    def forward(self, x):
        probs = F.softmax(self.wg(x), dim=-1)
        vals, idx = torch.topk(probs, 2, dim=-1)
        mask = F.one_hot(idx, self.experts).to(x.dtype)
        m1, m2 = mask[:, 0], mask[:, 1]
        pos1 = torch.cumsum(m1, dim=0) * m1 - m1
        pos2 = (torch.cumsum(m2, dim=0) + m1.sum(0, keepdim=True)) * m2 - m2
        m1, m2 = m1 * (pos1 < self.capacity), m2 * (pos2 < self.capacity)
        c1 = F.one_hot((pos1 * m1).sum(-1).long(), self.capacity).to(x.dtype)
        c2 = F.one_hot((pos2 * m2).sum(-1).long(), self.capacity).to(x.dtype)
        comb = (vals[:, 0:1, None] * m1[:, :, None] * c1[:, None, :]
                + vals[:, 1:2, None] * m2[:, :, None] * c2[:, None, :])
        xe = torch.einsum("sec,sm->ecm", comb, x)
        ye = torch.einsum("ecm,emh->ech", xe, self.w)
        y = torch.einsum("sec,ecm->sm", comb, ye)
        aux = (probs.mean(0) * m1.mean(0)).sum() * self.experts
        return y.pow(2).mean() + aux


def _compare(model, inputs, program, traced):
    model = model.double()
    ref_loss = model(*[t.double() if t.is_floating_point() else t for t in inputs])
    ref_grads = torch.autograd.grad(ref_loss, list(model.parameters()))
    out = run(program, traced, inputs, dtype=torch.float64)
    assert abs(out.loss - ref_loss.detach()).item() < 1e-9
    for name, ref in zip(traced.graph.params, ref_grads):
        assert (out.grads[name] - ref).abs().max().item() < 1e-9, name


def test_data_parallel_cnn_with_sync_batch_norm_matches_single_device():
    torch.manual_seed(0)
    model = SmallCNN()
    inputs = (torch.randn(7, 3, 8, 8), torch.randint(0, 5, (7,)))
    traced = hapc.trace(model, inputs)
    graph = traced.graph
    program = propagate(graph, SHARES, {graph.inputs[0]: Shard(0), graph.inputs[1]: Shard(0)})
    used = {step.strategy.local for step in program.steps if isinstance(step, Compute)}
    assert "batch_norm_sync" in used
    _compare(model, inputs, program, traced)


def test_token_sharded_moe_gate_matches_single_device():
    torch.manual_seed(0)
    model = Top2Gate()
    inputs = (torch.randn(11, 6),)
    traced = hapc.trace(model, inputs)
    graph = traced.graph
    program = propagate(graph, SHARES, {graph.inputs[0]: Shard(0)})
    computes = [s for s in program.steps if isinstance(s, Compute)]
    scans = [s for s in computes if s.strategy.local == "cumsum_scan"]
    assert len(scans) == 2          # capacity positions stay token-sharded
    _compare(model, inputs, program, traced)
