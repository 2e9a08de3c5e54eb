"""Training precision: what a plan assumes about dtypes, and the graph as autocast runs it.

A model is traced in float32. Under ``--precision bf16`` (or ``fp16``) the emitted program
keeps float32 master weights and optimizer state and runs its forward under ``torch.autocast(
dtype=torch.bfloat16)`` (``torch.float16``; backward follows the forward's dtypes).
:func:`autocast_graph` rewrites the traced graph's activation dtypes to what autocast produces,
so every later stage prices the program that runs with no precision flag of its own: products
at the bf16 (fp16) peak (the compute model reads a node's output dtype), 2-byte activations,
their collectives and memory, while parameters, their gradients and the gradient all-reduce
stay float32.

fp16 differs from bf16 only in range (largest finite 65504, smallest normal 6e-5): small
activation gradients underflow to zero. The program therefore scales the loss before backward
and unscales the synchronised float32 gradients, skipping a step whose gradients overflowed
(dynamic loss scaling, :data:`LOSS_SCALING`; the runtime is ``hapc/runtime/loss_scale.py``).
``auto`` is not a precision of its own: ``costmodel.precision_choice`` resolves it per cluster.

Which op produces which dtype follows autocast's lists on CUDA (the device the prices matter
for): products and attention run in bf16, numerically sensitive ops (norms, softmax, losses,
sums, exp/log) in float32, and everything else in the promoted dtype of its floating inputs
(``bf16 + fp32 -> fp32``), as eager type promotion does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hapc.ir.graph import Cost, Graph, Node, TensorMeta, Value

PRECISIONS = ("fp32", "bf16", "fp16")
CHOICES = (*PRECISIONS, "auto")          # what --precision accepts
# The autocast dtype (traced dtype name) of each low precision.
LOW_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
# torch.amp.GradScaler's defaults, which the fp16 program's loss scaling follows.
LOSS_SCALING = {"init_scale": 2.0 ** 16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}

# autocast's "lower precision" list (CUDA and CPU agree on these), as traced aten names.
LOWER_PRECISION_OPS = {
    "linear", "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "einsum", "mv", "addmv",
    "conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "prelu", "scaled_dot_product_attention",
}
# autocast's float32 list on CUDA (the ones that occur in training graphs).
FLOAT32_OPS = {
    "layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "rms_norm", "softmax",
    "_softmax", "log_softmax", "_log_softmax", "cross_entropy_loss", "nll_loss", "nll_loss_nd",
    "nll_loss2d", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
    "binary_cross_entropy_with_logits", "sum", "prod", "cumsum", "cumprod", "exp", "expm1", "log",
    "log2", "log10", "log1p", "pow", "rsqrt", "reciprocal", "norm", "logsumexp", "softplus",
}
# Ops whose traced dtype is explicit (a cast): autocast leaves it alone.
_EXPLICIT_DTYPE_OPS = {"_to_copy", "to", "type_as"}


@dataclass(frozen=True)
class Precision:
    """What a plan assumes about numerics; ``plan.json`` records it under ``"precision"``."""

    name: str = "fp32"                  # "fp32", "bf16" or "fp16" (autocast with float32 master weights)
    allow_tf32: bool = False            # float32 products on TF32 units (from the cluster file)
    grad_reduce_dtype: str = "fp32"     # dtype of the gradient all-reduce
    auto: str = ""                      # with --precision auto: why it chose ``name`` ("" otherwise)

    @property
    def autocast_dtype(self) -> str | None:
        """The torch dtype name the forward is autocast to, or None (plain float32)."""
        return LOW_DTYPES.get(self.name)

    @property
    def loss_scaling(self) -> dict[str, float] | None:
        """GradScaler-like dynamic loss scaling settings (fp16 only), else None."""
        return dict(LOSS_SCALING) if self.name == "fp16" else None

    def describe(self) -> str:
        compute = {"bf16": "bf16 autocast, fp32 master weights and optimizer state",
                   "fp16": "fp16 autocast, fp32 master weights and optimizer state, dynamic loss scaling "
                           "(2**16, x2 after 2000 clean steps, x0.5 and the step skipped on inf/nan)"}.get(self.name, "fp32")
        chosen = f"auto chose {self.name} ({self.auto}): " if self.auto else ""
        return (f"{chosen}{compute}; TF32 {'on' if self.allow_tf32 else 'off'} for fp32 products; "
                f"gradients reduced in {self.grad_reduce_dtype}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"precision": self.name, "allow_tf32": self.allow_tf32,
                               "grad_reduce_dtype": self.grad_reduce_dtype}
        if self.auto:
            out["auto"] = self.auto
        if self.loss_scaling is not None:
            out["loss_scaling"] = self.loss_scaling
        return out

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> Precision:
        """A plan written before precision was recorded is float32 with TF32 off."""
        d = d or {}
        return Precision(str(d.get("precision", "fp32")), bool(d.get("allow_tf32", False)),
                         str(d.get("grad_reduce_dtype", "fp32")), str(d.get("auto", "")))


def check_precision(name: Any, *, allow_auto: bool = True) -> str:
    """``name`` if it is a precision hapc plans for (or ``"auto"``, to be resolved against a
    cluster, when ``allow_auto``); else ValueError naming the choices."""
    choices = CHOICES if allow_auto else PRECISIONS
    if name not in choices:
        raise ValueError(f"unknown precision {name!r}; expected one of {', '.join(choices)}")
    return name


def autocast_graph(graph: Graph, precision: str) -> Graph:
    """``graph`` with activation dtypes as autocast to ``precision`` produces them and node
    bytes rescaled to match; float32 (or an unchanged graph) for ``"fp32"``. Parameters,
    buffers and inputs keep their dtypes: autocast casts inside the ops that use them."""
    if precision == "auto":
        raise ValueError("precision 'auto' is resolved against a cluster first (costmodel.precision_choice)")
    check_precision(precision)
    if precision == "fp32":
        return graph
    low = LOW_DTYPES[precision]
    values = dict(graph.values)
    nodes = []
    for node in graph.nodes:
        inputs = [values[r] for r in dict.fromkeys(node.input_refs())]
        before = _touched_bytes(graph.values, node)
        for out in node.outputs:
            old = values[out]
            if old.meta.dtype == "float32":
                dtype = _autocast_dtype(node, inputs, low)
                values[out] = replace(old, meta=TensorMeta(old.meta.shape, dtype))
        after = _touched_bytes(values, node)
        scale = after / before if before else 1.0
        # Autocast casts float32 weights to bf16/fp16 on the way into a product and casts their
        # gradient back: read 4 + write 2 bytes per element each way.
        casts = sum(v.meta.numel * 6.0 for v in inputs
                    if _base(node.op) in LOWER_PRECISION_OPS and v.kind == "param" and v.meta.dtype == "float32")
        c = node.cost
        cost = Cost(c.fwd_flops, c.bwd_flops, c.fwd_bytes * scale + casts,
                    c.bwd_bytes * scale + (casts if c.bwd_bytes else 0.0))
        nodes.append(Node(node.name, node.op, node.args, node.kwargs, node.outputs, cost, node.source,
                          node.mutates))
    return Graph(values, nodes, list(graph.inputs), list(graph.params), list(graph.buffers), graph.output,
                 dict(graph.unsupported), graph.torch_facts)


def _base(op: str) -> str:
    """``"aten.linear.default"`` -> ``"linear"``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 3 else op


def _autocast_dtype(node: Node, inputs: list[Value], low: str) -> str:
    base = _base(node.op)
    if base in LOWER_PRECISION_OPS:
        return low
    if base in FLOAT32_OPS or base in _EXPLICIT_DTYPE_OPS or "dtype" in node.kwargs:
        return "float32"
    # Eager promotion: a 0-dim tensor does not widen a dimensioned one of the same kind.
    floats = [v.meta.dtype for v in inputs if v.meta.is_float and v.meta.shape] or \
        [v.meta.dtype for v in inputs if v.meta.is_float]
    if not floats:
        return "float32"          # created from scratch (zeros, arange as float): float32 by default
    return low if all(d == low for d in floats) else "float32"


def _touched_bytes(values: dict[str, Value], node: Node) -> float:
    ins = sum(values[r].meta.nbytes for r in dict.fromkeys(node.input_refs()))
    return float(ins + sum(values[o].meta.nbytes for o in node.outputs))


__all__ = ["CHOICES", "LOSS_SCALING", "LOW_DTYPES", "PRECISIONS", "Precision", "autocast_graph", "check_precision"]
