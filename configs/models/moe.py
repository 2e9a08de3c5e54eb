"""A mixture-of-experts decoder LM: GPT-style blocks whose MLP is a top-2 MoE layer.

The MoE layer is GShard's dense-dispatch form, so that expert parallelism is nothing more
than sharding the expert dimension ``e`` of a few einsums (``s`` tokens, ``e`` experts,
``c`` capacity slots per expert, ``m`` model width, ``h`` expert hidden width):

1. gate:     ``probs = softmax(x @ Wg)``, top-2 experts per token by ``torch.topk``;
2. capacity: each expert takes at most ``c`` tokens; a token's slot in an expert is its rank
   among the tokens routed there (``cumsum`` over tokens), first choices before second
   choices; tokens past capacity are dropped (their residual path still carries them);
3. dispatch: ``expert_in = einsum("sec,sm->ecm", dispatch, x)`` with a 0/1 mask;
4. experts:  ``einsum("ecm,emh->ech")``, GELU, ``einsum("ech,ehm->ecm")`` with the
   weights of all experts in one ``[e, m, h]`` parameter;
5. combine:  ``y = einsum("sec,ecm->sm", combine, expert_out)``, the mask weighted by the
   two normalised gate probabilities.

The loss is the LM cross-entropy plus ``aux_weight`` times the load-balancing loss
``e * sum_e(mean routing fraction_e * mean gate probability_e)`` (GShard, Switch).
Everything is data-independent in shape (one-hot masks by comparison with ``arange``, no
``nonzero``), so ``torch.export`` traces it. Defaults: 12 layers, hidden 768, 12 heads,
sequence 128, 8 experts in every block (505M parameters, 453M of them in experts),
capacity factor 1.25, vocabulary 30522.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# Tiny sizes for tests and the CPU demo; 80 tokens over 5 experts, capacity 40.
SMALL = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "batch": 5, "experts": 5,
         "dropout": 0.0}


def one_hot(index: torch.Tensor, classes: int, dtype: torch.dtype) -> torch.Tensor:
    """``index[..., None] == arange(classes)`` as ``dtype``: an export-friendly one-hot."""
    return (index.unsqueeze(-1) == torch.arange(classes, device=index.device)).to(dtype)


class MoE(nn.Module):
    def __init__(self, hidden: int, experts: int, capacity_factor: float):
        super().__init__()
        self.experts = experts
        self.capacity_factor = capacity_factor
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.w_in = nn.Parameter(torch.empty(experts, hidden, 4 * hidden))
        self.b_in = nn.Parameter(torch.zeros(experts, 1, 4 * hidden))
        self.w_out = nn.Parameter(torch.empty(experts, 4 * hidden, hidden))
        self.b_out = nn.Parameter(torch.zeros(experts, 1, hidden))
        nn.init.normal_(self.w_in, std=0.02)
        nn.init.normal_(self.w_out, std=0.02)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [B, S, m]`` -> (output of the same shape, load-balancing loss)."""
        B, S, M = x.shape
        tokens = x.reshape(B * S, M)
        E = self.experts
        capacity = math.ceil(self.capacity_factor * 2 * B * S / E)

        probs = F.softmax(self.gate(tokens), dim=-1)                      # [s, e]
        top_p, top_i = torch.topk(probs, 2, dim=-1)                       # [s, 2]
        mask1 = one_hot(top_i[:, 0], E, x.dtype)                          # [s, e]
        mask2 = one_hot(top_i[:, 1], E, x.dtype)
        aux = E * (probs.mean(0) * mask1.mean(0)).sum()

        # Slot of each token in its experts; second choices queue behind all first choices.
        slot1 = torch.cumsum(mask1, dim=0) - 1
        slot2 = torch.cumsum(mask2, dim=0) - 1 + mask1.sum(0, keepdim=True)
        mask1 = mask1 * (slot1 < capacity).to(x.dtype)
        mask2 = mask2 * (slot2 < capacity).to(x.dtype)
        pos1 = (slot1 * mask1).sum(-1).long()                             # [s]
        pos2 = (slot2 * mask2).sum(-1).long()

        # Gate weights of the two choices, renormalised to sum to one.
        gate1, gate2 = top_p[:, 0], top_p[:, 1]
        norm = gate1 + gate2
        gate1, gate2 = gate1 / norm, gate2 / norm

        place1 = mask1.unsqueeze(-1) * one_hot(pos1, capacity, x.dtype).unsqueeze(1)   # [s, e, c]
        place2 = mask2.unsqueeze(-1) * one_hot(pos2, capacity, x.dtype).unsqueeze(1)
        dispatch = place1 + place2
        combine = gate1[:, None, None] * place1 + gate2[:, None, None] * place2

        expert_in = torch.einsum("sec,sm->ecm", dispatch, tokens)
        h = F.gelu(torch.einsum("ecm,emh->ech", expert_in, self.w_in) + self.b_in)
        expert_out = torch.einsum("ech,ehm->ecm", h, self.w_out) + self.b_out
        y = torch.einsum("sec,ecm->sm", combine, expert_out)
        return y.reshape(B, S, M), aux


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
        return self.dropout(self.proj(y.transpose(1, 2).reshape(B, S, H)))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, experts: int, capacity_factor: float, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads, dropout)
        self.ln2 = nn.LayerNorm(hidden)
        self.moe = MoE(hidden, experts, capacity_factor)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.ln1(x))
        y, aux = self.moe(self.ln2(x))
        return x + self.dropout(y), aux


class MoELM(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, seq: int, vocab: int, experts: int,
                 capacity_factor: float, aux_weight: float, dropout: float):
        super().__init__()
        self.vocab = vocab
        self.aux_weight = aux_weight
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(hidden, heads, experts, capacity_factor, dropout)
                                    for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(positions))
        aux_total = 0.0
        for block in self.blocks:
            x, aux = block(x)
            aux_total = aux_total + aux
        logits = F.linear(self.ln_f(x), self.tok.weight)
        lm = F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))
        return lm + self.aux_weight * aux_total


def model(layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 128, vocab: int = 30522,
          batch: int = 8, experts: int = 8, capacity_factor: float = 1.25, aux_weight: float = 0.01,
          dropout: float = 0.1) -> nn.Module:
    return MoELM(layers, hidden, heads, seq, vocab, experts, capacity_factor, aux_weight, dropout)


def inputs(layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 128, vocab: int = 30522,
           batch: int = 8, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets from a fixed generator (every rank builds the same batch)."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
