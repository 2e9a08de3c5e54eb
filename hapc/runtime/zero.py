"""ZeRO in the runtime: owned rows of replicated parameters (ZeRO-1/2), and gathered weights
freed after use (ZeRO-3, :class:`GatheredWeights`).

**Owned rows.** Every rank holds each replicated parameter whole (the forward and backward read it whole), but rank
``r`` owns rows ``[offset[r], offset[r] + lengths[r])`` of its first dimension: only those rows'
gradient is kept after backward and only those rows' optimizer state exists on the rank. The
optimizer is given the owned rows as views of the parameter (:meth:`StateShards.stepped`), so
its update writes straight into the parameter; :meth:`StateShards.share_updates` then
all-gathers every rank's updated rows, and all replicas are equal again.

**The gradient reduce-scatter.** Gradients go bucket by bucket, in the order backward produces
them (hooks, as DDP and :class:`hapc_collectives.GradSync` do), or all at once after the last
micro-batch of an accumulating step. A bucket's buffer is laid out rank-major, padded to the
largest rank's piece, so one equal-piece reduce-scatter hands each rank its rows of every
parameter in the bucket (the rows may be uneven: a device with more memory owns more). The
parameter's whole gradient is freed as soon as its bucket is copied: under ZeRO-2 no rank holds
a whole gradient for longer than a bucket's wait. Backends without reduce-scatter (older gloo)
all-reduce the padded buffer and keep their piece: the same numbers, more traffic.

**Why rows.** A piece of the first dimension is a contiguous view of the parameter and a block
of it at a known offset, the same form as every other piece a plan cuts, so checkpoints store
the optimizer moments as chunks of the parameter's global shape and load them under any plan.

Depends on torch only: code generation copies it beside emitted programs as ``hapc_zero.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

_all_gather_equal = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_equal = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

BUCKET_BYTES = 25 * 2**20
IN_FLIGHT = 2          # buckets reduced at once after an accumulating step (bounds the buffers)


class _Bucket:
    """Parameters synchronised together, and where each rank's rows of them sit in its buffer."""

    def __init__(self, members: list[int], lengths: Sequence[Sequence[int]], row_numel: Sequence[int],
                 world: int) -> None:
        self.members = members
        # sizes[r]: elements of rank r's rows of every member, in member order
        self.sizes = [sum(lengths[i][r] * row_numel[i] for i in members) for r in range(world)]
        self.padded = max(self.sizes)


class StateShards:
    """The gradient synchronisation and the update sharing of ZeRO-1/2 (see the module
    docstring). ``params``: the replicated trainable leaves, in the order their gradients
    become ready; ``lengths[i][r]``: the rows of ``params[i]`` rank ``r`` of ``comm`` owns (every
    rank at least one). ``overlap``: reduce each bucket as soon as backward fills it (one
    backward per step); otherwise :meth:`finish` reduces them all (after accumulating)."""

    def __init__(self, comm: Any, params: Sequence[torch.Tensor], lengths: Sequence[Sequence[int]],
                 *, overlap: bool = True, bucket_bytes: int = BUCKET_BYTES) -> None:
        if len(params) != len(lengths) or any(len(n) != comm.world or min(n) < 1 or sum(n) != p.shape[0]
                                              for p, n in zip(params, lengths)):
            raise ValueError("state shards: every parameter needs one positive row count per rank, "
                             "summing to its first dimension")
        self.comm = comm
        self.params = list(params)
        self.lengths = [list(n) for n in lengths]
        self.offsets = [[sum(n[:r]) for r in range(comm.world)] for n in self.lengths]
        self.row_numel = [p[0].numel() for p in self.params]
        me = getattr(comm, "rank", -1)        # a rank no pipeline stage uses has no group
        # What the optimizer steps: this rank's rows, a view of the parameter (its storage).
        self.shards = [p.detach()[o[me]:o[me] + n[me]] for p, o, n in zip(self.params, self.offsets, self.lengths)]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.buckets: list[_Bucket] = []
        members: list[int] = []
        size = 0
        for i, p in enumerate(self.params):
            if members and size + p.numel() * p.element_size() > bucket_bytes:
                self.buckets.append(_Bucket(members, self.lengths, self.row_numel, comm.world))
                members, size = [], 0
            members.append(i)
            size += p.numel() * p.element_size()
        if members:
            self.buckets.append(_Bucket(members, self.lengths, self.row_numel, comm.world))
        self._bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket.members}
        self._ready = [0] * len(self.buckets)
        self._launched: list[tuple[Any, torch.Tensor, _Bucket, bool]] = []
        self._done = 0
        if overlap:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._on_grad)

    # ---- what the optimizer and the checkpoint see ------------------------------------------
    def stepped(self, leaf: torch.Tensor) -> torch.Tensor:
        """The tensor the optimizer steps for ``leaf``: its owned rows, or ``leaf`` itself when
        the leaf is not sharded here."""
        i = self._index.get(id(leaf))
        return leaf if i is None else self.shards[i]

    def first_row(self, leaf: torch.Tensor) -> int | None:
        """The first row ``leaf``'s owned rows start at (None: not sharded here)."""
        i = self._index.get(id(leaf))
        return None if i is None else self.offsets[i][self.comm.rank]

    # ---- gradients ----------------------------------------------------------------------------
    def _on_grad(self, p: torch.Tensor) -> None:
        b = self._bucket_of[self._index[id(p)]]
        self._ready[b] += 1
        while self._done + len(self._launched) < len(self.buckets):
            nxt = self._done + len(self._launched)
            if self._ready[nxt] < len(self.buckets[nxt].members):
                break
            self._launch(self.buckets[nxt])

    def _launch(self, bucket: _Bucket) -> None:
        """Copy the bucket's gradients rank-major into a padded buffer, free them, and start the
        reduce-scatter (asynchronously)."""
        p_world = self.comm.world
        grads = []
        for i in bucket.members:
            p = self.params[i]
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads.append(torch.split(g.reshape(p.shape[0], -1), self.lengths[i]))
            p.grad = None                   # ZeRO-2: only the owned rows outlive the bucket
        pieces = []
        for r in range(p_world):
            pieces += [split[r].reshape(-1) for split in grads]
            if bucket.sizes[r] < bucket.padded:
                pieces.append(grads[0][0].new_zeros(bucket.padded - bucket.sizes[r]))
        flat = torch.cat(pieces)
        del grads, pieces
        if self.comm.can_reduce_scatter:
            out = flat.new_empty(bucket.padded)
            try:
                work = _reduce_scatter_equal(out, flat, group=self.comm.group, async_op=True)
                self._launched.append((work, out, bucket, True))
                return
            except (RuntimeError, NotImplementedError):
                self.comm.can_reduce_scatter = False
        work = dist.all_reduce(flat, group=self.comm.group, async_op=True)
        self._launched.append((work, flat, bucket, False))

    def _land(self) -> None:
        """Wait for the oldest bucket in flight and give its owned rows their gradients."""
        work, buffer, bucket, scattered = self._launched.pop(0)
        work.wait()
        me = self.comm.rank
        mine = buffer if scattered else buffer[me * bucket.padded:(me + 1) * bucket.padded]
        offset = 0
        for i in bucket.members:
            shard = self.shards[i]
            n = shard.numel()
            shard.grad = mine[offset:offset + n].view_as(shard)
            offset += n
        self._done += 1

    def finish(self) -> None:
        """After backward: reduce the buckets not yet started (a few at a time) and wait for all."""
        while self._done + len(self._launched) < len(self.buckets):
            if len(self._launched) >= IN_FLIGHT:
                self._land()
            self._launch(self.buckets[self._done + len(self._launched)])
        while self._launched:
            self._land()
        self._done = 0
        self._ready = [0] * len(self.buckets)

    def owned_grad(self, leaf: torch.Tensor) -> torch.Tensor:
        """The gradient of ``leaf``'s owned rows (zeros before any backward): gathering every
        rank's (an uneven all-gather of dim 0) gives the whole gradient, for checks."""
        shard = self.shards[self._index[id(leaf)]]
        return shard.grad if shard.grad is not None else torch.zeros_like(shard)

    # ---- parameters ---------------------------------------------------------------------------
    def share_updates(self) -> None:
        """After the optimizer step: every rank's updated rows to every rank (an all-gather per
        bucket), so each parameter is whole and equal everywhere again."""
        if not self.buckets or self.comm.world == 1:
            return
        me = self.comm.rank
        with torch.no_grad():
            for bucket in self.buckets:
                pieces = [self.shards[i].reshape(-1) for i in bucket.members]
                if bucket.sizes[me] < bucket.padded:
                    pieces.append(pieces[0].new_zeros(bucket.padded - bucket.sizes[me]))
                mine = torch.cat(pieces)
                every = mine.new_empty(self.comm.world * bucket.padded)
                _all_gather_equal(every, mine, group=self.comm.group)
                self._scatter_back(bucket, every)

    def _scatter_back(self, bucket: _Bucket, every: torch.Tensor) -> None:
        """Copy the gathered rows of every rank into the bucket's parameters."""
        within = [0] * self.comm.world           # where the next member starts in each rank's piece
        rows_of: dict[int, list[torch.Tensor]] = {i: [] for i in bucket.members}
        for i in bucket.members:
            for r in range(self.comm.world):
                n = self.lengths[i][r] * self.row_numel[i]
                start = r * bucket.padded + within[r]
                rows_of[i].append(every[start:start + n])
                within[r] += n
        for i in bucket.members:
            p = self.params[i]
            p.detach().copy_(torch.cat(rows_of[i]).view_as(p))


# ---- ZeRO-3: a weight gathered for use is not kept for backward ----------------------------------

# How far back from a saved tensor a gathered weight is looked for, and through what: views and
# autocast's dtype cast (one each, in practice: weight.t() of the bf16 copy).
_CHAIN = 4
_VIEWS_AND_CASTS = frozenset({"ToCopyBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0",
                              "ViewBackward0", "UnsafeViewBackward0", "AliasBackward0", "ExpandBackward0"})


class _GatherAgain:
    """What autograd keeps instead of a gathered weight, or of a view or autocast copy of one:
    how to gather the weight again, the dtype it was cast to, and the view's geometry."""

    __slots__ = ("again", "dtype", "size", "stride", "offset")

    def __init__(self, again: Callable[[], torch.Tensor], saved: torch.Tensor) -> None:
        self.again = again
        self.dtype = saved.dtype
        self.size, self.stride, self.offset = saved.size(), saved.stride(), saved.storage_offset()

    def unpack(self) -> torch.Tensor:
        whole = self.again()
        if whole.dtype != self.dtype:
            whole = whole.to(self.dtype)
        return whole.as_strided(self.size, self.stride, self.offset)


class _GatherWeight(torch.autograd.Function):
    """A weight's piece gathered whole (maybe cast first); its gradient reduce-scattered back in
    the piece's own dtype (float32: a low-precision gather does not make a lower-precision sum)."""

    @staticmethod
    def forward(ctx: Any, piece: torch.Tensor, gather: Callable, scatter: Callable) -> torch.Tensor:
        ctx.scatter, ctx.dtype = scatter, piece.dtype
        return gather(piece.detach())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return ctx.scatter(grad.to(ctx.dtype)), None, None


def gather_weight(piece: torch.Tensor, gather: Callable[[torch.Tensor], torch.Tensor],
                  scatter: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``gather(piece)`` (the whole weight, in the dtype ``gather`` casts to), differentiable:
    the gradient goes back through ``scatter`` (a reduce-scatter) in the piece's dtype. Cast
    and gather commute, so a weight that autocast would cast after the gather is cast before it,
    and half the bytes travel."""
    return _GatherWeight.apply(piece, gather, scatter)


class GatheredWeights:
    """ZeRO-3 as FSDP runs it: a weight stored sharded is gathered whole just before a layer uses
    it and freed once forward is done with it, then gathered again when backward needs it.

    Without this, autograd keeps every gathered weight from forward to backward (the layer's
    backward needs the weight to find its input's gradient), so at the end of forward the whole
    model sits on every rank, and ZeRO-3 saves nothing of the parameters' memory. The rank
    registers each parameter it gathers (:meth:`register`); forward runs under :meth:`hooks`,
    autograd's saved-tensor hooks, which keep, in place of a saved gathered weight (or a view of
    it, or autocast's low-precision copy of it), the recipe to gather it again; the piece it is
    gathered from is a parameter every rank keeps anyway. Every rank runs one backward graph in
    one order (SPMD), so the gathers in backward line up across ranks. The values are the same
    bits: a gather concatenates pieces, and the cast is deterministic."""

    def __init__(self) -> None:
        self._again: dict[Any, tuple[Callable[[], torch.Tensor], int]] = {}

    def register(self, gathered: torch.Tensor, again: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``gathered`` (a differentiable all-gather's output) is gathered again by ``again()``."""
        if gathered.grad_fn is not None and gathered.is_contiguous():
            self._again[gathered.grad_fn] = (again, gathered.numel())
        return gathered

    def hooks(self) -> Any:
        """The context forward runs in."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def clear(self) -> None:
        """After backward: forget this step's gathers."""
        self._again.clear()

    def _pack(self, saved: torch.Tensor) -> Any:
        """A gathered weight, or a view or cast of one (a layer saves ``weight.t()``, or under
        autocast a view of its bf16 copy), as the recipe; anything else as itself. The saved
        tensor must lie in a storage of the weight's size, laid out as the weight (a fresh cast
        is), so that the view can be taken again of the re-gathered (and re-cast) weight."""
        node = saved.grad_fn
        for _ in range(_CHAIN):
            if node is None or not self._again:
                return saved
            hit = self._again.get(node)
            if hit is not None:
                again, numel = hit
                if saved.untyped_storage().nbytes() != numel * saved.element_size():
                    return saved
                return _GatherAgain(again, saved)
            if node.name() not in _VIEWS_AND_CASTS:
                return saved
            node = node.next_functions[0][0]
        return saved

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.unpack() if isinstance(packed, _GatherAgain) else packed
