"""A tiny Hugging Face BART (encoder-decoder), unmodified: ``shift_tokens_right`` builds the
decoder input by writing into a fresh zeros tensor."""

import torch
import transformers


class LossOnly(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=ids, labels=labels).loss


def model(d_model: int = 32, layers: int = 1):
    config = transformers.BartConfig(vocab_size=101, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                                     encoder_attention_heads=4, decoder_attention_heads=4,
                                     encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
                                     max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
                                     activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                     decoder_start_token_id=2, forced_eos_token_id=None)
    return LossOnly(transformers.BartForConditionalGeneration(config))


def inputs():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 101, (6, 12), generator=gen)
    labels = torch.randint(3, 101, (6, 10), generator=gen)
    labels[:, -3:] = -100
    return ids, labels
