"""What a layout change moves: the collective behind each Redistribute, and its autograd dual.

A :class:`hapc.ir.program.Redistribute` names only the source and destination layouts; this
module turns it into a priced call (kind and per-rank piece bytes) for the forward pass and
for the backward pass, where autograd runs the dual collective:

=================  ==================  =================================================
forward            collective          backward (dual)
=================  ==================  =================================================
S(i) -> R          all_gather          reduce_scatter to S(i)
P -> R             all_reduce          all_reduce
P -> S(j)          reduce_scatter      all_gather
S(i) -> S(j)       all_to_all          all_to_all back
R -> S(j)          local slice (free)  local zero-padding to full size (S -> P)
S(i) -> P          local zero-padding  local slice (free)
R -> P             local: zeros on     local: zeros on ranks > 0
                   ranks > 0
=================  ==================  =================================================

Nothing moves into or out of ``ExpertRows`` (:class:`hapc.ir.layout.ExpertRows`): only the
grouped matmuls that read the routing know which rows are whose.

"Local" moves cost memory traffic only: the bytes they write, priced at the device's
memory bandwidth by the simulator. Values that need no gradient have no backward move.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.collectives import OverlapSends
from hapc.ir.graph import DTYPE_BYTES, TensorMeta
from hapc.ir.layout import Layout, Partial, Replicate, Shard, reachable
from hapc.ir.program import Compute, DistProgram, Redistribute


@dataclass(frozen=True)
class Move:
    """One priced transfer: a collective kind, or ``"local"`` for a copy on each rank."""

    kind: str                                      # a costmodel.collectives kind, or "local"
    piece_bytes: tuple[float, ...]                 # per rank (see collective_seconds)
    send_matrix: OverlapSends | None = None          # all_to_all: bytes from rank r to rank s


def meta_of(program: DistProgram, name: str) -> TensorMeta:
    """Meta of a program value; redistributed copies are named ``base@...``."""
    return program.graph.meta(name.split("@", 1)[0])


def requires_grad(program: DistProgram, name: str) -> bool:
    return program.graph.values[name.split("@", 1)[0]].requires_grad


def local_bytes(program: DistProgram, name: str, layout: Layout) -> list[float]:
    """Bytes of each rank's local piece of ``name`` held in ``layout``."""
    meta = meta_of(program, name)
    full = float(meta.numel * DTYPE_BYTES.get(meta.dtype, 4))
    if not isinstance(layout, Shard):
        return [full] * program.world
    return program.piece_bytes(name, layout.dim, full)


class LocalBytes:
    """:func:`local_bytes` for the values of one program, remembered by what the bytes depend
    on: a value's size, and for a ``Shard`` the length and block count of its dimension. The
    simulator and the memory model ask for thousands of values per program, mostly the same
    few sizes (every layer of a transformer holds the same pieces); each answer is the very
    list of floats :func:`local_bytes` gives, shared, so callers must not change it."""

    def __init__(self, program: DistProgram) -> None:
        self.program = program
        self.world = program.world
        self.blocks = program.blocks()
        self.values = program.graph.values
        self._sizes: dict[str, tuple[float, tuple[int, ...]]] = {}    # name -> (whole bytes, shape)
        self._whole: dict[float, list[float]] = {}
        self._pieces: dict[tuple[int, int, float], list[float]] = {}

    def size(self, name: str) -> tuple[float, tuple[int, ...]]:
        """(whole bytes, shape) of a value (a copy ``base@...`` has its base's)."""
        hit = self._sizes.get(name)
        if hit is None:
            meta = self.values[name.split("@", 1)[0]].meta
            hit = self._sizes[name] = (float(meta.numel * DTYPE_BYTES.get(meta.dtype, 4)), meta.shape)
        return hit

    def __call__(self, name: str, layout: Layout) -> list[float]:
        full, shape = self.size(name)
        if not isinstance(layout, Shard):
            whole = self._whole.get(full)
            if whole is None:
                whole = self._whole[full] = [full] * self.world
            return whole
        d = layout.dim + len(shape) if layout.dim < 0 else layout.dim
        length = shape[d]
        if length == 0:
            return [0.0] * self.world
        key = (length, self.blocks.get((name, d), length), full)
        hit = self._pieces.get(key)
        if hit is None:           # what DistProgram.piece_bytes computes, in the same order
            hit = self._pieces[key] = [full * n / length for n in self.program.lengths(name, d)]
        return hit


def forward_move(program: DistProgram, step: Redistribute, pieces: LocalBytes | None = None) -> Move | None:
    """The transfer a Redistribute performs in the forward pass (None when nothing moves).
    ``pieces`` (the program's :class:`LocalBytes`) saves working out its byte counts again.
    A weight gathered for low-precision products only travels in their precision
    (:func:`low_precision_gather`)."""
    move = _move(program, step.src, step.out, step.src_layout, step.dst_layout, pieces or LocalBytes(program))
    low = low_precision_gather(program, step) if move is not None and move.kind == "all_gather" else None
    if low is None:
        return move
    ratio = DTYPE_BYTES[low] / DTYPE_BYTES.get(meta_of(program, step.src).dtype, 4)
    return Move(move.kind, tuple(b * ratio for b in move.piece_bytes))


def low_precision_gather(program: DistProgram, step: Redistribute) -> str | None:
    """The dtype a weight stored sharded travels in when it is gathered (:func:`regathered`)
    for readers that are all low-precision (bf16/fp16) products, or None. Autocast would cast
    the gathered float32 weight to that dtype anyway, and a cast commutes with a gather, so the
    pieces are cast first and half the bytes move; the gradient still goes back in float32.
    The program's ``LOW_GATHERS`` table (hapc.codegen) says the same."""
    if not regathered(program, step):
        return None
    readers = _readers(program).get(step.out, ())
    dtypes = {program.graph.meta(node.outputs[0]).dtype if node.outputs else "float32" for node in readers}
    if not readers or len(dtypes) != 1:
        return None
    low = dtypes.pop()
    return low if low in ("bfloat16", "float16") and meta_of(program, step.src).dtype == "float32" else None


_READERS: dict[int, tuple[DistProgram, int, dict[str, list]]] = {}


def _readers(program: DistProgram) -> dict[str, list]:
    """Value name -> the graph nodes of the steps that read it (remembered per program)."""
    hit = _READERS.get(id(program))
    if hit is not None and hit[0] is program and hit[1] == len(program.steps):
        return hit[2]
    nodes = {n.name: n for n in program.graph.nodes}
    found: dict[str, list] = {}
    for step in program.steps:
        if isinstance(step, Compute):
            for name in step.inputs:
                found.setdefault(name, []).append(nodes[step.node])
    if len(_READERS) > 8:
        _READERS.clear()
    _READERS[id(program)] = (program, len(program.steps), found)
    return found


def regathered(program: DistProgram, step: Redistribute) -> bool:
    """Whether backward gathers ``step``'s value again instead of keeping it (ZeRO-3, as FSDP
    does): a parameter stored sharded and gathered whole for use is freed once forward has
    used it (``hapc.runtime.zero.GatheredWeights``), so its whole copy costs no memory from
    forward to backward, and backward runs the gather a second time."""
    value = program.graph.values.get(step.src)
    return value is not None and value.kind == "param" and isinstance(step.src_layout, Shard) \
        and isinstance(step.dst_layout, Replicate)


def backward_move(program: DistProgram, step: Redistribute, pieces: LocalBytes | None = None) -> Move | None:
    """The dual transfer autograd performs for the gradient (None when nothing moves)."""
    if not requires_grad(program, step.src):
        return None
    src, dst = step.src_layout, step.dst_layout
    if src == dst:
        return None
    pieces = pieces or LocalBytes(program)
    # The gradient travels from the gradient layout of dst to that of src.
    if isinstance(src, Shard) and isinstance(dst, Replicate):
        return Move("reduce_scatter", tuple(pieces(step.src, src)))
    if isinstance(src, Partial) and isinstance(dst, Replicate):
        return _move(program, step.out, step.src, Partial(), Replicate(), pieces)
    if isinstance(src, Partial) and isinstance(dst, Shard):
        return Move("all_gather", tuple(pieces(step.out, dst)))
    if isinstance(src, Shard) and isinstance(dst, Shard):
        fwd = _move(program, step.src, step.out, src, dst, pieces)
        assert fwd is not None and fwd.send_matrix is not None
        return Move("all_to_all", tuple(pieces(step.out, dst)), fwd.send_matrix.transposed())
    if isinstance(src, Replicate) and isinstance(dst, Shard):      # slice; its dual pads (S -> P)
        return _local(program, step.src, None, pieces)
    if isinstance(src, Shard) and isinstance(dst, Partial):        # pad; its dual slices
        return None
    if isinstance(src, Replicate) and isinstance(dst, Partial):    # the dual is the same masking
        return _local(program, step.src, 0, pieces)
    raise ValueError(f"no backward for {src} -> {dst}")


def _move(program: DistProgram, src_name: str, out_name: str, src: Layout, dst: Layout,
          pieces: LocalBytes) -> Move | None:
    if src == dst:
        return None
    if not reachable(src, dst):
        raise ValueError(f"cannot redistribute {src} -> {dst}: expert rows are made and read by ops only")
    if isinstance(src, Shard) and isinstance(dst, Replicate):
        return Move("all_gather", tuple(pieces(src_name, src)))
    if isinstance(src, Partial) and isinstance(dst, Replicate):
        return Move("all_reduce", tuple(pieces(src_name, src)))
    if isinstance(src, Partial) and isinstance(dst, Shard):
        return Move("reduce_scatter", tuple(pieces(out_name, dst)))
    if isinstance(src, Shard) and isinstance(dst, Shard):
        before = pieces(src_name, src)
        full = float(sum(before))
        after = pieces(out_name, dst)
        # Rank r holds its src piece; rank s wants its dst piece: the overlap is their product.
        return Move("all_to_all", tuple(before), OverlapSends(before, after, full))
    if isinstance(src, Replicate) and isinstance(dst, Shard):
        return None                                                # a view of the local copy
    if isinstance(src, Shard) and isinstance(dst, Partial):
        return _local(program, src_name, None, pieces)
    if isinstance(src, Replicate) and isinstance(dst, Partial):
        return _local(program, src_name, 0, pieces)
    raise ValueError(f"cannot redistribute {src} -> {dst}")


def _local(program: DistProgram, name: str, zero_rank: int | None, pieces: LocalBytes) -> Move:
    """A local write of a full-size tensor (zero padding or zeros), on every rank but ``zero_rank``."""
    full = pieces.size(name)[0]
    return Move("local", tuple(0.0 if r == zero_rank else full for r in range(program.world)))
