"""A tiny Hugging Face Falcon (multi-query attention), unmodified: the shared key and value
are picked out of the fused projection with a Python list index (``fused_qkv[..., [-2], :]``),
which the trace lifts into a tensor constant."""

import torch
import transformers


class LossOnly(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=ids, labels=labels).loss


def model(hidden: int = 32, layers: int = 1):
    config = transformers.FalconConfig(vocab_size=101, hidden_size=hidden, num_hidden_layers=layers,
                                       num_attention_heads=4, multi_query=True, new_decoder_architecture=False,
                                       parallel_attn=True, bias=False, hidden_dropout=0.0, attention_dropout=0.0,
                                       bos_token_id=0, eos_token_id=0, max_position_embeddings=32)
    return LossOnly(transformers.FalconForCausalLM(config))


def inputs():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 101, (6, 12), generator=gen)
    return ids, ids.clone()
