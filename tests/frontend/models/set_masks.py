"""A tiny transformer that builds its attention masks by iterating a ``set``, as Gemma3 and
ModernBERT in Hugging Face transformers do (``for kind in set(layer_types): masks[kind] = ...``):
the order the masks' ops are traced in follows Python's hash seed."""

import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self, dim: int, kind: str):
        super().__init__()
        self.kind = kind
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x, masks):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~masks[self.kind], float("-inf"))
        return x + self.drop(self.out(scores.softmax(-1) @ v))


class Net(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, window: int):
        super().__init__()
        self.window = window
        self.kinds = ["full" if i % 2 == 0 else "sliding" for i in range(layers)]
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, kind) for kind in self.kinds)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        t = tokens.shape[1]
        masks = {}
        for kind in set(self.kinds):            # the order depends on PYTHONHASHSEED
            i = torch.arange(t).to(x.device)
            causal = i[None, :] <= i[:, None]
            if kind == "sliding":
                causal = causal & (i[:, None] - i[None, :] < self.window)
            masks[kind] = causal.to(x.device)
        for layer in self.layers:
            x = layer(x, masks)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def model(vocab: int = 16, dim: int = 8, layers: int = 2, window: int = 2) -> nn.Module:
    return Net(vocab, dim, layers, window)


def inputs(vocab: int = 16, batch: int = 4, seq: int = 6):
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))
