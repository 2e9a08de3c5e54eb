"""A sparse mixture-of-experts decoder: Hugging Face ``MixtralForCausalLM``, unmodified, wrapped
so that ``forward`` returns the loss. Its experts run through transformers' grouped matmul
over expert-sorted tokens, which hapc shards by expert (``hapc/rules/ops_grouped_mm.py``).

Defaults are 4 layers x 1024 hidden, 8 experts of MLP 3584 with 2 routed per token (a quarter
of Mixtral 8x7B's width, 0.37B parameters, 0.1B of them active), at sequence length 1024.
"""

from __future__ import annotations

import torch
from torch import nn

SMALL = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "mlp": 64, "experts": 4, "top_k": 2,
         "seq": 12, "vocab": 101, "batch": 6}


class LossOf(nn.Module):
    """``MixtralForCausalLM`` whose forward returns the language-modelling loss."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, labels=ids).loss


def model(layers: int = 4, hidden: int = 1024, heads: int = 16, kv_heads: int = 4, mlp: int = 3584,
          experts: int = 8, top_k: int = 2, seq: int = 1024, vocab: int = 32000, batch: int = 8) -> nn.Module:
    """The router's auxiliary loss is off: it is a training choice of its own, and with it the
    loss couples the tokens of a batch (micro-batches would change it)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                           num_key_value_heads=kv_heads, intermediate_size=mlp, num_local_experts=experts,
                           num_experts_per_tok=top_k, max_position_embeddings=seq, vocab_size=vocab,
                           router_aux_loss_coef=0.0, output_router_logits=False, use_cache=False,
                           bos_token_id=0, eos_token_id=vocab - 1, pad_token_id=None)
    config._attn_implementation = "sdpa"
    return LossOf(MixtralForCausalLM(config))


def inputs(layers: int = 4, hidden: int = 1024, heads: int = 16, kv_heads: int = 4, mlp: int = 3584,
           experts: int = 8, top_k: int = 2, seq: int = 1024, vocab: int = 32000, batch: int = 8,
           **_: object) -> tuple[torch.Tensor]:
    """Token ids from a fixed generator (every rank builds the same batch)."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (batch, seq), generator=gen),)
