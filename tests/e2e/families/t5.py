"""A tiny Hugging Face T5 (encoder-decoder), unmodified: the decoder input is built by
``shift_tokens_right``, which writes into a fresh zeros tensor (slice assignment, a scalar
fill and ``masked_fill_``)."""

import torch
import transformers


class LossOnly(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=ids, labels=labels).loss


def model(d_model: int = 32, layers: int = 1):
    config = transformers.T5Config(vocab_size=101, d_model=d_model, d_kv=8, d_ff=2 * d_model, num_layers=layers,
                                   num_decoder_layers=layers, num_heads=4, dropout_rate=0.0,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return LossOnly(transformers.T5ForConditionalGeneration(config))


def inputs():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 101, (6, 12), generator=gen)
    labels = torch.randint(2, 101, (6, 10), generator=gen)
    labels[:, -3:] = -100          # padding the loss ignores; the shift must turn it into pad ids
    return ids, labels
