"""Micro-batches of a mixture of experts (synth.routed_tokens): sorting the batch's tokens by
expert couples no samples when each token's result comes from its own row, so pipelines and
gradient accumulation may split the batch; a position in sorted order, or the router's load
balancing loss (a product of means over all tokens), couples them and is refused in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import hapc
from synth.microbatching import MicroBatchingRefused, loss_split

FAMILIES = Path(__file__).resolve().parents[1] / "e2e" / "families"


class SortedTokens(nn.Module):
    """Sort the tokens of the batch, transform each row, put them back: ``position`` also
    multiplies each row by its place in sorted order, which depends on the other samples."""

    def __init__(self, position: bool):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.position = position

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1)
        ids, perm = torch.sort(flat)
        rows = torch.tanh(ids) * 2.0
        if self.position:
            rows = rows * torch.arange(flat.shape[0], dtype=flat.dtype)
        inverse = torch.zeros_like(perm)
        inverse[perm] = torch.arange(perm.shape[0])
        back = rows[inverse].reshape(x.shape)
        return (back * self.w).mean()


def test_sorting_the_batch_and_putting_it_back_row_by_row_splits_by_sample():
    traced = hapc.trace(SortedTokens(position=False), (torch.randn(6, 4),))
    assert loss_split(traced.graph).kind == "mean"


def test_a_position_in_sorted_order_couples_samples():
    traced = hapc.trace(SortedTokens(position=True), (torch.randn(6, 4),))
    with pytest.raises(MicroBatchingRefused, match="sorted order other than row by row"):
        loss_split(traced.graph)


@pytest.fixture(scope="module")
def mixtral():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(FAMILIES))
    import mixtral as module

    return module


def test_a_hugging_face_mixture_of_experts_splits_by_sample(mixtral):
    torch.manual_seed(0)
    traced = hapc.trace(mixtral.model(), mixtral.inputs())
    split = loss_split(traced.graph)
    assert split.kind == "count"          # labels' cross-entropy: a mean over counted tokens


def test_the_load_balancing_loss_couples_samples(mixtral):
    """Mixtral's auxiliary loss multiplies two means over all tokens of the batch."""
    torch.manual_seed(0)
    model = mixtral.model()
    model.inner.config.output_router_logits = True
    model.inner.config.router_aux_loss_coef = 0.01
    model.inner.router_aux_loss_coef = 0.01
    traced = hapc.trace(model, mixtral.inputs())
    with pytest.raises(MicroBatchingRefused, match="micro-batches would compute another loss"):
        loss_split(traced.graph)
