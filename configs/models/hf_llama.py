"""A Llama-style decoder: Hugging Face ``LlamaForCausalLM``, unmodified, wrapped so that
``forward`` returns the loss (RMSNorm, rotary positions, SwiGLU MLP, untied LM head).

Defaults are about 8 layers x 1024 hidden (16 heads, MLP 2816, vocab 32000: 0.17B
parameters) at sequence length 1024, the Llama-style configuration of the GPU benchmark.
"""

from __future__ import annotations

import torch
from torch import nn

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "mlp": 176, "seq": 16, "vocab": 101, "batch": 5}


class LossOf(nn.Module):
    """``LlamaForCausalLM`` whose forward returns the language-modelling loss."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, labels=ids).loss


def model(layers: int = 8, hidden: int = 1024, heads: int = 16, mlp: int = 2816, seq: int = 1024,
          vocab: int = 32000, batch: int = 8, use_cache: bool = False, kv_heads: int | None = None) -> nn.Module:
    """``use_cache`` off: training never reads the generation cache, and with it on every layer
    files its keys and values under its own index, so hapc must trace all layers instead of one.
    ``kv_heads`` below ``heads`` is grouped-query attention (Llama-2 70B: 64 heads, 8 KV heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                         num_key_value_heads=kv_heads or heads, intermediate_size=mlp, max_position_embeddings=seq,
                         vocab_size=vocab, bos_token_id=0, eos_token_id=vocab - 1, pad_token_id=None,
                         loss_type="ForCausalLM", use_cache=use_cache)
    config._attn_implementation = "sdpa"
    return LossOf(LlamaForCausalLM(config))


def inputs(layers: int = 8, hidden: int = 1024, heads: int = 16, mlp: int = 2816, seq: int = 1024,
           vocab: int = 32000, batch: int = 8, **_: object) -> tuple[torch.Tensor]:
    """Token ids from a fixed generator (every rank builds the same batch)."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (batch, seq), generator=gen),)
