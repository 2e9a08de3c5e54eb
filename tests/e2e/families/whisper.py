"""A tiny Hugging Face Whisper (speech encoder-decoder), unmodified: a convolutional front end
over log-mel features, a frozen sinusoidal encoder position table (``requires_grad=False``),
and a decoder input built by ``shift_tokens_right``."""

import torch
import transformers


class LossOnly(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_features=features, labels=labels).loss


def model(d_model: int = 32, layers: int = 1):
    config = transformers.WhisperConfig(vocab_size=101, num_mel_bins=8, d_model=d_model, encoder_layers=layers,
                                        decoder_layers=layers, encoder_attention_heads=4, decoder_attention_heads=4,
                                        encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
                                        max_source_positions=8, max_target_positions=16, dropout=0.0,
                                        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1,
                                        bos_token_id=0, eos_token_id=2, decoder_start_token_id=0,
                                        suppress_tokens=None, begin_suppress_tokens=None)
    return LossOnly(transformers.WhisperForConditionalGeneration(config))


def inputs():
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(6, 8, 16, generator=gen)          # (batch, mel bins, 2 * source positions)
    labels = torch.randint(3, 101, (6, 10), generator=gen)
    labels[:, -3:] = -100
    return features, labels
