"""Hugging Face model families, unmodified, at tiny configs: one model file for all of them.

``model(family="llama")`` builds ``transformers``' own class for that family from a small
config (hidden 32-64, 1-2 layers, no downloaded weights) wrapped so that ``forward`` returns
the loss, and ``inputs(family="llama")`` gives one batch for it. Both take the same keyword
arguments (design.md section 3), so ``hapc compile configs/models/hf.py`` and the emitted
program rebuild the same model from the plan's ``model_kwargs``. Sizes do not divide by 3
(batch 5, sequence 13 or 16) so that 3-rank tests shard unevenly. Dropout is off so that a
single-device comparison is exact.

The ResNet row is ``transformers``' ``ResNetForImageClassification``, not torchvision's: no
torchvision wheel installs beside the CPU torch 2.13 build this project develops with.

``FAMILIES`` maps each family to its builder and says which engineer's issue owns it:
``"coverage"`` (rules and model coverage) or ``"correct"`` (encoder-decoder inputs, frozen
parameters, custom ops, meta constants; those rows may fail until that work lands).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

VOCAB = 101
BATCH = 5
SEQ = 16
IMAGE = 32


class LossOnly(torch.nn.Module):
    """``forward(*inputs)`` returns ``inner(**named inputs).loss``: the one wrapper a user writes."""

    def __init__(self, inner: torch.nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.inner = inner
        self.names = names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.inner(**dict(zip(self.names, inputs))).loss


class Family(NamedTuple):
    build: Callable[[], torch.nn.Module]
    # "lm": (ids, labels); "image": (pixels, class labels); "speech": (log-mel features, target
    # ids); "audio": (waveform, class labels)
    kind: str
    owner: str = "coverage"


def _tf():
    import transformers

    return transformers


def _gpt2():
    tf = _tf()
    return tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, n_positions=SEQ, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _bert():
    tf = _tf()
    return tf.BertForMaskedLM(tf.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=SEQ, vocab_size=VOCAB, pad_token_id=0,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def _distilbert():
    tf = _tf()
    return tf.DistilBertForMaskedLM(tf.DistilBertConfig(
        n_layers=2, dim=64, n_heads=4, hidden_dim=128, max_position_embeddings=SEQ, vocab_size=VOCAB,
        pad_token_id=0, dropout=0.0, attention_dropout=0.0))


def _llama():
    tf = _tf()
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=112, max_position_embeddings=SEQ, vocab_size=VOCAB, pad_token_id=0))


def _mistral():
    # A window shorter than the sequence, so the sliding-window mask is really built and used.
    tf = _tf()
    return tf.MistralForCausalLM(tf.MistralConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=112, max_position_embeddings=SEQ, vocab_size=VOCAB, pad_token_id=0,
        sliding_window=6))


def _qwen2():
    tf = _tf()
    return tf.Qwen2ForCausalLM(tf.Qwen2Config(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=112, max_position_embeddings=SEQ, vocab_size=VOCAB, pad_token_id=0,
        use_sliding_window=True, sliding_window=6, max_window_layers=1))


def _gpt_neox():
    tf = _tf()
    return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=SEQ, vocab_size=VOCAB, rotary_pct=0.5, pad_token_id=0,
        hidden_dropout=0.0, attention_dropout=0.0))


def _bloom():
    # ALiBi attention: the position bias enters the scores through baddbmm.
    tf = _tf()
    return tf.BloomForCausalLM(tf.BloomConfig(
        n_layer=2, hidden_size=64, n_head=4, vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0,
        pad_token_id=0, bos_token_id=1, eos_token_id=2))


def _vit():
    tf = _tf()
    return tf.ViTForImageClassification(tf.ViTConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        image_size=IMAGE, patch_size=8, num_labels=7, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))


def _swin():
    tf = _tf()
    return tf.SwinForImageClassification(tf.SwinConfig(
        image_size=IMAGE, patch_size=4, embed_dim=32, depths=[2, 1], num_heads=[2, 4], window_size=4,
        num_labels=7, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0))


def _convnext():
    tf = _tf()
    return tf.ConvNextForImageClassification(tf.ConvNextConfig(
        num_stages=2, hidden_sizes=[32, 64], depths=[1, 1], num_labels=7, drop_path_rate=0.0))


def _resnet():
    tf = _tf()
    return tf.ResNetForImageClassification(tf.ResNetConfig(
        embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1], layer_type="basic", num_labels=7))


def _wav2vec2():
    # Raw audio through a convolutional feature encoder; the positional convolution is weight-normed.
    tf = _tf()
    return tf.Wav2Vec2ForSequenceClassification(tf.Wav2Vec2Config(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4, num_labels=7, hidden_dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
        mask_time_prob=0.0, mask_feature_prob=0.0, classifier_proj_size=16))


def _t5():
    tf = _tf()
    return tf.T5ForConditionalGeneration(tf.T5Config(
        num_layers=1, num_decoder_layers=1, d_model=64, d_kv=16, num_heads=4, d_ff=128,
        vocab_size=VOCAB, dropout_rate=0.0, pad_token_id=0, decoder_start_token_id=0))


def _bart():
    tf = _tf()
    return tf.BartForConditionalGeneration(tf.BartConfig(
        encoder_layers=1, decoder_layers=1, d_model=64, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB,
        max_position_embeddings=SEQ, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2))


def _whisper():
    tf = _tf()
    return tf.WhisperForConditionalGeneration(tf.WhisperConfig(
        encoder_layers=1, decoder_layers=1, d_model=64, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB,
        num_mel_bins=8, max_source_positions=SEQ, max_target_positions=SEQ, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1, begin_suppress_tokens=None, suppress_tokens=None))


def _falcon():
    tf = _tf()
    return tf.FalconForCausalLM(tf.FalconConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=VOCAB, multi_query=True,
        new_decoder_architecture=False, parallel_attn=True, bias=False, hidden_dropout=0.0,
        attention_dropout=0.0, pad_token_id=0, bos_token_id=0, eos_token_id=0))


def _mixtral():
    tf = _tf()
    return tf.MixtralForCausalLM(tf.MixtralConfig(
        num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, max_position_embeddings=SEQ, vocab_size=VOCAB, num_local_experts=4,
        num_experts_per_tok=2, pad_token_id=0))


FAMILIES: dict[str, Family] = {
    "gpt2": Family(_gpt2, "lm"),
    "bert": Family(_bert, "lm"),
    "distilbert": Family(_distilbert, "lm"),
    "llama": Family(_llama, "lm"),
    "mistral": Family(_mistral, "lm"),
    "qwen2": Family(_qwen2, "lm"),
    "gpt-neox": Family(_gpt_neox, "lm"),
    "bloom": Family(_bloom, "lm"),
    "vit": Family(_vit, "image"),
    "swin": Family(_swin, "image"),
    "convnext": Family(_convnext, "image"),
    "resnet": Family(_resnet, "image"),
    "wav2vec2": Family(_wav2vec2, "audio"),
    "t5": Family(_t5, "lm", owner="correct"),
    "bart": Family(_bart, "lm", owner="correct"),
    "whisper": Family(_whisper, "speech", owner="correct"),
    "falcon": Family(_falcon, "lm", owner="correct"),
    "mixtral": Family(_mixtral, "lm", owner="correct"),
}
NAMES = {"lm": ("input_ids", "labels"), "image": ("pixel_values", "labels"),
         "speech": ("input_features", "labels"), "audio": ("input_values", "labels")}


def model(family: str = "llama") -> torch.nn.Module:
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    spec = FAMILIES[family]
    return LossOnly(spec.build(), NAMES[spec.kind])


def inputs(family: str = "llama") -> tuple[torch.Tensor, torch.Tensor]:
    """One batch: token ids with labels on ~30% of positions (-100 elsewhere), images with class
    labels, log-mel features with target ids, or a waveform with class labels; drawn from a fixed generator."""
    gen = torch.Generator().manual_seed(0)
    kind = FAMILIES[family].kind
    if kind == "image":
        return torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen), torch.randint(0, 7, (BATCH,), generator=gen)
    if kind == "audio":
        return torch.randn(BATCH, 400, generator=gen), torch.randint(0, 7, (BATCH,), generator=gen)
    # Ids from 3 up: none is a padding, bos or eos token, as in ordinary text.
    labels = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
    if kind == "speech":
        return torch.randn(BATCH, 8, 2 * SEQ, generator=gen), labels
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
    if family in ("t5", "bart"):        # sequence-to-sequence: labels are the target sequence
        return ids, labels
    masked = torch.where(torch.rand(BATCH, SEQ, generator=gen) < 0.3, ids, torch.full_like(ids, -100))
    masked[:, 0] = ids[:, 0]            # at least one labelled position per row
    ids[0, -3:] = 0                     # a padded row: the padding row of the embedding is read
    masked[0, -3:] = -100
    return ids, masked


SMALL: dict = {"family": "llama"}
