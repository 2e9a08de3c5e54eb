"""What one rank computes for an op when running the plain op on its pieces is not enough.

Each function takes a :class:`RankCtx` first, then the op's own arguments with tensors
replaced by this rank's pieces. Functions here depend on torch only: code generation copies
this module into emitted programs, and the in-process executor calls it directly.

Functions that need values from other ranks (a global count, a global max) are generators:
they ``yield Collective(...)`` and receive the result, so the same code runs in lockstep in
one process and with real ``torch.distributed`` collectives in an emitted program.

Local ops that draw random numbers (dropout, attention dropout, ``rand``, ``bernoulli`` ...)
live in :mod:`hapc.runtime.random_ops`, with the counter-based generator they share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
    op: str
    inputs: tuple[ShardInfo | None, ...]     # per tensor argument; None unless Shard
    outputs: tuple[ShardInfo | None, ...]
    out_shapes: tuple[tuple[int, ...], ...]  # global output shapes
    seed: int = 0
    # Random ops (hapc.runtime.random_ops, the other file of local ops) draw from a counter-based
    # hash: any piece equals the slice of the global draw, on any device. False only where one
    # rank draws everything and dropout may run torch's own kernel (random_ops.seeded_rng).
    exact_pieces: bool = True


@dataclass(frozen=True)
class Collective:
    """A request a generator local op yields: reduce ``tensor`` over all ranks."""

    kind: str            # "sum" or "max"
    tensor: torch.Tensor


def rescale_to_global(value: torch.Tensor, length: int, global_length: int) -> torch.Tensor:
    """A mean over this rank's ``length`` of ``global_length`` elements, as its exact share of
    the global mean (a ``Partial`` summand): ``value * length / global_length``.

    An empty piece (``length == 0``, as block coupling or a batch shorter than the device count
    can give) contributes nothing; its local mean is NaN, and NaN times zero is still NaN, so
    it is replaced by zeros that keep the value in the autograd graph (every rank then runs the
    same backward).
    """
    if length == 0:
        return value.nan_to_num(0.0, 0.0, 0.0) * 0.0
    return value * (length / global_length)


def empty_piece_result(inputs: Sequence[Any], shapes: Sequence[Sequence[int]],
                       dtypes: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """What a rank computes for a plain op when its sharded pieces are empty: zeros of its
    local output shapes (empty along a ``Shard`` output, the whole shape for a ``Partial`` one,
    whose summand over no elements is zero).

    Several ops reject empty tensors (a convolution with no output channels, a pool over no
    channels), and every sharded dimension of one strategy is cut into the same blocks, so a
    rank holding an empty piece of one holds empty pieces of all. The zeros are tied to the
    float inputs so that every rank runs the same backward (its gradient hooks fire too).
    """
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    floats = [x for x in tensors if x.is_floating_point()]
    device = tensors[0].device if tensors else None
    tie = sum((x.sum() * 0.0 for x in floats if x.requires_grad), torch.zeros((), device=device))
    out = []
    for shape, dtype in zip(shapes, dtypes):
        kind = getattr(torch, dtype)
        if kind.is_floating_point:      # the precision the program runs in, not the traced one
            kind = floats[0].dtype if floats else kind
            out.append(torch.zeros(tuple(shape), dtype=kind, device=device) + tie.to(kind))
        else:
            out.append(torch.zeros(tuple(shape), dtype=kind, device=device))
    return tuple(out)


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
def vocab_parallel_embedding(ctx: RankCtx, weight: torch.Tensor, ids: torch.Tensor,
                             padding_idx: int = -1, *rest: Any, **kwargs: Any) -> torch.Tensor:
    """Rows of a vocabulary shard; ids owned by other ranks give zeros (output is Partial).
    The rank that owns ``padding_idx`` keeps that row's gradient at zero, as torch does."""
    info = ctx.inputs[0]
    if info.length == 0:      # no rows here (an empty piece): every id is another rank's
        return empty_piece_result([weight, ids], [(*ids.shape, weight.shape[-1])],
                                  [str(weight.dtype).removeprefix("torch.")])[0]
    local = ids - info.offset
    mine = (local >= 0) & (local < info.length)
    padding_idx = kwargs.get("padding_idx", padding_idx)
    local_pad = padding_idx - info.offset if padding_idx is not None and padding_idx >= 0 else -1
    out = torch.nn.functional.embedding(torch.where(mine, local, torch.zeros_like(local)), weight,
                                        padding_idx=local_pad if 0 <= local_pad < info.length else None)
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


@local_op
def arange_local(ctx: RankCtx, *args: Any, **kwargs: Any) -> torch.Tensor:
    """This rank's piece of ``torch.arange(*args)``."""
    info = ctx.outputs[0]
    return torch.arange(*args, **kwargs).narrow(0, info.offset, info.length)


@local_op
def create_local(ctx: RankCtx, size: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """zeros/ones/full with this rank's local size (values do not depend on the rank)."""
    fn = {"aten.zeros.default": torch.zeros, "aten.ones.default": torch.ones,
          "aten.full.default": torch.full}[ctx.op]
    kwargs.pop("memory_format", None)
    return fn(_local_shape(ctx), *args, **kwargs)


@local_op
def linear_sfb(ctx: RankCtx, x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """Data-parallel linear whose weight (and bias) gradient is rebuilt on every rank from
    gathered factors (sufficient factor broadcasting). The forward is plain linear; in one
    process autograd already sums the ranks' contributions, so nothing else is needed here —
    the emitted program swaps in a backward that gathers ``x`` and ``dy``."""
    return torch.nn.functional.linear(x, weight, bias)


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
    classes_here = logits.shape[-1] > 0      # none on a rank with an empty piece
    local_max = logits.detach().amax(dim=-1) if classes_here else logits.new_full(logits.shape[:-1], -float("inf"))
    global_max = yield Collective("max", local_max)
    sum_exp = torch.exp(logits - global_max.unsqueeze(-1)).sum(dim=-1)
    global_sum_exp = yield Collective("sum", sum_exp)
    lse = torch.log(global_sum_exp) + global_max
    valid = target != ignore_index
    local_t = target - info.offset
    mine = (local_t >= 0) & (local_t < info.length) & valid
    if classes_here:
        picked = logits.gather(-1, torch.where(mine, local_t, torch.zeros_like(local_t)).unsqueeze(-1))
        picked = picked.squeeze(-1) * mine.to(logits.dtype)
    else:
        picked = logits.sum(dim=-1)          # zeros, still tied to the logits
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


# --- conv, norm and MoE ops ---

@local_op
def conv_groups_local(ctx: RankCtx, x: torch.Tensor, weight: torch.Tensor, bias=None, stride: Any = 1,
                      padding: Any = 0, dilation: Any = 1, *rest: Any) -> torch.Tensor:
    """A grouped convolution on a piece of whole groups: the group count is this rank's.

    ``rest`` is ``(groups,)`` for conv{n}d or ``(transposed, output_padding, groups)`` for
    ``convolution``; only non-transposed convolutions are sharded by group.
    """
    channel_dim = x.dim() - weight.dim() + 1
    local_groups = x.shape[channel_dim] // weight.shape[1]
    if local_groups == 0:
        return x.new_zeros(_local_shape(ctx))
    if len(rest) == 3:
        return torch.convolution(x, weight, bias, stride, padding, dilation, rest[0], rest[1], local_groups)
    conv = getattr(torch.nn.functional, f"conv{weight.dim() - 2}d")
    return conv(x, weight, bias, stride, padding, dilation, local_groups)


@local_op
def adaptive_avg_pool_local(ctx: RankCtx, x: torch.Tensor, output_size: Any) -> torch.Tensor:
    """Adaptive average pooling of a piece of whole windows: the output size along the sharded
    dimension is this rank's piece of the global output size."""
    size = list(output_size)
    info = ctx.outputs[0]
    size[info.dim - (x.dim() - len(size))] = info.length
    if info.length == 0:      # an empty piece, which the pool rejects: an empty result
        return empty_piece_result([x], [_local_shape(ctx)], [str(x.dtype).removeprefix("torch.")])[0]
    pool = getattr(torch.nn.functional, f"adaptive_avg_pool{len(size)}d")
    return pool(x, size)


@local_op
def batch_norm_sync(ctx: RankCtx, x: torch.Tensor, weight=None, bias=None, running_mean=None,
                    running_var=None, training: bool = True, momentum: float = 0.1, eps: float = 1e-5,
                    cudnn_enabled: bool = False):
    """Batch norm over a piece of a non-channel dimension with the *global* statistics.

    One all-reduce of ``[sum, n*mean^2, M2, n]`` per rank (``M2`` centred on the rank's own
    mean, so float32 keeps its precision) gives the global mean and biased variance exactly,
    whatever the piece sizes. The reduction is differentiable, so autograd back-propagates
    through the statistics as sync batch norm must. Running statistics stay replicated: every
    rank snapshots them before the collective and writes the same update after it, so the
    update happens once even when simulated ranks share one tensor.
    """
    channels = x.shape[1]
    dims = [d for d in range(x.dim()) if d != 1]
    shape = [1, channels] + [1] * (x.dim() - 2)
    acc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    n_local = acc.numel() // channels if channels else 0
    local_sum = acc.sum(dims)
    local_mean = local_sum / max(n_local, 1)
    local_m2 = (acc - local_mean.reshape(shape)).pow(2).sum(dims)
    count = acc.new_full((1,), float(n_local))
    update = training and running_mean is not None
    if update:
        old_mean, old_var = running_mean.detach().clone(), running_var.detach().clone()
    total = yield Collective("sum", torch.cat([local_sum, local_sum * local_mean, local_m2, count]))
    g_sum, g_sq, g_m2, n = total[:channels], total[channels:2 * channels], total[2 * channels:3 * channels], total[-1]
    mean = g_sum / n
    var = ((g_m2 + g_sq - n * mean * mean) / n).clamp_min(0)
    y = (acc - mean.reshape(shape)) * torch.rsqrt(var + eps).reshape(shape)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    if update:
        # Through ``.data``, like torch's own kernel: a side effect autograd does not version.
        unbiased = var.detach() * (n.detach() / (n.detach() - 1)) if n.item() > 1 else var.detach()
        running_mean.data.copy_(old_mean * (1 - momentum) + mean.detach() * momentum)
        running_var.data.copy_(old_var * (1 - momentum) + unbiased * momentum)
    return y.to(x.dtype)


@local_op
def cumsum_scan(ctx: RankCtx, x: torch.Tensor, dim: int, dtype=None):
    """cumsum along a sharded dimension: the local cumsum plus the totals of lower ranks.

    The totals are exchanged with one sum all-reduce of a ``[world, ...]`` tensor in which
    each rank fills its own row (an all-gather that needs only ``sum``); it is
    differentiable, so gradients reach the earlier pieces as the global scan's would.
    """
    info = ctx.inputs[0]
    local = torch.cumsum(x, info.dim, dtype=dtype)
    if local.shape[info.dim]:
        total = local.narrow(info.dim, local.shape[info.dim] - 1, 1)
    else:
        shape = list(local.shape)
        shape[info.dim] = 1
        total = local.new_zeros(shape)
    rows = torch.stack([total if r == ctx.rank else torch.zeros_like(total) for r in range(ctx.world)])
    totals = yield Collective("sum", rows)
    return local + totals[:ctx.rank].sum(0) if ctx.rank else local


@local_op
def one_hot_class_shard(ctx: RankCtx, ids: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """This rank's columns of ``one_hot(ids)``: ids of classes other ranks own give zeros."""
    info = ctx.outputs[0]
    local = ids - info.offset
    mine = (local >= 0) & (local < info.length)
    if info.length == 0:
        return torch.zeros(*ids.shape, 0, dtype=torch.int64, device=ids.device)
    out = torch.nn.functional.one_hot(torch.where(mine, local, torch.zeros_like(local)), info.length)
    return out * mine.unsqueeze(-1)


def _into_piece(ctx: RankCtx, op, x: torch.Tensor, index: torch.Tensor, *rest: Any, **kw: Any):
    """Apply a scatter-like ``op`` to this rank's piece of ``x`` along the scatter dimension.

    Indices other ranks own are sent to a scratch slot appended to the piece and dropped
    afterwards, so every scatter variant (overwrite, add, reduce) keeps its own semantics
    and gradients of foreign source entries are zero here (their owner supplies them).
    """
    info = ctx.inputs[0]
    local = index - info.offset
    mine = (local >= 0) & (local < info.length)
    local = torch.where(mine, local, torch.full_like(local, info.length))
    pad = list(x.shape)
    pad[info.dim] = 1
    out = op(torch.cat([x, x.new_zeros(pad)], info.dim), info.dim, local, *rest, **kw)
    return out.narrow(info.dim, 0, info.length)


@local_op
def scatter_into_piece(ctx: RankCtx, x: torch.Tensor, dim: int, index: torch.Tensor, src: Any) -> torch.Tensor:
    return _into_piece(ctx, torch.scatter, x, index, src)


@local_op
def scatter_add_into_piece(ctx: RankCtx, x: torch.Tensor, dim: int, index: torch.Tensor,
                           src: torch.Tensor) -> torch.Tensor:
    return _into_piece(ctx, torch.scatter_add, x, index, src)


@local_op
def scatter_reduce_into_piece(ctx: RankCtx, x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor,
                              reduce: str, include_self: bool = True) -> torch.Tensor:
    return _into_piece(ctx, torch.scatter_reduce, x, index, src, reduce, include_self=include_self)


@local_op
def index_add_into_piece(ctx: RankCtx, x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor,
                         alpha: Any = 1) -> torch.Tensor:
    return _into_piece(ctx, torch.index_add, x, index, source, alpha=alpha)


def _op_named(name: str):
    """The torch op a node's name says (``transformers.grouped_mm_fallback.default``): a rank
    runs the very kernel the model runs, on its piece."""
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def _expert_rows(ctx: RankCtx, x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Where this rank's experts' rows of a grouped matmul start, and those rows multiplied:
    ``weight`` holds its experts; ``x`` is whole, or already only those rows (an ``ExpertRows``
    input, shorter than the whole)."""
    info = ctx.inputs[1]
    first, count = info.offset, info.length
    rows = ctx.out_shapes[0][0]
    ends = offs.to(torch.int64)
    start = int(ends[first - 1]) if first > 0 else 0
    stop = int(ends[first + count - 1]) if count else start
    if x.shape[0] == rows:
        x = x[start:stop]
    if count == 0:
        return start, x.new_zeros(0, ctx.out_shapes[0][1]) + (x.sum() + weight.sum()) * 0
    return start, _op_named(ctx.op)(x, weight, (offs[first:first + count] - start).to(offs.dtype))


@local_op
def grouped_mm_experts(ctx: RankCtx, x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """A grouped matmul with the experts sharded, as ``ExpertRows``: only the rows routed to
    this rank's experts, multiplied here."""
    return _expert_rows(ctx, x, weight, offs)[1]


@local_op
def grouped_mm_experts_padded(ctx: RankCtx, x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """A grouped matmul with the experts sharded, as a ``Partial``: this rank's experts' rows in
    their places, zeros in the others' (whose owners fill them)."""
    start, mine = _expert_rows(ctx, x, weight, offs)
    after = ctx.out_shapes[0][0] - start - mine.shape[0]
    return torch.cat([mine.new_zeros(start, mine.shape[1]), mine, mine.new_zeros(after, mine.shape[1])])


@local_op
def grouped_mm_rows(ctx: RankCtx, x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """A grouped matmul on this rank's stretch of the expert-sorted rows, every expert whole:
    the experts' offsets shifted to the stretch and clipped to it."""
    info = ctx.inputs[0]
    local = (offs.to(torch.int64) - info.offset).clamp(0, info.length).to(offs.dtype)
    return _op_named(ctx.op)(x, weight, local)


@local_op
def index_expert_rows(ctx: RankCtx, table: torch.Tensor, indices: Any) -> torch.Tensor:
    """``table[ids]`` for the rows of this rank's experts (``table`` holds their rows, ``ids``
    are the routing's sorted expert ids), as ``ExpertRows``."""
    info = ctx.inputs[0]
    ids = indices[0]
    mine = (ids >= info.offset) & (ids < info.offset + info.length)
    return table[ids[mine] - info.offset]
