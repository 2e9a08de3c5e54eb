"""Tiny model files, one per loss pattern that micro-batches must add up exactly or refuse
(``model(loss=...)`` picks one; ``hapc compile --set loss=...``):

* ``masked_mean``: a language-model loss over labels padded with -100, unevenly: the first
  half of the batch has far fewer counted labels than the second, so the mean of the
  micro-batches' means is not the batch's mean;
* ``class_weights``: the same with class weights, whose sum over counted targets divides;
* ``nothing_counted``: the masked mean where the first half of the batch counts no label at all
  (a micro-batch with nothing to count adds nothing, rather than its 0/0);
* ``sum``: a summed loss (each micro-batch weighs 1);
* ``mean_mse``: a mean over all elements (each weighs 1/m);
* ``manual_mean``: a sum divided by ``ids.shape[0]``, which the trace bakes in as the batch
  size (a micro-batch's trace divides by its own size: must be refused);
* ``contrastive``: CLIP's loss, every sample against every other (must be refused);
* ``batch_stats``: features normalised by the batch's mean (must be refused).
"""

import torch
from torch import nn
from torch.nn import functional as F

LOSSES = ("masked_mean", "class_weights", "nothing_counted", "sum", "mean_mse", "manual_mean", "contrastive", "batch_stats")
VOCAB, HIDDEN, SEQ = 11, 16, 6


class Net(nn.Module):
    def __init__(self, loss: str, layers: int):
        super().__init__()
        self.loss = loss
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(layers))
        self.head = nn.Linear(HIDDEN, VOCAB)
        self.other = nn.Linear(HIDDEN, HIDDEN)
        self.register_buffer("weights", torch.linspace(0.5, 2.0, VOCAB))

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        if self.loss == "contrastive":
            a = F.normalize(h.mean(1), dim=-1)
            b = F.normalize(self.other(h).mean(1), dim=-1)
            logits = a @ b.T / 0.1
            target = torch.arange(ids.shape[0])
            return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
        if self.loss == "batch_stats":
            h = h - h.mean(0, keepdim=True)
        logits = self.head(h).reshape(-1, VOCAB)
        flat = labels.reshape(-1)
        if self.loss == "class_weights":
            return F.cross_entropy(logits, flat, weight=self.weights, ignore_index=-100)
        if self.loss == "sum":
            return F.cross_entropy(logits, flat, ignore_index=-100, reduction="sum") / 50.0
        if self.loss == "manual_mean":
            return F.cross_entropy(logits, flat.clamp(min=0), reduction="sum") / ids.shape[0]
        if self.loss == "mean_mse":
            return F.mse_loss(logits.softmax(-1), F.one_hot(flat.clamp(min=0), VOCAB).float())
        return F.cross_entropy(logits, flat, ignore_index=-100)


def model(loss: str = "masked_mean", layers: int = 4, batch: int = 8) -> nn.Module:
    return Net(loss, layers)


def inputs(loss: str = "masked_mean", layers: int = 4, batch: int = 8, **_: object):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch, SEQ), generator=gen)
    labels = torch.randint(0, VOCAB, (batch, SEQ), generator=gen)
    labels[: batch // 2, 1:] = -100            # the first half counts 1 label per row, the rest SEQ
    if loss == "nothing_counted":
        labels[: batch // 2] = -100
    return ids, labels
