"""What one rank computes for an op when running the plain op on its pieces is not enough.

Each function takes a :class:`RankCtx` first, then the op's own arguments with tensors
replaced by this rank's pieces. Functions here depend on torch only: code generation copies
this module into emitted programs, and the in-process executor calls it directly.

Functions that need values from other ranks (a global count, a global max) are generators:
they ``yield Collective(...)`` and receive the result, so the same code runs in lockstep in
one process and with real ``torch.distributed`` collectives in an emitted program.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

LOCAL_OPS: dict[str, Callable[..., Any]] = {}


def local_op(fn: Callable[..., Any]) -> Callable[..., Any]:
    LOCAL_OPS[fn.__name__] = fn
    return fn


@dataclass(frozen=True)
class ShardInfo:
    """This rank's piece of one sharded dimension."""

    dim: int
    offset: int
    length: int
    global_length: int


@dataclass(frozen=True)
class RankCtx:
    rank: int
    world: int
    node: str
    inputs: tuple[ShardInfo | None, ...]     # per tensor argument; None unless Shard
    outputs: tuple[ShardInfo | None, ...]
    out_shapes: tuple[tuple[int, ...], ...]  # global output shapes
    seed: int = 0


@dataclass(frozen=True)
class Collective:
    """A request a generator local op yields: reduce ``tensor`` over all ranks."""

    kind: str            # "sum" or "max"
    tensor: torch.Tensor


def node_seed(node: str, step_seed: int) -> int:
    """A seed that every rank derives identically for one node in one step."""
    digest = hashlib.sha256(f"{node}:{step_seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _local_shape(ctx: RankCtx, out: int = 0) -> list[int]:
    shape = list(ctx.out_shapes[out])
    info = ctx.outputs[out]
    if info is not None:
        shape[info.dim] = info.length
    return shape


@local_op
def view_local(ctx: RankCtx, x: torch.Tensor, shape: Any, *rest: Any) -> torch.Tensor:
    """view/reshape/_unsafe_view to this rank's piece of the global target shape."""
    return x.reshape(_local_shape(ctx))


@local_op
def expand_local(ctx: RankCtx, x: torch.Tensor, shape: Any, *rest: Any, **kw: Any) -> torch.Tensor:
    return x.expand(_local_shape(ctx))


@local_op
def dropout(ctx: RankCtx, x: torch.Tensor, p: float, train: bool | None = True) -> torch.Tensor:
    """Dropout whose mask is drawn for the *global* tensor from a seed all ranks share, then
    cut to this rank's piece, so a sharded program drops exactly what one device would."""
    if not train or p == 0.0:
        return x
    gen = torch.Generator(device="cpu").manual_seed(node_seed(ctx.node, ctx.seed))
    shape = list(ctx.out_shapes[0])
    keep = torch.rand(shape, generator=gen) >= p
    info = ctx.outputs[0]
    if info is not None:
        keep = keep.narrow(info.dim, info.offset, info.length)
    return x * keep.to(device=x.device, dtype=x.dtype) / (1.0 - p)


@local_op
def vocab_parallel_embedding(ctx: RankCtx, weight: torch.Tensor, ids: torch.Tensor,
                             *rest: Any) -> torch.Tensor:
    """Rows of a vocabulary shard; ids owned by other ranks give zeros (output is Partial)."""
    info = ctx.inputs[0]
    local = ids - info.offset
    mine = (local >= 0) & (local < info.length)
    out = torch.nn.functional.embedding(torch.where(mine, local, torch.zeros_like(local)), weight)
    return out * mine.unsqueeze(-1).to(out.dtype)


@local_op
def sdpa_query_shard(ctx: RankCtx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask=None,
                     dropout_p: float = 0.0, is_causal: bool = False, scale=None, enable_gqa: bool = False):
    """Causal attention for a shard of the queries: query i of this rank is global query
    ``offset + i`` and may attend to keys ``0 .. offset + i`` (torch's top-left causal mask)."""
    if not is_causal:
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask, dropout_p, False, scale=scale, enable_gqa=enable_gqa)
    offset = ctx.inputs[0].offset
    rows = torch.arange(q.shape[-2], device=q.device).unsqueeze(-1) + offset
    cols = torch.arange(k.shape[-2], device=q.device).unsqueeze(0)
    causal = cols <= rows
    if attn_mask is not None:
        causal = causal & attn_mask if attn_mask.dtype == torch.bool else \
            torch.where(causal, attn_mask, torch.tensor(float("-inf"), dtype=q.dtype))
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, causal, dropout_p, False, scale=scale, enable_gqa=enable_gqa)


def _cross_entropy_terms(logits, target, weight, ignore_index, label_smoothing):
    return torch.nn.functional.cross_entropy(
        logits, target, weight=weight, reduction="sum", ignore_index=ignore_index,
        label_smoothing=label_smoothing)


def _global_mean(total, target, weight, ignore_index, dtype):
    """Divide a local sum of loss terms by the global (weighted) count of counted targets."""
    valid = target != ignore_index
    if weight is not None:
        count = (weight[torch.where(valid, target, torch.zeros_like(target))] * valid).sum()
    else:
        count = valid.sum()
    global_count = yield Collective("sum", count.detach().to(dtype))
    return total / global_count


@local_op
def cross_entropy_batch(ctx: RankCtx, logits: torch.Tensor, target: torch.Tensor, weight=None,
                        reduction: int = 1, ignore_index: int = -100, label_smoothing: float = 0.0):
    """Mean cross-entropy over a batch shard. The mean needs the *global* count of counted
    targets (uneven shares, ignored ids, class weights), so the count is summed over ranks."""
    total = _cross_entropy_terms(logits, target, weight, ignore_index, label_smoothing)
    return (yield from _global_mean(total, target, weight, ignore_index, logits.dtype))


@local_op
def nll_loss_batch(ctx: RankCtx, logp: torch.Tensor, target: torch.Tensor, weight=None,
                   reduction: int = 1, ignore_index: int = -100):
    """Mean NLL over a batch shard (see :func:`cross_entropy_batch`)."""
    total = torch.nn.functional.nll_loss(logp, target, weight=weight, reduction="sum",
                                         ignore_index=ignore_index)
    return (yield from _global_mean(total, target, weight, ignore_index, logp.dtype))


@local_op
def vocab_parallel_cross_entropy(ctx: RankCtx, logits: torch.Tensor, target: torch.Tensor,
                                 weight=None, reduction: int = 1, ignore_index: int = -100,
                                 label_smoothing: float = 0.0):
    """Cross-entropy with the class dimension sharded (logits ``[N, C/k]``, targets replicated).

    log-sum-exp is assembled from each rank's max and sum of exponentials; the target logit
    comes from the rank that owns it. Output is Partial for ``sum``/``mean`` (every rank adds
    its share of the terms) — only the owner contributes ``-logit[target]`` and rank 0
    contributes ``logsumexp``.
    """
    info = ctx.inputs[0]
    local_max = logits.detach().amax(dim=-1)
    global_max = yield Collective("max", local_max)
    sum_exp = torch.exp(logits - global_max.unsqueeze(-1)).sum(dim=-1)
    global_sum_exp = yield Collective("sum", sum_exp)
    lse = torch.log(global_sum_exp) + global_max
    valid = target != ignore_index
    local_t = target - info.offset
    mine = (local_t >= 0) & (local_t < info.length) & valid
    picked = logits.gather(-1, torch.where(mine, local_t, torch.zeros_like(local_t)).unsqueeze(-1))
    picked = picked.squeeze(-1) * mine.to(logits.dtype)
    own_lse = lse * valid.to(logits.dtype) if ctx.rank == 0 else torch.zeros_like(lse)
    terms = own_lse - picked
    if reduction == 0:
        return terms
    total = terms.sum()
    if reduction == 2:
        return total
    return total / valid.sum().to(logits.dtype)


# --- view and indexing ops ---


@local_op
def reshape_local(ctx: RankCtx, x: torch.Tensor, *rest: Any, **kw: Any) -> torch.Tensor:
    """A view-like op (flatten, unflatten, squeeze, unsqueeze, view_as) as a reshape to this
    rank's piece of the global result: the op's own size arguments are global, and a piece of
    length 1 on a sharded dimension must not be squeezed away."""
    return x.reshape(_local_shape(ctx))


def _diagonal_shift(ctx: RankCtx, x: torch.Tensor) -> int:
    """How far the diagonal moves on a piece cut from the rows (down) or columns (up)."""
    info = ctx.inputs[0]
    if info is None:
        return 0
    if info.dim == x.dim() - 2:
        return info.offset
    if info.dim == x.dim() - 1:
        return -info.offset
    return 0


@local_op
def tril_local(ctx: RankCtx, x: torch.Tensor, diagonal: int = 0) -> torch.Tensor:
    """tril of a row or column shard: local row i is global row i + offset."""
    return torch.tril(x, diagonal + _diagonal_shift(ctx, x))


@local_op
def triu_local(ctx: RankCtx, x: torch.Tensor, diagonal: int = 0) -> torch.Tensor:
    """triu of a row or column shard (see :func:`tril_local`)."""
    return torch.triu(x, diagonal + _diagonal_shift(ctx, x))
