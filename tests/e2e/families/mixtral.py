"""A tiny Hugging Face Mixtral (sparse mixture of experts), unmodified: its expert computation
runs through a ``transformers::`` custom op."""

import torch
import transformers


class LossOnly(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=ids, labels=labels).loss


def model(hidden: int = 32, layers: int = 1):
    config = transformers.MixtralConfig(vocab_size=101, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                        num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=32,
                                        router_aux_loss_coef=0.0, output_router_logits=False,
                                        bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return LossOnly(transformers.MixtralForCausalLM(config))


def inputs():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 101, (6, 12), generator=gen)
    return ids, ids.clone()
