"""Random numbers that every rank draws for its own piece: a counter-based generator.

Element i of a random node's global tensor is a function of (node, step seed, i) alone: a
32-bit avalanche hash of its row-major position, keyed by the node's name and the step. Any rank
can draw any piece on its own device, in the time of that piece, and the piece is exactly the
slice of the global draw whatever the shares; ``--verify``'s one-device reference replays the
global draw (dropout through ``F.dropout``, every other op through :class:`ReplayDraws`). The
hash is integer arithmetic, so CPU and CUDA (of any model) draw identical bits, which neither
torch's CPU Mersenne twister nor its CUDA Philox (whose element order follows the launch grid,
i.e. the GPU's SM count) guarantees.

From the bits: a uniform keeps as many top bits as its dtype's mantissa holds (exact, in
[0, 1)); randint scales bits with integer arithmetic; Bernoulli and dropout compare bits with p.
Normals (Box-Muller over two streams) and exponentials (-log(u)/lambda) are computed in float64
and rounded to their dtype: the integer part is identical everywhere, and libm's log and cos,
which may differ by an ulp of float64 between CPU and CUDA, are all but always hidden by the
rounding to float32. ``randperm`` and ``multinomial`` are not elementwise: every rank draws them
whole (their rules give a replicated output, which the planner slices where it wants pieces).

Functions here depend on torch only: code generation copies this module beside emitted programs
(``hapc_random_ops.py``) and the in-process executor calls it directly. Its local ops take the
:class:`hapc.runtime.local_ops.RankCtx` and its ``ShardInfo`` pieces by attribute, so the two
runtime files need not import each other.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

LOCAL_OPS: dict[str, Callable[..., Any]] = {}


def local_op(fn: Callable[..., Any]) -> Callable[..., Any]:
    LOCAL_OPS[fn.__name__] = fn
    return fn


# ---- the counter-based generator ----------------------------------------------------------------

# Multipliers stay below 2**31 so a 32-bit value times one fits in int64 on every backend.
_LOW32 = 0xFFFFFFFF
_MIX_MULTIPLIERS = (0x7FEB352D, 0x27D4EB2D)


def node_seed(node: str, step_seed: int) -> int:
    """A seed that every rank derives identically for one node in one step."""
    digest = hashlib.sha256(f"{node}:{step_seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche hash (xorshift-multiply rounds) of int64 tensor ``x``, in place."""
    for mult, shift in zip(_MIX_MULTIPLIERS, (16, 15)):
        x.bitwise_xor_(x >> shift).mul_(mult).bitwise_and_(_LOW32)
    return x.bitwise_xor_(x >> 16)


def global_indices(shape: Sequence[int], piece: Any = None,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """Row-major positions in the global tensor of ``shape`` of every element of ``piece`` (a
    ``ShardInfo``: its slice along ``piece.dim``; a tuple of them: a box cut along several dims;
    the whole tensor when None), as int64."""
    shape = [int(s) for s in shape]
    if piece is None or not shape:
        return torch.arange(math.prod(shape), device=device, dtype=torch.int64).reshape(shape)
    if isinstance(piece, tuple):
        return _box_indices(shape, piece, device)
    d = piece.dim
    outer, length, inner = math.prod(shape[:d]), piece.length, math.prod(shape[d + 1:])
    rows = torch.arange(outer, device=device, dtype=torch.int64).mul_(shape[d] * inner).view(-1, 1, 1)
    mid = torch.arange(piece.offset, piece.offset + length, device=device, dtype=torch.int64).mul_(inner)
    cols = torch.arange(inner, device=device, dtype=torch.int64)
    local = shape[:d] + [length] + shape[d + 1:]
    return (rows + mid.view(1, -1, 1) + cols.view(1, 1, -1)).reshape(local)


def _box_indices(shape: list[int], pieces: tuple, device: torch.device | str | None) -> torch.Tensor:
    cut = {p.dim: (p.offset, p.length) for p in pieces}
    index = torch.zeros([cut.get(d, (0, n))[1] for d, n in enumerate(shape)], dtype=torch.int64, device=device)
    stride = 1
    for d in reversed(range(len(shape))):
        offset, length = cut.get(d, (0, shape[d]))
        index += torch.arange(offset, offset + length, device=device, dtype=torch.int64).mul_(stride).view(
            [-1 if k == d else 1 for k in range(len(shape))])
        stride *= shape[d]
    return index


def along(piece: Any, dim: int) -> Any:
    """The part of ``piece`` (a ShardInfo, a box of them, or None) that cuts ``dim``, or None."""
    for p in piece if isinstance(piece, tuple) else (piece,):
        if p is not None and p.dim == dim:
            return p
    return None


def micro_batch_view(shape: Sequence[int], piece: Any, dim: int, index: int, count: int,
                     piece_type: Callable[..., Any]) -> tuple[tuple[int, ...], Any]:
    """A pipeline's micro-batch ``index`` of ``count`` as a piece of the whole batch: the global
    ``shape`` with its batch ``dim`` ``count`` times longer, and ``piece`` (this rank's, in the
    micro-batch) moved to the micro-batch's rows, so a micro-batch draws exactly the rows of
    the whole batch's draw (what ``--verify``'s one-device reference replays). ``piece_type``
    makes the moved piece: the local ops' ShardInfo (dim, offset, length, global length)."""
    rows = int(shape[dim])
    whole = tuple(int(s) * (count if d == dim else 1) for d, s in enumerate(shape))
    on_dim = along(piece, dim)
    offset, length = (on_dim.offset, on_dim.length) if on_dim is not None else (0, rows)
    moved = piece_type(dim, index * rows + offset, length, whole[dim])
    others = tuple(p for p in (piece if isinstance(piece, tuple) else (piece,)) if p is not None and p.dim != dim)
    return whole, (moved, *others) if others else moved


def hashed_bits(node: str, step_seed: int, shape: Sequence[int], piece: Any = None,
                device: torch.device | str | None = None, stream: int = 0) -> torch.Tensor:
    """32 random bits (int64 in ``[0, 2**32)``) per element of ``piece`` of the global tensor of
    ``shape`` drawn by ``node`` in the step seeded ``step_seed``. ``stream`` k > 0 gives another,
    independent draw for the same elements (a normal takes two uniforms)."""
    key = node_seed(node if stream == 0 else f"{node}#{stream}", step_seed)
    index = global_indices(shape, piece, device)
    h = _mix32(index.bitwise_and(_LOW32).bitwise_xor_(key & _LOW32))
    return _mix32(h.bitwise_xor_(index >> 32).add_(key >> 32).bitwise_and_(_LOW32))


def unit_uniform(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Uniforms in ``[0, 1)`` of ``dtype`` from 32-bit ``bits``: the top bits that the dtype's
    mantissa holds, scaled by a power of two, so the value is exact (never rounds up to 1)."""
    kept = min(round(-math.log2(torch.finfo(dtype).eps)) + 1, 32)     # float32: 24, bfloat16: 8
    return (bits >> (32 - kept)).to(dtype).mul_(2.0 ** -kept)


@dataclass(frozen=True)
class Draw:
    """Where one random op's values land: its node and step (the key), its global output shape,
    this rank's piece of it (None: the whole) and the device to draw on."""

    node: str
    step_seed: int
    shape: tuple[int, ...]
    piece: Any = None
    device: torch.device | str | None = None

    def bits(self, stream: int = 0) -> torch.Tensor:
        return hashed_bits(self.node, self.step_seed, self.shape, self.piece, self.device, stream)

    def uniform(self, dtype: torch.dtype) -> torch.Tensor:
        return unit_uniform(self.bits(), dtype)

    def open_uniform64(self, stream: int = 0) -> torch.Tensor:
        """float64 uniforms in ``(0, 1]``: safe under a logarithm."""
        return self.bits(stream).add_(1).to(torch.float64).mul_(2.0 ** -32)

    def normal64(self) -> torch.Tensor:
        """Standard normals in float64 by Box-Muller from two streams."""
        radius = self.open_uniform64(0).log_().mul_(-2.0).sqrt_()
        return radius.mul_(unit_uniform(self.bits(1), torch.float64).mul_(2.0 * math.pi).cos_())

    def below(self, n: int) -> torch.Tensor:
        """Integers in ``[0, n)``: ``bits * n >> 32`` (integer arithmetic); 63 bits for n >= 2**31."""
        if n <= 2 ** 31:
            return self.bits().mul_(int(n)).bitwise_right_shift_(32)
        wide = (self.bits(0) >> 1 << 32).bitwise_or_(self.bits(1))
        return wide.remainder_(int(n))


# ---- dropout (kept as the other random ops, with torch's own kernels for a rank alone) ----------

def dropout_keep(node: str, step_seed: int, shape: Sequence[int], p: float,
                 piece: Any = None, device: torch.device | str | None = None) -> torch.Tensor:
    """The keep-mask of dropout node ``node`` in the step seeded ``step_seed``: for the whole
    (global) tensor of ``shape``, or for this rank's ``piece`` of it, drawn on ``device``, so a
    piece is bit-for-bit the slice of the global mask on any device. ``--verify`` gives the
    one-device reference the global mask, so both sides drop the same elements."""
    return hashed_bits(node, step_seed, shape, piece, device) >= min(round(p * 2.0 ** 32), 2 ** 32)


@contextlib.contextmanager
def seeded_rng(node: str, step_seed: int, device: torch.device) -> Iterator[None]:
    """Inside, the default generator of ``device`` starts from (node, step)'s seed; after, it is
    as before. A rank alone (nothing to agree with) runs torch's own fused dropout and
    attention-dropout kernels in here, as fast as eager, and ``--verify`` replays the same call
    under the same seed on the same device to draw the same mask (a fused kernel's backward
    regenerates it from the state saved at the forward)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(node_seed(node, step_seed))
        yield


@local_op
def dropout(ctx: Any, x: torch.Tensor, p: float, train: bool | None = True) -> torch.Tensor:
    """Dropout whose mask is drawn for this rank's piece only, on its own device, from a seed
    all ranks share: a sharded program drops exactly what one device would. A rank alone runs
    torch's own dropout under the node's seed (see :func:`seeded_rng`)."""
    if not train or p == 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    if not ctx.exact_pieces:
        with seeded_rng(ctx.node, ctx.seed, x.device):
            return torch.nn.functional.dropout(x, p, True)
    keep = dropout_keep(ctx.node, ctx.seed, ctx.out_shapes[0], p, ctx.outputs[0], x.device)
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


def attention_with_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any, dropout_p: float,
                           is_causal: bool, scale: float | None, enable_gqa: bool, keep: torch.Tensor,
                           query_offset: int = 0) -> torch.Tensor:
    """Scaled dot-product attention written out, dropping attention weights where ``keep`` is
    False: what ``scaled_dot_product_attention`` computes with ``dropout_p``, but with a mask
    the caller draws (so a shard, and ``--verify``'s reference, can drop the same weights).
    ``query_offset``: global position of the first query (a query shard's causal mask)."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if is_causal:
        rows = torch.arange(q.shape[-2], device=q.device).unsqueeze(-1) + query_offset
        scores = scores.masked_fill(torch.arange(k.shape[-2], device=q.device) > rows, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    return (weights * keep.to(weights.dtype).mul_(1.0 / (1.0 - dropout_p))) @ v


@local_op
def sdpa_dropout(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask=None,
                 dropout_p: float = 0.0, is_causal: bool = False, scale=None, enable_gqa: bool = False):
    """Attention with dropout on this rank's piece: the mask over the global attention
    weights ``[B, H, Sq, Sk]`` is cut along the dim the queries are sharded on (batch, heads
    or queries; all three line up with the weights), or whole for replicated queries.
    One rank alone runs torch's own kernel, its generator seeded per (step, node) so that
    ``--verify`` replays it (see :func:`seeded_rng`)."""
    if not ctx.exact_pieces:
        with seeded_rng(ctx.node, ctx.seed, q.device):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
                                                                    scale=scale, enable_gqa=enable_gqa)
    q_info = ctx.inputs[0]
    shape = (*ctx.out_shapes[0][:-1], k.shape[-2])            # [B, H, Sq, Sk], global
    keep = dropout_keep(ctx.node, ctx.seed, shape, dropout_p, q_info, q.device)   # q's dims lead the weights'
    queries = along(q_info, 2)
    offset = queries.offset if queries is not None else 0
    return attention_with_dropout(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, keep, offset)


# ---- the random ops: each one's values from its Draw ---------------------------------------------

def _dtype(kw: dict[str, Any], like: torch.Tensor | None = None, default: torch.dtype | None = None) -> torch.dtype:
    """The op's ``dtype=``, else ``like``'s dtype, else ``default`` (torch's default float dtype)."""
    if kw.get("dtype") is not None:
        return kw["dtype"]
    if like is not None:
        return like.dtype
    return default if default is not None else torch.get_default_dtype()


def _normal(d: Draw, dtype: torch.dtype, mean: Any = 0.0, std: Any = 1.0) -> torch.Tensor:
    """``mean + std * z``. Tensor means and stds are read detached: torch's normal has zero
    gradients (it is not reparameterized), and so does the draw here."""
    if isinstance(mean, torch.Tensor) or isinstance(std, torch.Tensor):
        mean = mean.detach() if isinstance(mean, torch.Tensor) else mean
        std = std.detach() if isinstance(std, torch.Tensor) else std
        return mean + std * d.normal64().to(dtype)
    return d.normal64().mul_(std).add_(mean).to(dtype)


def _bernoulli(d: Draw, x: torch.Tensor, p: Any) -> torch.Tensor:
    """1 where the element's uniform is below its p (bits < p * 2**32 exactly), in x's dtype."""
    p = p.detach().to(torch.float64) if isinstance(p, torch.Tensor) else p
    return (unit_uniform(d.bits(), torch.float64) < p).to(x.dtype)


def _randint(d: Draw, low: int, high: int, dtype: torch.dtype) -> torch.Tensor:
    return d.below(high - low).add_(low).to(dtype)


def _randperm(d: Draw, n: int, dtype: torch.dtype) -> torch.Tensor:
    """A permutation of ``range(n)``: positions sorted by 63 hashed bits each (a stable sort, so
    even a tie orders the same way on every device)."""
    keys = (d.bits(0) >> 1 << 32).bitwise_or_(d.bits(1))
    return keys.argsort(stable=True).to(dtype)


def _multinomial(d: Draw, weights: torch.Tensor, samples: int, replacement: bool) -> torch.Tensor:
    """Indices of categories drawn in proportion to ``weights`` (a row, or one row per sample).
    With replacement: inverse CDF of one uniform per sample. Without: the ``samples`` smallest
    exponential races E/w (Efraimidis-Spirakis), which is sampling without replacement."""
    w = weights.detach().to(torch.float64)
    if replacement:
        cdf = w.cumsum(-1)
        u = unit_uniform(d.bits(), torch.float64) * cdf[..., -1:]
        return torch.searchsorted(cdf, u, right=True).clamp_(max=w.shape[-1] - 1)
    race = replace(d, shape=tuple(w.shape))
    keys = race.open_uniform64().log_().neg_() / w
    return keys.argsort(dim=-1, stable=True)[..., :samples]


# op -> (names of its positional arguments, its values from (Draw, arguments, keyword arguments)).
_Maker = Callable[[Draw, dict[str, Any], dict[str, Any]], torch.Tensor]
ELEMENTWISE: dict[str, tuple[tuple[str, ...], _Maker]] = {
    "aten.rand.default": (("size",), lambda d, a, kw: d.uniform(_dtype(kw))),
    "aten.rand_like.default": (("self",), lambda d, a, kw: d.uniform(_dtype(kw, a["self"]))),
    "aten.randn.default": (("size",), lambda d, a, kw: _normal(d, _dtype(kw))),
    "aten.randn_like.default": (("self",), lambda d, a, kw: _normal(d, _dtype(kw, a["self"]))),
    "aten.randint.default": (("high", "size"), lambda d, a, kw: _randint(d, 0, a["high"], _dtype(kw, None, torch.int64))),
    "aten.randint.low": (("low", "high", "size"),
                         lambda d, a, kw: _randint(d, a["low"], a["high"], _dtype(kw, None, torch.int64))),
    "aten.randint_like.default": (("self", "high"),
                                  lambda d, a, kw: _randint(d, 0, a["high"], _dtype(kw, a["self"]))),
    "aten.randint_like.low_dtype": (("self", "low", "high"),
                                    lambda d, a, kw: _randint(d, a["low"], a["high"], _dtype(kw, a["self"]))),
    "aten.bernoulli.default": (("self",), lambda d, a, kw: _bernoulli(d, a["self"], a["self"])),
    "aten.bernoulli.p": (("self", "p"), lambda d, a, kw: _bernoulli(d, a["self"], a.get("p", 0.5))),
    "aten.bernoulli.Tensor": (("self", "p"), lambda d, a, kw: _bernoulli(d, a["self"], a["p"])),
    "aten.normal_functional.default": (("self", "mean", "std"), lambda d, a, kw: _normal(
        d, a["self"].dtype, a.get("mean", 0.0), a.get("std", 1.0))),
    "aten.normal.float_float": (("mean", "std", "size"),
                                lambda d, a, kw: _normal(d, _dtype(kw), a["mean"], a["std"])),
    "aten.normal.Tensor_float": (("mean", "std"),
                                 lambda d, a, kw: _normal(d, a["mean"].dtype, a["mean"], a.get("std", 1.0))),
    "aten.normal.float_Tensor": (("mean", "std"), lambda d, a, kw: _normal(d, a["std"].dtype, a["mean"], a["std"])),
    "aten.normal.Tensor_Tensor": (("mean", "std"), lambda d, a, kw: _normal(
        d, torch.result_type(a["mean"], a["std"]), a["mean"], a["std"])),
    "aten.uniform.default": (("self", "from", "to"), lambda d, a, kw: d.uniform(a["self"].dtype).mul_(
        a.get("to", 1.0) - a.get("from", 0.0)).add_(a.get("from", 0.0))),
    "aten.exponential.default": (("self", "lambd"), lambda d, a, kw: d.open_uniform64().log_().div_(
        -a.get("lambd", 1.0)).to(a["self"].dtype)),
}
WHOLE: dict[str, tuple[tuple[str, ...], _Maker]] = {
    "aten.randperm.default": (("n",), lambda d, a, kw: _randperm(d, a["n"], _dtype(kw, None, torch.int64))),
    "aten.multinomial.default": (("self", "num_samples", "replacement"), lambda d, a, kw: _multinomial(
        d, a["self"], a["num_samples"], a.get("replacement", False))),
}
# Every op above, as a literal that the emitter reads from this file's source without torch
# (hapc.codegen.runtime_facts.random_ops); tests/runtime/test_random_ops.py keeps the two equal.
RANDOM_OP_NAMES = (
    "aten.rand.default", "aten.rand_like.default", "aten.randn.default", "aten.randn_like.default",
    "aten.randint.default", "aten.randint.low", "aten.randint_like.default", "aten.randint_like.low_dtype",
    "aten.bernoulli.default", "aten.bernoulli.p", "aten.bernoulli.Tensor", "aten.normal_functional.default",
    "aten.normal.float_float", "aten.normal.Tensor_float", "aten.normal.float_Tensor", "aten.normal.Tensor_Tensor",
    "aten.uniform.default", "aten.exponential.default", "aten.randperm.default", "aten.multinomial.default",
)
RANDOM_OPS = frozenset(RANDOM_OP_NAMES)
# Every op whose local implementation draws: the random ops, dropout and attention dropout.
DRAWING_OPS = RANDOM_OPS | {"aten.dropout.default", "aten.scaled_dot_product_attention.default"}
# What a module calls eagerly (in place) -> the functional op torch.export's trace records.
EAGER_TWINS = {"aten.normal_.default": "aten.normal_functional.default", "aten.uniform_.default": "aten.uniform.default",
               "aten.exponential_.default": "aten.exponential.default", "aten.bernoulli_.float": "aten.bernoulli.p",
               "aten.bernoulli_.Tensor": "aten.bernoulli.Tensor"}


def draw(op: str, node: str, step_seed: int, shape: Sequence[int], piece: Any,
         args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    """The values random op ``op`` (a traced aten overload) of ``node`` gives, in the step
    seeded ``step_seed``, for ``piece`` of its global output of ``shape`` (None: the whole);
    ``args``/``kwargs`` are the op's own, with tensors replaced by the pieces this rank holds."""
    names, make = ELEMENTWISE[op] if op in ELEMENTWISE else WHOLE[op]
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    tensors = [a for a in bound.values() if isinstance(a, torch.Tensor)]
    device = tensors[0].device if tensors else kwargs.get("device")
    return make(Draw(node, step_seed, tuple(int(s) for s in shape), piece, device), bound, kwargs)


@local_op
def random_piece(ctx: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """This rank's piece of an elementwise random op's output (any layout, replicated too):
    exactly the slice of the node's global draw, so every layout and one device agree."""
    return draw(ctx.op, ctx.node, ctx.seed, ctx.out_shapes[0], ctx.outputs[0], args, kwargs)


@local_op
def random_whole(ctx: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The whole output of ``randperm``/``multinomial`` (not elementwise), the same on every rank."""
    return draw(ctx.op, ctx.node, ctx.seed, ctx.out_shapes[0], None, args, kwargs)


# ---- --verify: the one-device reference replays the program's draws ------------------------------

class ReplayDraws(TorchDispatchMode):
    """While a module runs eagerly (``--verify``'s one-device reference), its k-th random op
    draws the global values of the k-th random node the program ran (``ran``: ``(op, node)`` of
    each local op of the step seeded ``step_seed``, in order). Ops are matched at the aten level,
    where eager and traced calls have the same names but for in-place forms (:data:`EAGER_TWINS`).
    A call of another kind than the next node's keeps torch's draw and leaves that node for the
    next call (``--verify`` then reports any difference it makes). Dropout is replayed by its own
    patch; :meth:`paused` keeps this mode out of the draws torch's dropout makes inside."""

    def __init__(self, step_seed: int, ran: Sequence[tuple[str, str]]) -> None:
        super().__init__()
        self.step_seed = step_seed
        self.nodes = [(op, node) for op, node in ran if op in RANDOM_OPS]
        self.next = 0
        self._paused = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        was, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = was

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        called = str(func)
        op = EAGER_TWINS.get(called, called)
        out = func(*args, **kwargs)
        if self._paused or op not in RANDOM_OPS:
            return out
        traced, node = self.nodes[self.next] if self.next < len(self.nodes) else (None, None)
        if traced != op:
            return out
        self.next += 1
        value = draw(op, node, self.step_seed, tuple(out.shape), None, args, kwargs)
        return out.copy_(value) if called != op else value
