"""A tiny Hugging Face Qwen3-MoE, unmodified. Its experts pick ``histc``'s input dtype by
``device.type`` (integers on GPUs; the CPU kernel has none): traced on the meta device, the
program ran the GPU branch on CPU ranks and crashed at its first step (issue 24)."""

import torch
import transformers


class LossOnly(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=ids, labels=labels).loss


def model(hidden: int = 32, layers: int = 1):
    config = transformers.Qwen3MoeConfig(vocab_size=101, hidden_size=hidden, intermediate_size=2 * hidden,
                                         moe_intermediate_size=hidden, num_hidden_layers=layers,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                         num_experts=4, num_experts_per_tok=2, max_position_embeddings=32,
                                         router_aux_loss_coef=0.0, output_router_logits=False,
                                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return LossOnly(transformers.Qwen3MoeForCausalLM(config))


def inputs():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 101, (6, 12), generator=gen)
    return ids, ids.clone()
