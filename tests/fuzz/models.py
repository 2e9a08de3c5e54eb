"""Random small models and clusters for fuzzing the whole chain (issue 16).

A case is two plain, printable specs: a :class:`ModelSpec` (a stack of blocks drawn from the
op families hapc has rules for, with odd sizes: 1, primes, dims shorter than the device count)
and a :class:`ClusterSpec` (1-9 devices, speeds spread up to 20x, tight or loose memory, one
or several nodes). Specs, not modules, are what hypothesis draws and shrinks, so a failing
case prints as a literal that a regression test can paste (``ModelSpec(...)``).

The hypothesis strategies are :func:`model_specs` and :func:`cluster_specs`. Patterns whose
fixes are still pending on another branch (in-place writes into fresh tensors, frozen
parameters) are drawn only with ``pending=True`` (``FUZZ_PENDING=1`` in the fuzz tests).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

# Sizes users hit and the planner finds awkward: 1, primes, small composites.
ODD_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 11, 12)

# Every block kind, and what it needs: "seq" = a [B, S, H] stream (not [B, H]).
BLOCKS = {
    "linear": (), "act": (), "scale": (), "layernorm": (), "rmsnorm": (), "softmax": (),
    "mlp_residual": (), "twice": (), "reduce": (), "merge": ("seq",), "attention": ("seq",),
    "conv": ("seq",), "matmul": ("seq",),
}
# Blocks whose correctness waits on the `correct` branch (in-place writes into fresh tensors).
PENDING_BLOCKS = {"inplace_slice": (), "inplace_mask": (), "inplace_index": ()}
ACTS = ("gelu", "relu", "tanh", "silu", "sigmoid")
REDUCTIONS = ("center", "seq_mean", "amax", "sum_scale")
HEADS = ("ce", "ce_tied", "mse", "mean_sq")
# Loss heads for the micro-batching fuzz only (the whole-chain corpus keeps HEADS): a mean over
# counted targets (labels with ignored ids), a summed cross-entropy, and a contrastive loss that
# couples every sample with every other.
MICRO_HEADS = ("ce_masked", "ce_sum", "contrastive")
CLASS_HEADS = ("ce", "ce_masked", "ce_sum")


def pending_enabled() -> bool:
    """``FUZZ_PENDING=1`` adds the patterns whose fixes are pending to the default strategies."""
    return os.environ.get("FUZZ_PENDING", "") not in ("", "0")


@dataclass(frozen=True)
class Block:
    kind: str
    size: int = 0          # new width (linear, mlp hidden), heads (attention), kernel (conv)
    variant: str = ""      # activation / reduction name
    frozen: bool = False   # its parameters take no gradient (pending)


@dataclass(frozen=True)
class ModelSpec:
    batch: int
    hidden: int
    seq: int = 0              # 0: a [B, H] stream; else [B, S, H]
    tokens: bool = False      # input is token ids through an embedding of ``vocab`` rows
    vocab: int = 5
    blocks: tuple[Block, ...] = ()
    head: str = "mean_sq"
    seed: int = 0

    def build(self) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        """The model (deterministic weights from ``seed``) and one global batch."""
        torch.manual_seed(self.seed)
        model = FuzzModel(self)
        gen = torch.Generator().manual_seed(self.seed + 1)
        lead = (self.batch, self.seq) if self.seq else (self.batch,)
        if self.tokens:
            x = torch.randint(0, self.vocab, lead, generator=gen)
        else:
            x = torch.randn(*lead, self.hidden, generator=gen)
        if self.head in ("ce", "ce_tied", "ce_masked", "ce_sum"):
            y = torch.randint(0, self.vocab, lead, generator=gen)
            if self.head == "ce_masked":        # about half the labels ignored, unevenly over the batch
                y = y.masked_fill(torch.rand(lead, generator=gen) < torch.linspace(0.9, 0.1, self.batch).view(
                    -1, *([1] * (len(lead) - 1))), -100)
        elif self.head == "mse":
            y = torch.randn(*lead, model.width, generator=gen)
        else:
            return model, (x,)
        return model, (x, y)


class FuzzModel(nn.Module):
    """The module a :class:`ModelSpec` describes; ``forward`` returns the scalar loss."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        width = spec.hidden
        if spec.tokens:
            self.embed = nn.Embedding(spec.vocab, width)
        self.layers = nn.ModuleList()
        for block in spec.blocks:
            layer, width = _make_layer(block, width, spec)
            self.layers.append(layer)
            if block.frozen:
                for p in layer.parameters():
                    p.requires_grad_(False)
        self.width = width
        if spec.head in CLASS_HEADS:
            self.out = nn.Linear(width, spec.vocab)
        elif spec.head == "ce_tied":
            self.proj = nn.Linear(width, spec.hidden)      # back to the embedding's width

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        spec = self.spec
        h = self.embed(x) if spec.tokens else x
        for block, layer in zip(spec.blocks, self.layers):
            h = _apply(block, layer, h, spec)
        if spec.head in CLASS_HEADS:
            logits = self.out(h)
            return F.cross_entropy(logits.reshape(-1, spec.vocab), y.reshape(-1),
                                   reduction="sum" if spec.head == "ce_sum" else "mean")
        if spec.head == "contrastive":
            pooled = h.reshape(h.shape[0], -1)
            return F.cross_entropy(pooled @ pooled.T, torch.arange(h.shape[0]))
        if spec.head == "ce_tied":
            logits = F.linear(self.proj(h), self.embed.weight)      # the tied weight, used twice
            return F.cross_entropy(logits.reshape(-1, spec.vocab), y.reshape(-1))
        if spec.head == "mse":
            return F.mse_loss(h, y)
        return (h * h).mean()


class _Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)


class _Pair(nn.Module):
    def __init__(self, a: nn.Module, b: nn.Module) -> None:
        super().__init__()
        self.a, self.b = a, b


class _Scale(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width) * 0.5 + 1)
        self.bias = nn.Parameter(torch.randn(width) * 0.1)


def _make_layer(block: Block, width: int, spec: ModelSpec) -> tuple[nn.Module, int]:
    k = block.kind
    if k == "linear":
        return nn.Linear(width, block.size), block.size
    if k in ("mlp_residual",):
        return _Pair(nn.Linear(width, block.size), nn.Linear(block.size, width)), width
    if k == "twice":
        return nn.Linear(width, width), width
    if k == "scale":
        return _Scale(width), width
    if k == "layernorm":
        return nn.LayerNorm(width), width
    if k == "rmsnorm":
        return nn.RMSNorm(width), width
    if k == "attention":
        return _Attention(width, block.size), width
    if k == "conv":
        return nn.Conv1d(width, width, block.size, padding=block.size // 2), width
    if k == "merge":
        return nn.Linear(width, block.size), block.size
    if k in ("inplace_slice", "inplace_mask", "inplace_index"):
        return nn.Linear(width, width), width + (1 if k == "inplace_slice" else 0)
    return nn.Identity(), width


def _apply(block: Block, layer: nn.Module, h: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    k = block.kind
    if k in ("linear", "twice"):
        h = layer(h)
        return layer(torch.tanh(h)) if k == "twice" else h          # one parameter, two uses
    if k == "act":
        return getattr(F, block.variant)(h)
    if k == "scale":
        return h * layer.weight + layer.bias                        # broadcasting over batch/seq
    if k in ("layernorm", "rmsnorm"):
        return layer(h)
    if k == "softmax":
        return torch.softmax(h, dim=-1)
    if k == "mlp_residual":
        return h + layer.b(F.gelu(layer.a(h)))
    if k == "reduce":
        if block.variant == "center":
            return h - h.mean(dim=-1, keepdim=True)
        if block.variant == "seq_mean":
            return h + h.mean(dim=1, keepdim=True)
        if block.variant == "amax":
            return h * torch.sigmoid(h.amax(dim=-1, keepdim=True))
        return h * h.sum(dim=0, keepdim=True) * 0.1
    if k == "merge":        # [B, S, H] -> [B*S, H] -> linear -> [B, S, H']: merges sharded dims
        b, s, w = h.shape
        return layer(h.reshape(b * s, w)).reshape(b, s, -1)
    if k == "attention":    # split heads, sdpa, merge heads back: views over sharded dims
        b, s, w = h.shape
        heads = layer.heads
        q, kk, v = layer.qkv(h).split(w, dim=-1)
        q, kk, v = (t.reshape(b, s, heads, w // heads).transpose(1, 2) for t in (q, kk, v))
        o = F.scaled_dot_product_attention(q, kk, v, is_causal=block.variant == "causal")
        return h + layer.proj(o.transpose(1, 2).reshape(b, s, w))
    if k == "conv":         # over the sequence: [B, S, H] -> [B, H, S] -> conv1d -> back
        out = layer(h.transpose(1, 2))
        return out[..., :h.shape[1]].transpose(1, 2)
    if k == "matmul":       # activation times activation
        scores = torch.matmul(h, h.transpose(-1, -2)) / math.sqrt(h.shape[-1])
        return torch.matmul(torch.softmax(scores, dim=-1), h)
    if k == "inplace_slice":        # pending: slice assignment into a fresh tensor
        out = h.new_zeros(*h.shape[:-1], h.shape[-1] + 1)
        out[..., 1:] = layer(h)
        return out
    if k == "inplace_mask":         # pending: masked_fill_ on a fresh tensor
        out = layer(h)
        out = out.clone()
        out.masked_fill_(h > 0.5, 0.0)
        return out
    if k == "inplace_index":        # pending: index_put_ into new_zeros
        out = h.new_zeros(h.shape)
        idx = torch.arange(h.shape[0] - 1, -1, -1)
        out.index_put_((idx,), layer(h))
        return out
    raise ValueError(f"unknown block {k}")


@st.composite
def blocks(draw, seq: bool, hidden: int, pending: bool) -> Block:
    kinds = {**BLOCKS, **(PENDING_BLOCKS if pending else {})}
    allowed = sorted(k for k, needs in kinds.items() if seq or "seq" not in needs)
    kind = draw(st.sampled_from(allowed))
    frozen = pending and draw(st.booleans())
    if kind in ("linear", "mlp_residual", "merge"):
        return Block(kind, size=draw(st.sampled_from(ODD_SIZES)), frozen=frozen)
    if kind == "act":
        return Block(kind, variant=draw(st.sampled_from(ACTS)))
    if kind == "reduce":
        return Block(kind, variant=draw(st.sampled_from(REDUCTIONS if seq else ("center", "amax", "sum_scale"))))
    if kind == "attention":
        return Block(kind, size=draw(st.sampled_from([d for d in range(1, hidden + 1) if hidden % d == 0])),
                     variant=draw(st.sampled_from(("", "causal"))), frozen=frozen)
    if kind == "conv":
        return Block(kind, size=draw(st.sampled_from((1, 2, 3))), frozen=frozen)
    return Block(kind, frozen=frozen and kind in ("twice", "scale", "layernorm", "rmsnorm"))


@st.composite
def model_specs(draw, max_blocks: int = 4, pending: bool | None = None,
                extra_heads: tuple[str, ...] = ()) -> ModelSpec:
    """A random small model: sizes from :data:`ODD_SIZES`, 0-``max_blocks`` blocks, a loss head
    (of :data:`HEADS`, and ``extra_heads``)."""
    pending = pending_enabled() if pending is None else pending
    seq = draw(st.sampled_from((0, 1, 2, 3, 5, 7)))
    hidden = draw(st.sampled_from(ODD_SIZES))
    tokens = draw(st.booleans())
    head = draw(st.sampled_from((HEADS if tokens else HEADS[:1] + HEADS[2:]) + extra_heads))
    n = draw(st.integers(0, max_blocks))
    width_blocks = []
    width = hidden
    for _ in range(n):
        b = draw(blocks(bool(seq), width, pending))
        if b.kind == "attention" and width % b.size:
            b = Block("act", variant="gelu")
        width_blocks.append(b)
        if b.kind in ("linear", "merge"):
            width = b.size
        elif b.kind == "inplace_slice":
            width += 1
    param_blocks = {"linear", "mlp_residual", "merge", "twice", "scale", "layernorm", "rmsnorm", "attention",
                    "conv", "inplace_slice", "inplace_mask", "inplace_index"}
    if not tokens and head not in CLASS_HEADS and not any(b.kind in param_blocks and not b.frozen for b in width_blocks):
        width_blocks.append(Block("scale"))      # a training program needs something to train
    return ModelSpec(batch=draw(st.sampled_from(ODD_SIZES[:8])), hidden=hidden, seq=seq, tokens=tokens,
                     vocab=draw(st.sampled_from((2, 3, 5, 7, 11))), blocks=tuple(width_blocks), head=head,
                     seed=draw(st.integers(0, 3)))


# ---- clusters -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ClusterSpec:
    """Devices as (speed factor, memory factor); nodes as consecutive device counts.

    ``memory`` is relative to what the model needs replicated on one device (the dp-even
    plan's peak): below 1 is tight (sharding must save memory, or nothing fits), above is loose.
    """

    speeds: tuple[float, ...]
    memory: tuple[float, ...]
    nodes: tuple[int, ...] = ()
    network_Gbps: float = 25.0
    intra_GBps: float = 50.0

    @property
    def world(self) -> int:
        return len(self.speeds)

    def to_dict(self, model_bytes: float) -> dict:
        sizes = self.nodes or (self.world,)
        assert sum(sizes) == self.world, (sizes, self.world)
        nodes, i = [], 0
        for size in sizes:
            devs = [{"name": f"d{j}", "tflops": round(0.05 * self.speeds[j], 6),
                     "memory_GB": max(model_bytes * self.memory[j] / 1e9, 1e-12),
                     "hbm_GBps": round(5 * self.speeds[j], 6), "count": 1} for j in range(i, i + size)]
            nodes.append({"devices": devs, "intra_link": {"bandwidth_GBps": self.intra_GBps, "latency_us": 5}})
            i += size
        out: dict = {"name": "fuzz", "nodes": nodes}
        if len(sizes) > 1:
            out["network"] = {"bandwidth_Gbps": self.network_Gbps, "latency_us": 30}
        return out


@st.composite
def cluster_specs(draw, max_devices: int = 9) -> ClusterSpec:
    world = draw(st.integers(1, max_devices))
    spread = draw(st.sampled_from((1.0, 2.0, 5.0, 20.0)))
    speeds = tuple(draw(st.sampled_from((1.0, spread, math.sqrt(spread), 1.0 + spread / 3))) for _ in range(world))
    loose = draw(st.booleans())
    memory = tuple(draw(st.sampled_from((4.0, 1.5) if loose else (0.3, 0.6, 1.0, 2.0))) for _ in range(world))
    cuts = sorted(draw(st.sets(st.integers(1, world - 1), max_size=2))) if world > 1 else []
    nodes = tuple(b - a for a, b in zip([0] + cuts, cuts + [world]))
    return ClusterSpec(speeds, memory, nodes if len(nodes) > 1 else (),
                       network_Gbps=draw(st.sampled_from((1.0, 25.0, 200.0))),
                       intra_GBps=draw(st.sampled_from((5.0, 50.0, 300.0))))
