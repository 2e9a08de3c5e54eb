"""Tiny Hugging Face mixture-of-experts families, unmodified, whose experts all run through
transformers' grouped matmul: OLMoE, Qwen2-MoE (with a shared expert), GraniteMoE, DeepSeek-V3
(multi-head latent attention, a shared expert, grouped routing) and GPT-OSS (expert biases,
a clamped gated activation). ``model(family)``, ``inputs()``."""

from __future__ import annotations

import torch
import transformers

COMMON = {"vocab_size": 101, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
          "max_position_embeddings": 32, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
NO_AUX = {"router_aux_loss_coef": 0.0, "output_router_logits": False}

FAMILIES = {
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              {"num_key_value_heads": 2, "intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2, **NO_AUX}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  {"num_key_value_heads": 2, "intermediate_size": 64, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
                   "decoder_sparse_step": 1, **NO_AUX}),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM",
                   {"num_key_value_heads": 2, "intermediate_size": 64, "num_local_experts": 4,
                    "num_experts_per_tok": 2, **NO_AUX}),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    {"num_key_value_heads": 4, "intermediate_size": 64, "moe_intermediate_size": 32,
                     "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
                     "first_k_dense_replace": 0, "q_lora_rank": None, "kv_lora_rank": 16, "qk_rope_head_dim": 4,
                     "qk_nope_head_dim": 4, "v_head_dim": 8, "n_shared_experts": 1}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                {"num_key_value_heads": 2, "intermediate_size": 32, "num_local_experts": 4,
                 "num_experts_per_tok": 2, "head_dim": 8, **NO_AUX}),
}


class LossOnly(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=ids, labels=labels).loss


def model(family: str = "olmoe"):
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**COMMON, **extra)
    return LossOnly(getattr(transformers, model_name)(config))


def inputs(family: str = "olmoe"):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 101, (6, 12), generator=gen)
    return ids, ids.clone()
