"""Hugging Face ``GPT2LMHeadModel``, unmodified, wrapped so that ``forward`` returns the loss.

The model file contract wants ``forward(*inputs) -> loss``; ``GPT2LMHeadModel`` returns an
output object, so a two-line wrapper passes the ids as labels (Hugging Face shifts them for
next-token prediction) and returns ``.loss``. ``dropout`` sets the residual and embedding
dropout, ``attn_dropout`` the attention dropout inside ``scaled_dot_product_attention``
(default 0.1 as in GPT-2; hapc's programs draw both masks so that ``--verify`` replays them).

Defaults are GPT-2 small (124M parameters) at sequence length 1024.
"""

from __future__ import annotations

import torch
from torch import nn

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "batch": 5, "dropout": 0.0,
         "attn_dropout": 0.0}


class LossOf(nn.Module):
    """``GPT2LMHeadModel`` whose forward returns the language-modelling loss."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, labels=ids).loss


def model(layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 1024, vocab: int = 50257,
          batch: int = 8, dropout: float = 0.1, attn_dropout: float = 0.1, use_cache: bool = False) -> nn.Module:
    """``use_cache`` off: training never reads the generation cache, and with it on every layer
    files its keys and values under its own index, so hapc must trace all layers instead of one."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=seq, vocab_size=vocab,
                        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=attn_dropout,
                        bos_token_id=vocab - 1, eos_token_id=vocab - 1, loss_type="ForCausalLM",
                        use_cache=use_cache)
    config._attn_implementation = "sdpa"
    return LossOf(GPT2LMHeadModel(config))


def inputs(layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 1024, vocab: int = 50257,
           batch: int = 8, **_: object) -> tuple[torch.Tensor]:
    """Token ids from a fixed generator (every rank builds the same batch)."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (batch, seq), generator=gen),)
