"""Collectives for emitted programs: uneven pieces over real ``torch.distributed``, each an
autograd Function whose backward is its dual (as :mod:`costmodel.transfers` prices it), so an
emitted program is only a forward program and its backward comes for free.

=================  ============================  ======================================
forward            here                          backward (dual)
=================  ============================  ======================================
S(d) -> R          :func:`all_gather`            reduce-scatter to S(d)
P -> R             :func:`all_reduce`            all-reduce
P -> S(d)          :func:`reduce_scatter`        all-gather
S(i) -> S(j)       :func:`all_to_all`            all-to-all back
R -> S(d)          :func:`shard_slice`           zero padding (a Partial gradient)
S(d) -> P          :func:`shard_to_partial`      slice
R -> P             :func:`replicate_to_partial`  rank 0 keeps, the others get zeros
=================  ============================  ======================================

Pieces are uneven (each rank's length follows its share), which gloo's and NCCL's list
collectives do not accept. The variants, named as the cost model names them: ``padded`` (the
default: pad every piece to the largest, one equal-size collective), ``all_to_all``
(``all_to_all_single`` with split sizes, no padding), ``grouped`` (a broadcast or reduce per
piece) and ``hierarchical`` (inter-node then intra-node for gathers, the mirror image for
reductions). A backend without ``reduce_scatter_tensor`` or ``all_to_all_single`` falls back
to all-reduce or all-gather + slice (same result).

:func:`keep_freed_memory` and :func:`fused_optimizer` are process set-up shared with the
profiler and the DDP reference, so that all three run alike. Depends on torch only: code
generation copies this module beside emitted programs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import groupby
from typing import Any

import torch
import torch.distributed as dist

PADDED, ALL_TO_ALL, GROUPED, HIERARCHICAL = "padded", "all_to_all", "grouped", "hierarchical"

# The cost model's names (and aliases) for each implementation; anything else is "padded".
_METHODS = {
    "auto": PADDED, "ring": PADDED, "tree": PADDED, "padded": PADDED, "padded_ring": PADDED,
    "padded_tree": PADDED, "flat": PADDED, "bruck": PADDED, "pairwise": ALL_TO_ALL,
    "all_to_all": ALL_TO_ALL, "all_to_all_single": ALL_TO_ALL, "split": ALL_TO_ALL,
    "grouped": GROUPED, "grouped_broadcast": GROUPED, "grouped_reduce": GROUPED,
    "hierarchical": HIERARCHICAL,
}


# Equal-piece collectives on one flat buffer; newer torch renamed them (the old names warn).
_all_gather_equal = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_equal = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def method_of(name: str) -> str:
    """The implementation behind a cost-model variant name; unknown names get the default."""
    return _METHODS.get(name, PADDED)


class Comm:
    """The process group a program (or pipeline stage) runs on, and what its collectives learn.

    ``ranks`` are the group's global ranks in order (default: every rank), ``group`` its process
    group (None: the world); ``rank``/``world`` are this rank's index in it and its size. Nodes:
    ``node_sizes`` (the plan's ranks per node, in cluster order), else ``ranks_per_node``, else
    torchrun's ``LOCAL_WORLD_SIZE``; ``HAPC_RANKS_PER_NODE`` overrides all of them. Hierarchical
    forms need the ranks to fill equal nodes node by node, else the flat forms run (same result);
    their subgroups are made only when ``hierarchical`` is set, and collectively: every rank makes
    every group in the same order (a pipeline makes every stage's Comm, :func:`stage_comms`)."""

    def __init__(self, hierarchical: bool = False, ranks_per_node: int | None = None, *,
                 ranks: Sequence[int] | None = None, group: Any = None,
                 node_sizes: Sequence[int] | None = None) -> None:
        me = dist.get_rank()
        ranks = list(range(dist.get_world_size())) if ranks is None else list(ranks)
        self.ranks = ranks
        self.group = group
        self.rank = ranks.index(me) if me in ranks else -1
        self.world = len(ranks)
        self.ranks_per_node = _ranks_per_node(ranks, ranks_per_node, node_sizes)
        k = self.ranks_per_node
        self.can_reduce_scatter = True
        self.can_all_to_all = True
        # Each group: (process group, its global ranks in order, this rank's index in it).
        self.everyone = (group, ranks, self.rank)
        self.node: tuple[Any, list[int], int] | None = None
        self.cross: tuple[Any, list[int], int] | None = None
        if hierarchical and 1 < k < self.world and self.world % k == 0:
            for n in range(self.world // k):
                members = ranks[n * k:(n + 1) * k]
                g = dist.new_group(members)
                if me in members:
                    self.node = (g, members, members.index(me))
            for i in range(k):
                members = ranks[i::k]
                g = dist.new_group(members)
                if me in members:
                    self.cross = (g, members, members.index(me))

    @property
    def hierarchical(self) -> bool:
        return self.node is not None


def _ranks_per_node(ranks: list[int], ranks_per_node: int | None, node_sizes: Sequence[int] | None) -> int:
    """Ranks per node inside a group, or the group's size when its nodes are not equal blocks
    of consecutive members (no hierarchical form then)."""
    forced = int(os.environ.get("HAPC_RANKS_PER_NODE", "0"))
    if forced:
        return forced
    if ranks_per_node:
        return ranks_per_node
    if node_sizes is None:
        return int(os.environ.get("LOCAL_WORLD_SIZE", str(len(ranks))))
    node_of = [n for n, size in enumerate(node_sizes) for _ in range(size)]
    nodes = [node_of[r] for r in ranks]
    blocks = [sum(1 for _ in run) for _, run in groupby(nodes)]
    if len(set(nodes)) != len(blocks) or len(set(blocks)) != 1:
        return len(ranks)         # a node split around other nodes, or nodes of unequal sizes
    return blocks[0]


def stage_comms(stage_ranks: Sequence[Sequence[int]], hierarchical: Sequence[bool],
                node_sizes: Sequence[int]) -> Comm | None:
    """Every stage's process group (and hierarchical subgroups), made on every rank in stage order
    as ``dist.new_group`` requires; this rank's stage's Comm (None for a rank no stage uses)."""
    me = dist.get_rank()
    mine = None
    for ranks, hier in zip(stage_ranks, hierarchical):
        group = dist.new_group(list(ranks)) if len(ranks) < dist.get_world_size() else None
        comm = Comm(hier, ranks=ranks, group=group, node_sizes=node_sizes)
        if me in ranks:
            mine = comm
    return mine


# ---- helpers -----------------------------------------------------------------------------------
def _offsets(lengths: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for n in lengths:
        out.append(acc)
        acc += n
    return out


def _wire(x: torch.Tensor) -> torch.Tensor:
    """Collectives move numbers: booleans travel as bytes."""
    return x.to(torch.uint8) if x.dtype == torch.bool else x


def _rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` with ``dim`` first and contiguous, so pieces are row ranges of one buffer."""
    return _wire(x).movedim(dim, 0).contiguous()


def _unrows(rows: torch.Tensor, dim: int, like: torch.Tensor) -> torch.Tensor:
    out = rows.movedim(0, dim).contiguous()
    return out.to(torch.bool) if like.dtype == torch.bool else out


# ---- uneven gathers and reductions on rows (no autograd) --------------------------------------
def _gather_rows(comm: Comm, rows: torch.Tensor, lengths: Sequence[int], method: str,
                 group: tuple[Any, list[int], int] | None = None) -> torch.Tensor:
    """Concatenate every member's rows (member ``r`` holds ``lengths[r]`` rows)."""
    pg, ranks, me = group or comm.everyone
    p, rest = len(ranks), rows.shape[1:]
    if p == 1:
        return rows
    if method == HIERARCHICAL and group is None and comm.hierarchical:
        return _gather_rows_hierarchical(comm, rows, lengths)
    if method == ALL_TO_ALL and comm.can_all_to_all:
        out = rows.new_empty((sum(lengths), *rest))
        send = rows.repeat(p, *([1] * len(rest))) if rows.numel() else rows.new_empty((0, *rest))
        try:
            dist.all_to_all_single(out, send, output_split_sizes=list(lengths),
                                   input_split_sizes=[lengths[me]] * p, group=pg)
            return out
        except (RuntimeError, NotImplementedError):
            comm.can_all_to_all = False
    if method == GROUPED:
        pieces = []
        for r, n in enumerate(lengths):
            buf = rows if r == me else rows.new_empty((n, *rest))
            if n:
                dist.broadcast(buf, src=ranks[r], group=pg)
            pieces.append(buf)
        return torch.cat(pieces)
    m = max(lengths)
    if m == 0:
        return rows.new_empty((0, *rest))
    if rows.shape[0] < m:
        rows = torch.cat([rows, rows.new_zeros((m - rows.shape[0], *rest))])
    out = rows.new_empty((p * m, *rest))
    _all_gather_equal(out, rows, group=pg)
    if all(n == m for n in lengths):
        return out
    return torch.cat([out[r * m:r * m + n] for r, n in enumerate(lengths)])


def _reduce_scatter_rows(comm: Comm, rows: torch.Tensor, lengths: Sequence[int], method: str,
                         group: tuple[Any, list[int], int] | None = None) -> torch.Tensor:
    """Sum ``rows`` (``sum(lengths)`` of them) over members; return this member's rows."""
    pg, ranks, me = group or comm.everyone
    p, rest = len(ranks), rows.shape[1:]
    if p == 1:
        return rows
    if method == HIERARCHICAL and group is None and comm.hierarchical:
        return _reduce_scatter_rows_hierarchical(comm, rows, lengths)
    offs = _offsets(lengths)
    if method == ALL_TO_ALL and comm.can_all_to_all:
        out = rows.new_empty((p * lengths[me], *rest))
        try:
            dist.all_to_all_single(out, rows, output_split_sizes=[lengths[me]] * p,
                                   input_split_sizes=list(lengths), group=pg)
            return out.view(p, lengths[me], *rest).sum(0)
        except (RuntimeError, NotImplementedError):
            comm.can_all_to_all = False
    if method == GROUPED:
        mine = rows.new_empty((lengths[me], *rest))
        for r, n in enumerate(lengths):
            if n == 0:
                continue
            buf = rows[offs[r]:offs[r] + n].clone()
            dist.reduce(buf, dst=ranks[r], group=pg)
            if r == me:
                mine = buf
        return mine
    m = max(lengths)
    if m == 0:
        return rows.new_empty((0, *rest))
    if comm.can_reduce_scatter:
        if all(n == m for n in lengths):
            padded = rows
        else:
            padded = rows.new_zeros((p * m, *rest))
            for r, (o, n) in enumerate(zip(offs, lengths)):
                padded[r * m:r * m + n] = rows[o:o + n]
        out = rows.new_empty((m, *rest))
        try:
            _reduce_scatter_equal(out, padded, group=pg)
            return out[:lengths[me]]
        except (RuntimeError, NotImplementedError):
            comm.can_reduce_scatter = False
    total = rows.clone()
    dist.all_reduce(total, group=pg)
    return total[offs[me]:offs[me] + lengths[me]]


def _node_major(comm: Comm) -> tuple[int, int, int]:
    """(ranks per node, nodes, this rank's index within its node): nodes are rank blocks."""
    k = comm.ranks_per_node
    return k, comm.world // k, comm.rank % k


def _gather_rows_hierarchical(comm: Comm, rows: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """Inter-node all-gather among ranks with the same local index, then intra-node all-gather
    of those bundles, then the pieces put back in rank order."""
    k, nodes, i = _node_major(comm)
    bundle = _gather_rows(comm, rows, [lengths[n * k + i] for n in range(nodes)], PADDED, comm.cross)
    sizes = [sum(lengths[n * k + j] for n in range(nodes)) for j in range(k)]
    every = _gather_rows(comm, bundle, sizes, PADDED, comm.node)
    split = list(torch.split(every, [lengths[n * k + j] for j in range(k) for n in range(nodes)]))
    return torch.cat([split[j * nodes + n] for n in range(nodes) for j in range(k)])


def _reduce_scatter_rows_hierarchical(comm: Comm, rows: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """Intra-node reduce-scatter of bundles (member j gets the pieces of every node's j-th rank),
    then inter-node reduce-scatter of the bundle: the mirror image of the gather."""
    k, nodes, i = _node_major(comm)
    offs = _offsets(lengths)
    order = [n * k + j for j in range(k) for n in range(nodes)]
    bundled = torch.cat([rows[offs[r]:offs[r] + lengths[r]] for r in order])
    sizes = [sum(lengths[n * k + j] for n in range(nodes)) for j in range(k)]
    bundle = _reduce_scatter_rows(comm, bundled, sizes, PADDED, comm.node)
    return _reduce_scatter_rows(comm, bundle, [lengths[n * k + i] for n in range(nodes)], PADDED, comm.cross)


def _all_reduce_flat(comm: Comm, x: torch.Tensor, method: str) -> torch.Tensor:
    """Sum over ranks (a new tensor). Hierarchical: intra-node reduce-scatter, inter-node
    all-reduce of each share, intra-node all-gather."""
    if comm.world == 1:
        return x.clone()
    if method == HIERARCHICAL and comm.hierarchical:
        flat = _wire(x).reshape(-1)
        k = comm.ranks_per_node
        share = -(-flat.numel() // k)
        padded = torch.cat([flat, flat.new_zeros(share * k - flat.numel())])
        mine = _reduce_scatter_rows(comm, padded, [share] * k, PADDED, comm.node)
        mine = mine.clone()
        dist.all_reduce(mine, group=comm.cross[0])
        whole = _gather_rows(comm, mine, [share] * k, PADDED, comm.node)
        return whole[:flat.numel()].view(x.shape)
    out = _wire(x).clone()
    dist.all_reduce(out, group=comm.group)
    return out


# ---- the layout changes ----------------------------------------------------------------------
def gather(comm: Comm, x: torch.Tensor, dim: int, lengths: Sequence[int], method: str = PADDED) -> torch.Tensor:
    """S(dim) -> R without autograd (also used to assemble full gradients for checks)."""
    return _unrows(_gather_rows(comm, _rows(x, dim), lengths, method), dim, x)


def scatter_sum(comm: Comm, x: torch.Tensor, dim: int, lengths: Sequence[int], method: str = PADDED) -> torch.Tensor:
    """P -> S(dim) without autograd."""
    return _unrows(_reduce_scatter_rows(comm, _rows(x, dim), lengths, method), dim, x)


def _exchange(comm: Comm, x: torch.Tensor, src_dim: int, src_lengths: Sequence[int], dst_dim: int,
              dst_lengths: Sequence[int]) -> torch.Tensor:
    """S(src_dim) -> S(dst_dim) without autograd: rank r sends rank s the part of its piece that
    falls in s's ``dst_dim`` range; one ``all_to_all_single`` over flat buffers."""
    if comm.world == 1:
        return x
    if not comm.can_all_to_all:
        full = gather(comm, x, src_dim, src_lengths)
        return full.narrow(dst_dim, _offsets(dst_lengths)[comm.rank], dst_lengths[comm.rank]).contiguous()
    wire = _wire(x)
    offs = _offsets(dst_lengths)
    send = [wire.narrow(dst_dim, o, n).reshape(-1) for o, n in zip(offs, dst_lengths)]
    shapes = []
    for n in src_lengths:
        shape = list(x.shape)
        shape[src_dim], shape[dst_dim] = n, dst_lengths[comm.rank]
        shapes.append(shape)
    recv_sizes = [int(torch.Size(s).numel()) for s in shapes]
    out = wire.new_empty(sum(recv_sizes))
    try:
        dist.all_to_all_single(out, torch.cat(send) if send else wire.new_empty(0),
                               output_split_sizes=recv_sizes, input_split_sizes=[t.numel() for t in send],
                               group=comm.group)
    except (RuntimeError, NotImplementedError):
        comm.can_all_to_all = False
        return _exchange(comm, x, src_dim, src_lengths, dst_dim, dst_lengths)
    pieces = [t.view(s) for t, s in zip(torch.split(out, recv_sizes), shapes)]
    res = torch.cat(pieces, dim=src_dim)
    return res.to(torch.bool) if x.dtype == torch.bool else res


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, dim, lengths, method):
        ctx.saved = (comm, dim, lengths, method)
        return gather(comm, x, dim, lengths, method)

    @staticmethod
    def backward(ctx, grad):
        comm, dim, lengths, method = ctx.saved
        return scatter_sum(comm, grad, dim, lengths, method), None, None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, dim, lengths, method):
        ctx.saved = (comm, dim, lengths, method)
        return scatter_sum(comm, x, dim, lengths, method)

    @staticmethod
    def backward(ctx, grad):
        comm, dim, lengths, method = ctx.saved
        return gather(comm, grad, dim, lengths, method), None, None, None, None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, method):
        ctx.saved = (comm, method)
        out = _all_reduce_flat(comm, x, method)
        return out.to(torch.bool) if x.dtype == torch.bool else out

    @staticmethod
    def backward(ctx, grad):
        comm, method = ctx.saved
        return _all_reduce_flat(comm, grad.contiguous(), method), None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, src_dim, src_lengths, dst_dim, dst_lengths):
        ctx.saved = (comm, src_dim, src_lengths, dst_dim, dst_lengths)
        return _exchange(comm, x, src_dim, src_lengths, dst_dim, dst_lengths)

    @staticmethod
    def backward(ctx, grad):
        comm, src_dim, src_lengths, dst_dim, dst_lengths = ctx.saved
        return _exchange(comm, grad.contiguous(), dst_dim, dst_lengths, src_dim, src_lengths), \
            None, None, None, None, None


class _LinearSFB(torch.autograd.Function):
    """Data-parallel linear with sufficient factor broadcasting: backward gathers the batch
    pieces of the input and the output gradient and computes the *complete* weight and bias
    gradients on every rank (``batch x (in + out)`` values move instead of ``in x out``), so
    those parameters are left out of the gradient all-reduce."""

    @staticmethod
    def forward(ctx, x, weight, bias, comm, dim, lengths):
        ctx.save_for_backward(x, weight)
        ctx.meta = (comm, dim, lengths, bias is not None)
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        comm, dim, lengths, has_bias = ctx.meta
        dx = dy.matmul(weight)
        x_all = gather(comm, x.contiguous(), dim, lengths, method_of("auto"))
        dy_all = gather(comm, dy.contiguous(), dim, lengths, method_of("auto"))
        x2, dy2 = x_all.reshape(-1, x_all.shape[-1]), dy_all.reshape(-1, dy_all.shape[-1])
        dw = dy2.t().matmul(x2)
        db = dy2.sum(0) if has_bias else None
        return dx, dw, db, None, None, None


def linear_sfb(comm: Comm, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dim: int,
               lengths: Sequence[int]) -> torch.Tensor:
    """``F.linear`` on a batch shard whose weight/bias gradients come out complete (see above)."""
    return _LinearSFB.apply(x, weight, bias, comm, dim % x.dim(), tuple(lengths))


def all_gather(comm: Comm, x: torch.Tensor, dim: int, lengths: Sequence[int], method: str = "auto") -> torch.Tensor:
    """S(dim) -> R; backward reduce-scatters the (Partial) gradient back to S(dim)."""
    return _AllGather.apply(x, comm, dim, tuple(lengths), method_of(method))


def reduce_scatter(comm: Comm, x: torch.Tensor, dim: int, lengths: Sequence[int], method: str = "auto") -> torch.Tensor:
    """P -> S(dim); backward all-gathers the gradient (Replicate, as a Partial value's is)."""
    return _ReduceScatter.apply(x, comm, dim, tuple(lengths), method_of(method))


def all_reduce(comm: Comm, x: torch.Tensor, method: str = "auto") -> torch.Tensor:
    """P -> R (sum over ranks); backward all-reduces the gradient."""
    return _AllReduce.apply(x, comm, method_of(method))


def all_to_all(comm: Comm, x: torch.Tensor, src_dim: int, src_lengths: Sequence[int], dst_dim: int,
               dst_lengths: Sequence[int], method: str = "auto") -> torch.Tensor:
    """S(src_dim) -> S(dst_dim); backward runs the reverse exchange."""
    if src_dim == dst_dim:
        return x
    return _AllToAll.apply(x, comm, src_dim, tuple(src_lengths), dst_dim, tuple(dst_lengths))


def shard_slice(comm: Comm, x: torch.Tensor, dim: int, lengths: Sequence[int]) -> torch.Tensor:
    """R -> S(dim): this rank's piece of its own copy. Autograd's narrow pads the gradient
    with zeros, which is the Partial gradient a Replicate value has."""
    return x.narrow(dim, _offsets(lengths)[comm.rank], lengths[comm.rank]).contiguous()


def shard_to_partial(comm: Comm, x: torch.Tensor, dim: int, lengths: Sequence[int]) -> torch.Tensor:
    """S(dim) -> P: zero padding to the full shape (the sum over ranks is the whole value)."""
    dim = dim % x.dim()
    before, total = _offsets(lengths)[comm.rank], sum(lengths)
    after = [0, 0] * (x.dim() - 1 - dim)
    return torch.nn.functional.pad(x, after + [before, total - before - x.shape[dim]])


def replicate_to_partial(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """R -> P: rank 0 keeps the value and the others hold zeros (the same masking backward)."""
    return x if comm.rank == 0 else x * 0


# ---- what local ops ask for, and gradient synchronisation ------------------------------------
def drive(comm: Comm, gen: Any, keep: list[torch.Tensor] | None = None) -> Any:
    """Run a generator local op, answering each request it yields (``.kind`` "sum" or "max",
    ``.tensor``) with a real all-reduce: differentiable for sums, a constant for maxima.
    Differentiable answers are appended to ``keep``: a local op may use one on some ranks only,
    yet its backward is an all-reduce every rank must join (the caller ties them, :func:`tie`)."""
    if not hasattr(gen, "send"):
        return gen
    answer = None
    while True:
        try:
            request = gen.send(answer)
        except StopIteration as stop:
            return stop.value
        if request.kind == "sum":
            answer = all_reduce(comm, request.tensor)
            if keep is not None and answer.requires_grad:
                keep.append(answer)
        elif request.kind == "max":
            answer = request.tensor.detach().clone()
            if comm.world > 1:
                dist.all_reduce(answer, op=dist.ReduceOp.MAX, group=comm.group)
        else:
            raise ValueError(f"unknown collective request {request.kind!r}")


class _Tie(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loss, *tensors):
        ctx.metas = [(t.shape, t.dtype, t.device) for t in tensors]
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad, *[torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.metas])


def tie(loss: torch.Tensor, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``loss`` unchanged, but with ``tensors`` in its backward graph (with zero gradients), so
    every rank runs the backward collective of each, whether or not its loss used it: autograd
    runs reachable nodes in reverse creation order, so ranks then issue them in one order."""
    return _Tie.apply(loss, *tensors) if tensors else loss


class GradSync:
    """All-reduce of the gradients of replicated parameters (Partial locally), bucketed and
    overlapped with backward as DDP does. ``params`` is in the order gradients become ready; a
    bucket is launched (asynchronously) once its gradients are all in and every earlier bucket
    has been, so all ranks issue the same collectives in one order; :meth:`finish` launches the
    rest and waits. Every backward is synchronised: accumulate over micro-batches only after
    zeroing between steps."""

    def __init__(self, comm: Comm, params: Sequence[torch.Tensor], bucket_bytes: int = 25 * 2**20,
                 first_bucket_bytes: int = 2**20, overlap: bool = True) -> None:
        self.comm = comm
        self.buckets: list[list[torch.Tensor]] = []
        size, cap = 0, first_bucket_bytes
        for p in params:
            if not self.buckets or size + p.numel() * p.element_size() > cap:
                if self.buckets:
                    cap = bucket_bytes
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self._where = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._ready = [0] * len(self.buckets)
        self._launched: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []
        if overlap and comm.world > 1:
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_grad)

    def _on_grad(self, p: torch.Tensor) -> None:
        b = self._where[id(p)]
        self._ready[b] += 1
        while len(self._launched) < len(self.buckets) and \
                self._ready[len(self._launched)] == len(self.buckets[len(self._launched)]):
            self._launch(len(self._launched))

    def _launch(self, b: int) -> None:
        bucket = self.buckets[b]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])
        work = dist.all_reduce(flat, async_op=True, group=self.comm.group)
        self._launched.append((work, flat, bucket))

    def finish(self) -> None:
        if self.comm.world == 1:
            return
        while len(self._launched) < len(self.buckets):
            self._launch(len(self._launched))
        for work, flat, bucket in self._launched:
            work.wait()
            offset = 0
            for p in bucket:
                n = p.numel()
                if p.grad is not None:      # the summed gradient, as a view of the bucket (no copy)
                    p.grad = flat[offset:offset + n].view_as(p)
                offset += n
        self._launched = []
        self._ready = [0] * len(self.buckets)


# ---- host memory -------------------------------------------------------------------------------
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4       # glibc mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the system: by
    default every allocation above its mmap threshold is a fresh ``mmap``, unmapped on free, so
    each large buffer of a training step is faulted in page by page again. ``mallopt`` (no mmap,
    no trimming) avoids that as jemalloc or tcmalloc would; GPU tensors are unaffected. Returns
    whether it took effect (False off glibc, or with ``HAPC_SYSTEM_MALLOC=1`` set)."""
    if os.environ.get("HAPC_SYSTEM_MALLOC") == "1":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def fused_optimizer(cls: type, params: list[torch.Tensor], **options: Any) -> torch.optim.Optimizer:
    """``cls(params, fused=True, **options)`` where this torch has a fused kernel for it, else
    the default (for-each) one: the fused step reads and writes each parameter, gradient and
    moment once per step in cache-sized blocks, and results agree to float rounding."""
    if params and all(p.is_floating_point() for p in params):
        try:
            return cls(params, fused=True, **options)
        except (RuntimeError, TypeError, ValueError):      # no fused kernel here (older torch, device)
            pass
    return cls(params, **options)
