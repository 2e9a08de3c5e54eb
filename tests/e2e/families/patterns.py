"""Tiny model files, one per pattern that a literal reading of the trace gets wrong: writes
into fresh tensors and views (T5/BART/Whisper's ``shift_tokens_right``), a frozen parameter,
a Python-list index (a lifted tensor constant), ``torch.no_grad()`` and disabled-autocast
regions. ``model(pattern=...)`` picks one, so a test or ``hapc compile --set pattern=...``
runs each on its own; every pattern's loss depends on the written values."""

import torch
from torch import nn
from torch.nn import functional as F

PATTERNS = ("shift_tokens_right", "copy_into_slice", "index_put", "masked_writes", "stale_view",
            "inplace_activation", "frozen_param", "list_index", "no_grad_autocast")
VOCAB, HIDDEN = 23, 16


class Net(nn.Module):
    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = pattern
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)
        self.table = nn.Parameter(torch.randn(12, HIDDEN), requires_grad=pattern != "frozen_param")

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = getattr(self, self.pattern)(ids, labels)
        return F.cross_entropy(self.head(h).reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)

    def shift_tokens_right(self, ids, labels):
        shifted = labels.new_zeros(labels.shape)
        shifted[:, 1:] = labels[:, :-1].clone()
        shifted[:, 0] = 3
        shifted.masked_fill_(shifted == -100, 1)
        return self.emb(shifted)

    def copy_into_slice(self, ids, labels):
        h = self.emb(ids)
        out = torch.zeros_like(h)
        out[:, :, : HIDDEN // 2].copy_(h[:, :, HIDDEN // 2:] * 2)
        out.narrow(2, HIDDEN // 2, HIDDEN // 4).copy_(h[:, :, : HIDDEN // 4])
        return out + h * 0.1

    def index_put(self, ids, labels):
        h = self.emb(ids)
        out = h.new_zeros(h.shape)
        rows = torch.tensor([0, 2, 3])
        out[rows] = h[rows] * 3
        out.index_put_((torch.tensor([1]),), h[1:2] - 1, accumulate=True)
        return out

    def masked_writes(self, ids, labels):
        h = self.emb(ids).transpose(0, 1).contiguous()
        view = h.transpose(0, 1)                     # writes through a transposed view
        view.masked_fill_(ids.unsqueeze(-1) % 3 == 0, 0.5)
        view.masked_scatter_((ids % 2 == 0).unsqueeze(-1).expand_as(view), torch.ones_like(view) * 0.25)
        return h.transpose(0, 1) + 0

    def stale_view(self, ids, labels):
        h = self.emb(ids).clone()
        first = h[:, 0]                              # taken before the write, read after it
        h[:, 0] += 1.0
        h.mul_(2)
        return h + first.unsqueeze(1)

    def inplace_activation(self, ids, labels):
        h = self.proj(self.emb(ids))[..., :HIDDEN]
        y = h.clone()
        y.add_(h, alpha=0.5)
        y.relu_()
        return y * 1.0                                # reads y as the trace named it before the writes

    def frozen_param(self, ids, labels):
        return self.emb(ids) + self.table[: ids.shape[1]]

    def list_index(self, ids, labels):
        qkv = self.proj(self.emb(ids)).view(ids.shape[0], ids.shape[1], 3, HIDDEN)
        return qkv[..., [-2], :].squeeze(2) + qkv[:, :, [0, 2]].sum(2)

    def no_grad_autocast(self, ids, labels):
        h = self.proj(self.emb(ids))[..., :HIDDEN]
        with torch.autocast("cpu", enabled=False):
            h = torch.sin(h) * 2
        with torch.no_grad():
            scale = h.abs().amax(-1, keepdim=True)
        return h / (scale + 1)


def model(pattern: str = "shift_tokens_right"):
    return Net(pattern)


def inputs():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (6, 9), generator=gen)
    labels = torch.randint(0, VOCAB, (6, 9), generator=gen)
    labels[:, -2:] = -100
    return ids, labels
