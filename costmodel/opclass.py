"""Op classes and their efficiencies: the one place where "how close to peak" lives.

A roofline needs to know how close to the datasheet peak an op really gets. That depends
mostly on the *kind* of op: a large GEMM reaches 60-80% of tensor-core peak, attention
kernels somewhat less, and elementwise ops never approach peak FLOPs because they are
limited by memory bandwidth. So every aten op maps to one class, and each class has one
efficiency (a fraction of peak FLOPs). The separate ``hbm`` entry is the fraction of the
published memory bandwidth that streaming kernels reach.

The defaults below are typical of well-tuned kernels on recent GPUs; a cluster file can
override any of them (``efficiency: {matmul: 0.55}``) and ``hapc profile`` writes measured
ones there.
"""

from __future__ import annotations

OP_CLASSES = ("matmul", "attention", "conv", "norm", "softmax", "embedding", "loss", "reduction",
              "elementwise", "view")

DEFAULT_EFFICIENCY: dict[str, float] = {
    "matmul": 0.7,
    "attention": 0.5,
    "conv": 0.6,
    "norm": 0.5,
    "softmax": 0.5,
    "embedding": 0.5,
    "loss": 0.5,
    "reduction": 0.5,
    "elementwise": 0.5,
    "hbm": 0.8,          # fraction of the published memory bandwidth, for every class
}

# Op "packets" (the middle part of "aten.<packet>.<overload>") per class; anything not
# listed is elementwise (memory-bound, one flop per element), which is the safe default.
_PACKETS: dict[str, tuple[str, ...]] = {
    "matmul": ("mm", "bmm", "addmm", "matmul", "linear", "einsum", "baddbmm", "addbmm", "addmv", "mv",
               "dot", "vdot", "outer", "tensordot", "_addmm_activation"),
    "attention": ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                  "_flash_attention_forward", "_efficient_attention_forward",
                  "_scaled_dot_product_flash_attention_for_cpu"),
    "conv": ("convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
             "conv_transpose3d", "_convolution", "cudnn_convolution"),
    "norm": ("layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "batch_norm",
             "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
             "instance_norm", "rms_norm", "_fused_rms_norm"),
    "softmax": ("softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"),
    "embedding": ("embedding", "index_select", "gather", "take", "embedding_bag", "_embedding_bag"),
    "loss": ("cross_entropy_loss", "nll_loss", "nll_loss_forward", "nll_loss2d_forward", "mse_loss",
             "l1_loss", "smooth_l1_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
             "kl_div", "huber_loss"),
    "reduction": ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std",
                  "var_mean", "std_mean", "prod", "cumsum", "logsumexp", "norm", "linalg_vector_norm",
                  "all", "any"),
    # Ops that only reinterpret memory: no kernel, no time.
    "view": ("view", "_unsafe_view", "reshape", "transpose", "permute", "t", "unsqueeze", "squeeze",
             "expand", "flatten", "unflatten", "slice", "select", "split", "split_with_sizes", "chunk",
             "unbind", "alias", "detach", "view_as", "narrow", "movedim", "swapaxes", "unsafe_split",
             "expand_as", "as_strided", "_reshape_alias", "lift_fresh_copy"),
}

_CLASS_OF = {packet: cls for cls, packets in _PACKETS.items() for packet in packets}
# Ops of other libraries' namespaces that models trace into, by full name.
_LIBRARY_OPS = {"transformers.grouped_mm_fallback.default": "matmul"}


def op_class(op: str) -> str:
    """Class of an aten op name (``"aten.linear.default"`` -> ``"matmul"``); unknown ops are elementwise."""
    parts = op.split(".")
    packet = parts[1] if len(parts) >= 3 and parts[0] == "aten" else op
    return _CLASS_OF.get(packet, _LIBRARY_OPS.get(op, "elementwise"))


def uses_tensor_cores(cls: str) -> bool:
    """Whether an fp32 op of this class may run as TF32 when the cluster allows it.

    TF32 exists only in the matrix units, so only products (matmul, attention, conv) gain
    from it; elementwise fp32 stays on the fp32 units.
    """
    return cls in ("matmul", "attention", "conv")
