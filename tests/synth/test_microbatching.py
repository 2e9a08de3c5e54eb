"""Whether micro-batches add up to the whole batch's loss (synth.microbatching): a mean, a sum and
a mean over counted targets are found from the graph; losses that couple samples are refused in
one line naming the op and its source line, before any search, and an automatic pipeline then
keeps one micro-batch."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hapc.cli import main
from hapc.frontend.modelfile import load_model_file
from hapc.frontend.tracer import trace
from synth.microbatching import COUNT, MEAN, SUM, MicroBatchingRefused, loss_split

ROOT = Path(__file__).resolve().parents[2]
LOSSES = ROOT / "tests" / "e2e" / "families" / "losses.py"
TWO_NODES = str(ROOT / "configs" / "clusters" / "cpu-2nodes-2x2.yaml")


@functools.cache
def _graph(loss: str):
    mf = load_model_file(str(LOSSES), {"loss": loss})
    return trace(mf.build_model(), mf.build_inputs()).graph


@pytest.mark.parametrize("loss, kind", [("masked_mean", COUNT), ("class_weights", COUNT), ("sum", SUM),
                                        ("mean_mse", MEAN)])
def test_losses_that_add_up_say_how(loss, kind):
    split = loss_split(_graph(loss))
    assert split.kind == kind
    assert (split.node == "cross_entropy_loss") == (kind == COUNT)


def _line(text: str) -> int:
    """The line of losses.py that holds ``text``."""
    return next(i for i, line in enumerate(LOSSES.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("loss, op, code, why", [
    ("contrastive", "aten.matmul.default", "logits = a @ b.T", "combines different samples"),
    ("batch_stats", "aten.sub.Tensor", "h = h - h.mean(0", "statistic of the whole batch"),
])
def test_losses_that_couple_samples_are_refused_naming_op_and_line(loss, op, code, why):
    line = _line(code)
    with pytest.raises(MicroBatchingRefused) as info:
        loss_split(_graph(loss))
    message = str(info.value)
    assert message.startswith(op) and f"losses.py:{line}" in message and why in message
    assert "\n" not in message and "--microbatches 1" in message


class _Net(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.lin, self.norm, self.body = nn.Linear(6, 5), nn.BatchNorm1d(5), body

    def forward(self, x, y):
        return self.body(self, x, y)


def _split(body, batch: int = 8):
    x, y = torch.randn(batch, 6), torch.randint(0, 5, (batch,))
    return loss_split(trace(_Net(body).train(), (x, y)).graph)


def test_batch_norm_statistics_couple_samples():
    with pytest.raises(MicroBatchingRefused, match=r"^aten\.\w*batch_norm\S* .* mixes the samples"):
        _split(lambda m, x, y: F.cross_entropy(m.norm(m.lin(x)), y))


def test_terms_averaged_over_different_counts_cannot_share_a_weight():
    with pytest.raises(MicroBatchingRefused, match="different counts"):
        _split(lambda m, x, y: F.cross_entropy(m.lin(x), y) + 0.1 * m.lin(x).pow(2).mean())


def test_a_linear_sum_over_the_batch_may_reach_the_loss():
    """A mean over the batch added to another mean (each a sum of samples' terms) is still a
    mean; a product of two batch means is not."""
    assert _split(lambda m, x, y: m.lin(x).pow(2).mean() + 0.5 * m.lin(x).abs().mean()).kind == MEAN
    with pytest.raises(MicroBatchingRefused, match="non-linear op"):
        _split(lambda m, x, y: m.lin(x).mean(0).pow(2).sum())


def test_values_built_for_the_batch_from_its_size_are_sliced_with_it():
    """A mask the model builds for its batch (expanded to B, indexed by arange(B), as Hugging
    Face's causal masks are) is rebuilt by each micro-batch's trace at its size."""
    def body(m, x, y):
        b = x.shape[0]
        mask = torch.ones(5, dtype=torch.bool).expand(b, 5)[torch.arange(b)]
        return F.cross_entropy(m.lin(x).masked_fill(~mask, 0.0), y)

    assert _split(body).kind == COUNT


def test_a_mean_over_what_a_random_mask_keeps_couples_samples():
    """ViT-MAE's loss: a sum over the patches its random mask keeps, over the mask's count. The
    noise is drawn for the batch, so the count is the batch's; taken for a constant, each
    micro-batch's mean was added up as a sum (a pipelined ViT-MAE trained twice the loss)."""
    def body(m, x, y):
        keep = (torch.rand(x.shape[0], 5) > 0.5).float()
        return (m.lin(x).pow(2) * keep).sum() / keep.sum()

    with pytest.raises(MicroBatchingRefused, match="non-linear op"):
        _split(body)


def test_forced_micro_batches_on_a_coupled_loss_fail_in_one_line_before_any_search(tmp_path, capsys):
    code = main(["compile", str(LOSSES), "--set", "loss=contrastive", "--cluster", TWO_NODES, "--stages", "2",
                 "--microbatches", "2", "-o", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "aten.matmul.default" in err and f"losses.py:{_line('logits = a @ b.T')}" in err
    assert "combines different samples" in err
    assert not (tmp_path / "out").exists()


def test_an_automatic_pipeline_of_a_coupled_loss_keeps_one_micro_batch():
    from costmodel.cluster import load_cluster
    from synth.stages import StagePlanner

    planner = StagePlanner(_graph("contrastive"), load_cluster(TWO_NODES))
    assert not planner.splits_batch()
    assert planner.microbatch_counts([planner.group((0,))]) == [1]
    counted = StagePlanner(_graph("masked_mean"), load_cluster(TWO_NODES))
    assert counted.splits_batch() and counted.microbatch_counts([counted.group((0,))]) == [1, 2, 4, 8]


def test_a_sum_divided_by_the_batch_size_is_refused_once_a_micro_batch_is_traced():
    """``loss.sum() / ids.shape[0]``: the trace bakes in 8, a micro-batch's trace 4, so the
    micro-batches' losses would add up to twice the batch's (verify: FAILED, loss off by 17.6).
    A sum divided by a fixed number is not refused."""
    from synth.microbatching import check_batch_constants

    def traced(loss: str, batch: int):
        mf = load_model_file(str(LOSSES), {"loss": loss, "batch": batch})
        return trace(mf.build_model(), mf.build_inputs()).graph

    whole = traced("manual_mean", 8)
    split = loss_split(whole)
    assert split.kind == SUM and split.summed
    with pytest.raises(MicroBatchingRefused, match=r"^aten\.div\.Tensor .*losses\.py:\d+ scales a sum over the batch "
                                                   r"by a number that changes with the batch size \(8 .* 4 "):
        check_batch_constants(whole, traced("manual_mean", 4), split)
    fixed = traced("sum", 8)
    check_batch_constants(fixed, traced("sum", 4), loss_split(fixed))
