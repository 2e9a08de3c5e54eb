"""A BERT-style encoder trained with the masked-language-model loss (BERT-base by default).

Word + position + segment embeddings followed by LayerNorm, then ``layers`` *post*-LayerNorm
blocks as in the original BERT (``x = LN(x + attn(x))``, ``x = LN(x + mlp(x))``) with
bidirectional attention through ``F.scaled_dot_product_attention`` and a 4x GELU MLP. The
MLM head is dense + GELU + LayerNorm and a decoder tied to the word embedding (plus a bias);
the loss is cross-entropy over the vocabulary at the masked positions only, the others
carrying the label -100 (``ignore_index``), as in Hugging Face's ``BertForMaskedLM``.

Left out on purpose: the next-sentence head (RoBERTa showed it is not needed) and padding
masks (every example in the synthetic batch is full length).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Tiny sizes for tests and the CPU demo. Dropout 0 keeps single-device comparisons exact.
SMALL = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "batch": 5, "dropout": 0.0}

MASK_RATE = 0.15   # share of positions that carry an MLM label


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not a multiple of heads={heads}")
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        head_dim = H // self.heads
        q = self.q(x).view(B, S, self.heads, head_dim).transpose(1, 2)
        k = self.k(x).view(B, S, self.heads, head_dim).transpose(1, 2)
        v = self.v(x).view(B, S, self.heads, head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.dropout(self.out(y.transpose(1, 2).reshape(B, S, H)))


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.attn = SelfAttention(hidden, heads, dropout)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.dropout(self.down(F.gelu(self.up(x)))))


class BertMLM(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, seq: int, vocab: int, dropout: float):
        super().__init__()
        self.vocab = vocab
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq, hidden)
        self.segment = nn.Embedding(2, hidden)
        self.ln_emb = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(Layer(hidden, heads, dropout) for _ in range(layers))
        self.head_dense = nn.Linear(hidden, hidden)
        self.head_ln = nn.LayerNorm(hidden, eps=1e-12)
        self.head_bias = nn.Parameter(torch.zeros(vocab))
        for emb in (self.word, self.position, self.segment):   # BERT's init scale
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, ids: torch.Tensor, segments: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.word(ids) + self.position(positions) + self.segment(segments)
        x = self.drop(self.ln_emb(x))
        for layer in self.layers:
            x = layer(x)
        h = self.head_ln(F.gelu(self.head_dense(x)))
        logits = F.linear(h, self.word.weight, self.head_bias)   # decoder tied to the word embedding
        return F.cross_entropy(logits.view(-1, self.vocab), labels.view(-1), ignore_index=-100)


def model(layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 128, vocab: int = 30522,
          batch: int = 8, dropout: float = 0.1) -> nn.Module:
    return BertMLM(layers, hidden, heads, seq, vocab, dropout)


def inputs(layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 128, vocab: int = 30522,
           batch: int = 8, **_: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, segment ids (first half 0, second half 1) and MLM labels (-100 = not masked).

    Drawn from a fixed generator so every rank builds the same batch; the first position of
    each example is always labelled so that no batch has an empty loss.
    """
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    segments = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    masked = torch.rand(batch, seq, generator=gen) < MASK_RATE
    masked[:, 0] = True
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return ids, segments, labels
