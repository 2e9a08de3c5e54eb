"""A zoo of Hugging Face families the tests do not otherwise hold, at tiny configs and with
their default dropout, as one model file (``model(family)``, ``inputs(family)``): mixtures of
experts, state-space models, masked autoencoders, drop paths, contrastive losses, sequence to
sequence, hash-ordered layer tables. ``python -m bench.family_sweep`` compiles each for 3 uneven
CPU ranks and runs the emitted program with ``--verify``.

Sizes do not divide by 3 (batch 5) so that ranks hold uneven pieces.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

BATCH, SEQ, VOCAB, IMAGE = 5, 12, 101, 32
LM = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
      "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
NO_AUX = {"router_aux_loss_coef": 0.0, "output_router_logits": False}


class LossOf(torch.nn.Module):
    """``forward(*inputs)`` returns ``inner(**named inputs).loss``."""

    def __init__(self, inner: torch.nn.Module, names: tuple[str, ...], extra: dict | None = None):
        super().__init__()
        self.inner, self.names, self.extra = inner, names, dict(extra or {})

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.inner(**dict(zip(self.names, inputs)), **self.extra).loss


def _tf():
    import transformers

    return transformers


def _causal(config: str, model: str, **extra) -> Callable[[], torch.nn.Module]:
    def build():
        tf = _tf()
        return LossOf(getattr(tf, model)(getattr(tf, config)(**{**LM, **extra})), ("input_ids", "labels"))
    return build


def _seq2seq(config: str, model: str, **extra) -> Callable[[], torch.nn.Module]:
    def build():
        tf = _tf()
        cfg = getattr(tf, config)(**extra)
        return LossOf(getattr(tf, model)(cfg), ("input_ids", "labels"))
    return build


def _image(config: str, model: str, names=("pixel_values", "labels"), **extra) -> Callable[[], torch.nn.Module]:
    def build():
        tf = _tf()
        return LossOf(getattr(tf, model)(getattr(tf, config)(**extra)), names)
    return build


def _clip():
    tf = _tf()
    config = tf.CLIPConfig(text_config={"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
                                        "num_hidden_layers": 1, "num_attention_heads": 4,
                                        "max_position_embeddings": SEQ},
                           vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                          "num_attention_heads": 4, "image_size": IMAGE, "patch_size": 8},
                           projection_dim=16)
    return LossOf(tf.CLIPModel(config), ("input_ids", "pixel_values"), {"return_loss": True})


ENC_DEC = {"vocab_size": VOCAB, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
           "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
           "decoder_ffn_dim": 64, "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 0,
           "eos_token_id": 1, "decoder_start_token_id": 0}

FAMILIES: dict[str, tuple[Callable[[], torch.nn.Module], str]] = {
    # mixtures of experts (transformers' grouped matmul)
    "qwen3_moe": (_causal("Qwen3MoeConfig", "Qwen3MoeForCausalLM", num_key_value_heads=2, intermediate_size=64,
                          moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                          **NO_AUX), "lm"),
    "olmoe": (_causal("OlmoeConfig", "OlmoeForCausalLM", num_key_value_heads=2, intermediate_size=64, num_experts=4,
                      num_experts_per_tok=2, **NO_AUX), "lm"),
    "granitemoe": (_causal("GraniteMoeConfig", "GraniteMoeForCausalLM", num_key_value_heads=2, intermediate_size=64,
                           num_local_experts=4, num_experts_per_tok=2, **NO_AUX), "lm"),
    "deepseek_v3": (_causal("DeepseekV3Config", "DeepseekV3ForCausalLM", num_key_value_heads=4, intermediate_size=64,
                            moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                            topk_group=1, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16,
                            qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, n_shared_experts=1), "lm"),
    "gpt_oss": (_causal("GptOssConfig", "GptOssForCausalLM", num_key_value_heads=2, intermediate_size=32,
                        num_local_experts=4, num_experts_per_tok=2, head_dim=8, **NO_AUX), "lm"),
    # state space
    "mamba": (_causal("MambaConfig", "MambaForCausalLM", state_size=4, expand=2, conv_kernel=3), "lm"),
    # decoders with their own twists
    "gemma3": (_causal("Gemma3TextConfig", "Gemma3ForCausalLM", num_key_value_heads=2, intermediate_size=64,
                       head_dim=8, sliding_window=4), "lm"),
    "phi3": (_causal("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=2, intermediate_size=64), "lm"),
    "gpt_neox": (_causal("GPTNeoXConfig", "GPTNeoXForCausalLM", intermediate_size=64), "lm"),
    "opt": (_causal("OPTConfig", "OPTForCausalLM", ffn_dim=64, word_embed_proj_dim=32), "lm"),
    "modernbert": (_causal("ModernBertConfig", "ModernBertForMaskedLM", intermediate_size=64,
                           global_attn_every_n_layers=2, local_attention=4), "lm"),
    # sequence to sequence
    "pegasus": (_seq2seq("PegasusConfig", "PegasusForConditionalGeneration", **ENC_DEC), "lm"),
    "marian": (_seq2seq("MarianConfig", "MarianMTModel", **ENC_DEC), "lm"),
    "mt5": (_seq2seq("MT5Config", "MT5ForConditionalGeneration", vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                     num_layers=1, num_heads=4, decoder_start_token_id=0, pad_token_id=0), "lm"),
    # images: masked autoencoder, drop paths, contrastive
    "vit_mae": (_image("ViTMAEConfig", "ViTMAEForPreTraining", names=("pixel_values",), hidden_size=32,
                       num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=IMAGE,
                       patch_size=8, decoder_hidden_size=32, decoder_num_hidden_layers=1,
                       decoder_num_attention_heads=4, decoder_intermediate_size=64), "pixels"),
    "segformer": (_image("SegformerConfig", "SegformerForSemanticSegmentation", num_encoder_blocks=2, depths=[1, 1],
                         sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2],
                         decoder_hidden_size=16, num_labels=3, drop_path_rate=0.1), "segmentation"),
    "convnext": (_image("ConvNextConfig", "ConvNextForImageClassification", num_stages=2, hidden_sizes=[8, 16],
                        depths=[1, 1], num_labels=3, drop_path_rate=0.1), "image"),
    "swin": (_image("SwinConfig", "SwinForImageClassification", image_size=IMAGE, patch_size=4, embed_dim=8,
                    depths=[1, 1], num_heads=[1, 2], window_size=4, num_labels=3, drop_path_rate=0.1), "image"),
    "clip": (_clip, "contrastive"),
    "deit": (_image("DeiTConfig", "DeiTForImageClassification", hidden_size=32, num_hidden_layers=1,
                    num_attention_heads=4, intermediate_size=64, image_size=IMAGE, patch_size=8, num_labels=3),
             "image"),
}


def model(family: str = "olmoe", batch: int = BATCH) -> torch.nn.Module:
    build, _ = FAMILIES[family]
    return build()


def inputs(family: str = "olmoe", batch: int = BATCH) -> tuple[torch.Tensor, ...]:
    """One batch of ``batch`` samples, from a fixed generator (every rank builds the same)."""
    gen = torch.Generator().manual_seed(0)
    kind = FAMILIES[family][1]
    pixels = torch.randn(batch, 3, IMAGE, IMAGE, generator=gen)
    if kind == "lm":
        ids = torch.randint(2, VOCAB, (batch, SEQ), generator=gen)
        return ids, ids.clone()
    if kind == "pixels":
        return (pixels,)
    if kind == "segmentation":
        return pixels, torch.randint(0, 3, (batch, IMAGE, IMAGE), generator=gen)
    if kind == "contrastive":
        return torch.randint(2, VOCAB, (batch, SEQ), generator=gen), pixels
    return pixels, torch.randint(0, 3, (batch,), generator=gen)
