"""A GPT-style decoder-only language model (GPT-2 layout).

Token and learned position embeddings, ``layers`` pre-LayerNorm blocks (causal self-attention
then a 4x GELU MLP, each in a residual), a final LayerNorm and an LM head tied to the token
embedding; the loss is next-token cross-entropy over the vocabulary.

Attention is written with *separate* q, k, v projections and an explicit head split
(``view(B, S, heads, head_dim).transpose(1, 2)``) so that the traced graph shows the
head dimension the planner can shard (head-parallel attention), and it calls
``F.scaled_dot_product_attention`` so the attention kernel stays one node.

Defaults are GPT-2 small (124M parameters) at sequence length 128.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Tiny sizes for tests and the CPU demo. Dropout 0 keeps single-device comparisons exact.
SMALL = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "batch": 5, "dropout": 0.0}


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not a multiple of heads={heads}")
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        head_dim = H // self.heads
        q = self.q(x).view(B, S, self.heads, head_dim).transpose(1, 2)
        k = self.k(x).view(B, S, self.heads, head_dim).transpose(1, 2)
        v = self.v(x).view(B, S, self.heads, head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, S, H)
        return self.dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, hidden: int, dropout: float):
        super().__init__()
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads, dropout)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, seq: int, vocab: int, dropout: float):
        super().__init__()
        self.vocab = vocab
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(hidden, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        # GPT-2's embedding scale: with torch's default N(0, 1) the tied head's logits start
        # huge and the first losses are meaningless for the demo.
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(positions))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.tok.weight)   # LM head tied to the token embedding
        return F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))


def model(layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 128, vocab: int = 50257,
          batch: int = 8, dropout: float = 0.1) -> nn.Module:
    return GPT(layers, hidden, heads, seq, vocab, dropout)


def inputs(layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 128, vocab: int = 50257,
           batch: int = 8, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets from a fixed generator (every rank builds the same batch)."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
