"""Memory per device for a distributed program: what must fit for a plan to be a plan.

Five parts, each from the program's layouts and shares (a ``Shard`` value costs a rank only
its own piece, a ``Replicate`` or ``Partial`` value its full size):

* **parameters** (and buffers) as stored, per ``source_layouts``;
* **gradients**, one per trainable parameter, the size of its local piece (the gradient of a
  ``Replicate`` parameter is a full-size ``Partial``, of a ``Shard`` one a piece);
* **optimizer state**, copies of each trainable parameter's local piece: AdamW/Adam keep
  two (first and second moments), SGD none, SGD with momentum one;
* **activations kept for backward**: the user inputs plus every node output and every
  redistributed copy that needs a gradient, at its local size (and, under bf16 autocast, the
  low-precision copy of each weight a product casts). Views are skipped (they
  share their input's storage). This is the usual simple estimate: autograd saves inputs of
  most differentiable ops and these are mostly the outputs of the previous op; it ignores
  masks and statistics saved beside them (small) and values freed early (a slight over-count);
* **communication buffers**: the largest buffer a collective allocates on the rank (the
  gathered tensor, or the padded one for a padded all-gather).

The total adds all five, as if every part were alive at once. In a real step the
gradients grow while the activations are freed during backward, so the true peak is a
little lower: the estimate errs on the safe side, as a capacity check should.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from costmodel.classes import RankClasses, rank_classes
from costmodel.cluster import Cluster
from costmodel.opclass import op_class
from costmodel.transfers import LocalBytes, forward_move
from hapc.ir.graph import Graph
from hapc.ir.layout import Replicate, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute

OPTIMIZER_COPIES = {"adamw": 2, "adam": 2, "sgd": 0, "sgd_momentum": 1, "momentum": 1, "adagrad": 1,
                    "rmsprop": 1, "none": 0}

PARTS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "comm_buffer_bytes")


@dataclass
class DeviceMemory:
    """One device's predicted bytes, by part."""

    params_bytes: float = 0.0
    grads_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    activations_bytes: float = 0.0
    comm_buffer_bytes: float = 0.0

    @property
    def total_bytes(self) -> float:
        return sum(getattr(self, p) for p in PARTS)

    def __repr__(self) -> str:
        parts = ", ".join(f"{p.removesuffix('_bytes')} {getattr(self, p) / 1e9:.3g}" for p in PARTS)
        return f"DeviceMemory({self.total_bytes / 1e9:.3g} GB: {parts})"


@dataclass
class MemoryReport:
    """Per-device memory of a program, in cluster order, with capacities when a cluster is given."""

    devices: list[DeviceMemory]
    capacity_bytes: list[int] | None = None
    optimizer: str = "adamw"
    names: list[str] = field(default_factory=list)

    @property
    def totals(self) -> list[float]:
        return [d.total_bytes for d in self.devices]

    @property
    def fits(self) -> list[bool]:
        if self.capacity_bytes is None:
            return [True] * len(self.devices)
        return [t <= c for t, c in zip(self.totals, self.capacity_bytes)]

    @property
    def all_fit(self) -> bool:
        return all(self.fits)

    def missing_bytes(self) -> list[float]:
        """How much more memory each device would need (0 where it fits)."""
        if self.capacity_bytes is None:
            return [0.0] * len(self.devices)
        return [max(0.0, t - c) for t, c in zip(self.totals, self.capacity_bytes)]

    def table(self) -> str:
        head = f"{'rank':>4} {'device':<12} {'params':>8} {'grads':>8} {'optim':>8} {'activ':>8} " \
               f"{'comm':>8} {'total':>8} {'capacity':>8}  (GB)"
        rows = [head]
        fits, missing = self.fits, self.missing_bytes()        # once, not once per row
        for r, d in enumerate(self.devices):
            cap = f"{self.capacity_bytes[r] / 1e9:8.2f}" if self.capacity_bytes else f"{'-':>8}"
            flag = "" if fits[r] else f"  short by {missing[r] / 1e9:.2f} GB"
            name = self.names[r] if r < len(self.names) else ""
            rows.append(f"{r:>4} {name:<12} " + " ".join(f"{getattr(d, p) / 1e9:8.3f}" for p in PARTS)
                        + f" {d.total_bytes / 1e9:8.3f} {cap}{flag}")
        return "\n".join(rows)

    def __repr__(self) -> str:
        peak = max(self.totals) if self.devices else 0.0
        fit = "fits" if self.all_fit else f"does not fit on {self.fits.count(False)} device(s)"
        return f"MemoryReport({len(self.devices)} devices, peak {peak / 1e9:.3g} GB, {fit})"


def optimizer_copies(optimizer: str | int) -> int:
    """Extra copies of each trainable parameter the optimizer keeps."""
    if isinstance(optimizer, int):
        return optimizer
    key = optimizer.lower().replace("-", "_")
    if key not in OPTIMIZER_COPIES:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {', '.join(OPTIMIZER_COPIES)} "
                         "or a number of state copies")
    return OPTIMIZER_COPIES[key]


def program_memory(program: DistProgram, cluster: Cluster | None = None,
                   optimizer: str | int = "adamw", classes: RankClasses | None = None,
                   pieces: LocalBytes | None = None) -> MemoryReport:
    """Predicted bytes per device of ``program`` (see the module docstring for each part).

    Computed once per class of ranks the model cannot tell apart (``classes``, found from the
    program and cluster when not given; see :mod:`costmodel.classes`) and copied to the
    members: the same numbers as rank by rank. ``pieces`` (the program's
    :class:`~costmodel.transfers.LocalBytes`, a simulation's) lends the byte counts it knows."""
    graph = program.graph
    copies = optimizer_copies(optimizer)
    if classes is None:
        classes = rank_classes(program, cluster)
    if pieces is None or pieces.program is not program:
        pieces = LocalBytes(program)
    reps = classes.representatives
    lanes = classes.count
    mem = [DeviceMemory() for _ in range(lanes)]
    # Running sums per part as plain lists (set on the DeviceMemory objects at the end): the
    # same additions in the same order, without an attribute lookup per rank per value.
    sums = {part: [0.0] * lanes for part in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                             "activations_bytes")}

    def add(part: str, amounts: Sequence[float], times: float | None = None) -> None:
        """Add each class's amount (``times`` it, when given) to ``part``."""
        acc = sums[part]
        for c, r in enumerate(reps):
            acc[c] += amounts[r] if times is None else times * amounts[r]

    for name in graph.params + graph.buffers:
        layout = program.source_layouts.get(name, Replicate())
        piece = pieces(name, layout)
        add("params_bytes", piece)
        if graph.values[name].requires_grad:
            add("grads_bytes", piece)
            add("optimizer_bytes", piece, copies)
    for name in graph.inputs:
        add("activations_bytes", pieces(name, program.source_layouts.get(name, Replicate())))

    facts = _node_facts(graph)
    cast_params: set[str] = set()
    for step in program.steps:
        if isinstance(step, Compute):
            node, kept, casts = facts[step.node]
            if kept is None:
                continue                        # a view keeps nothing of its own
            outputs = step.strategy.outputs
            for k, out in kept:
                if k < len(outputs):            # as zip(node.outputs, outputs) pairs them
                    add("activations_bytes", pieces(out, outputs[k]))
            if casts:
                _add_autocast_copies(program, node, step, cast_params, add, pieces)
        elif isinstance(step, Redistribute):
            _add_redistribute(program, step, mem, sums["activations_bytes"], reps, pieces)
    for part, acc in sums.items():
        for m, total in zip(mem, acc):
            setattr(m, part, total)
    mem = [replace(m) for m in classes.expand(mem)]     # one object per device, as callers expect

    capacity = cluster.memory_bytes() if cluster is not None else None
    names = [d.type for d in cluster.devices] if cluster is not None else []
    label = optimizer if isinstance(optimizer, str) else f"{optimizer} copies"
    return MemoryReport(mem, capacity, label, names)


_RECENT_FACTS: list[tuple[Graph, tuple[int, int], dict[str, tuple]]] = []


def _node_facts(graph: Graph) -> dict[str, tuple]:
    """Per node name: (the node, the (output index, name) pairs :func:`kept_for_backward`
    keeps or None for a view, whether its result is low precision so it may cast weights).
    They depend on the graph alone, and synthesize() works out the memory of a dozen programs
    of one graph, so a few recent graphs keep theirs (by identity, their size as a guard
    against a graph edited in place)."""
    size = (len(graph.nodes), len(graph.values))
    for g, known_size, facts in _RECENT_FACTS:
        if g is graph and known_size == size:
            return facts
    facts = {}
    values = graph.values
    for node in graph.nodes:
        if op_class(node.op) == "view":
            facts[node.name] = (node, None, False)
            continue
        kept = tuple((k, out) for k, out in enumerate(node.outputs) if values[out].requires_grad)
        low = node.outputs and values[node.outputs[0]].meta.dtype in ("bfloat16", "float16")
        facts[node.name] = (node, kept, bool(low))
    _RECENT_FACTS[:] = [e for e in _RECENT_FACTS if e[0] is not graph][-3:] + [(graph, size, facts)]
    return facts


def kept_for_backward(program: DistProgram, node, step: Compute) -> list[tuple[str, object]]:
    """The outputs of ``step`` that count as activation memory, with their layouts: those that
    need a gradient (autograd may save them for backward). Views keep nothing of their own: they
    alias their input. One definition for the whole-batch memory model and the pipeline's
    per-stage, per-micro-batch accounting."""
    if op_class(node.op) == "view":
        return []
    return [(out, layout) for out, layout in zip(node.outputs, step.strategy.outputs)
            if program.graph.values[out].requires_grad]


def _add_autocast_copies(program: DistProgram, node, step: Compute, seen: set[str], add,
                         pieces: LocalBytes) -> None:
    """A float32 weight feeding a bf16/fp16 product (a mixed-precision graph, see
    :mod:`hapc.ir.precision`) is cast by autocast, and the low-precision copy lives until
    backward: its local bytes at 2 per element, once per weight (autocast caches the cast)."""
    graph = program.graph
    out = graph.meta(node.outputs[0]).dtype if node.outputs else "float32"
    if out not in ("bfloat16", "float16"):
        return
    for ref, layout in zip(node.input_refs(), step.strategy.inputs):
        v = graph.values[ref]
        if v.kind == "param" and v.meta.dtype == "float32" and ref not in seen:
            seen.add(ref)
            add("activations_bytes", pieces(ref, layout), 0.5)


def _add_redistribute(program: DistProgram, step: Redistribute, mem: list[DeviceMemory],
                      activations_bytes: list[float], reps: Sequence[int], pieces: LocalBytes) -> None:
    """``mem`` and ``activations_bytes`` hold one entry per class, for the ranks ``reps``."""
    move = forward_move(program, step, pieces)
    if move is None:
        return       # nothing moves; a slice is a view of a value already counted
    out = pieces(step.out, step.dst_layout)
    if program.graph.values[step.src.split("@", 1)[0]].requires_grad:
        for c, r in enumerate(reps):
            activations_bytes[c] += out[r]
    if move.kind == "local":
        return
    buffer = [out[r] for r in reps]
    if move.kind == "all_gather" and isinstance(step.src_layout, Shard):
        padded = max(move.piece_bytes) * program.world     # NCCL wants equal pieces
        buffer = [max(b, padded) for b in buffer]
    for c, m in enumerate(mem):
        m.comm_buffer_bytes = max(m.comm_buffer_bytes, buffer[c])
