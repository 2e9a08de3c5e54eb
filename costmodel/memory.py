"""Memory per device for a distributed program: what must fit for a plan to be a plan.

Five parts, each from the program's layouts and shares (a ``Shard`` value costs a rank only
its own piece, a ``Replicate`` or ``Partial`` value its full size):

* **parameters** (and buffers) as stored, per ``source_layouts``;
* **gradients**, one per trainable parameter, the size of its local piece (the gradient of a
  ``Replicate`` parameter is a full-size ``Partial``, of a ``Shard`` one a piece);
* **optimizer state**, copies of each trainable parameter's local piece: AdamW/Adam keep
  two (first and second moments), SGD none, SGD with momentum one. A program with
  ``state_shares`` (ZeRO-2, :mod:`synth.zero`) keeps only its share of the rows of a replicated
  parameter's gradient and state, plus the buckets in flight (:func:`zero_buffer_bytes`);
* **activations kept for backward**: the user inputs plus what autograd saves, as the tracer
  recorded it per node by running each op on meta (:mod:`hapc.frontend.saved`): each saved
  input or output once however many nodes save it (a saved view keeps its base), the other
  tensors a node saves (statistics, masks, log-probabilities), a float32 value saved by a
  bf16/fp16 product as autocast's low-precision copy, and the low-precision copy of each
  weight a product casts; each at its local size, with redistributed copies of saved values
  (not a weight gathered from sharded storage, nor its cast: backward gathers it again).
  Within 4% of saved-tensor hooks on a 7B Llama layer at sequence 512-2048, fp32 and bf16
  (tests/costmodel/test_saved_memory.py checks small models to 15%). A graph without the record
  (built by hand, or a plan written before it) keeps every output that needs a gradient, which
  over-counts (1.8x on a Llama slice);
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
from costmodel.recompute import call_of_steps, recomputed_calls, saved_inputs
from costmodel.transfers import LocalBytes, forward_move, regathered
from hapc.ir.graph import Graph
from hapc.ir.layout import Replicate, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute

OPTIMIZER_COPIES = {"adamw": 2, "adam": 2, "sgd": 0, "sgd_momentum": 1, "momentum": 1, "adagrad": 1,
                    "rmsprop": 1, "none": 0}

# The runtime's gradient buckets (hapc.runtime.zero): while one bucket's gradients are being
# reduce-scattered, the next fills, and the parameter all-gather after the step goes bucket by
# bucket; about three buckets of whole gradients or parameters are alive at once.
ZERO_BUCKET_BYTES = 3 * 25 * 2**20

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

    def add_to(acc: list[float], amounts: Sequence[float], times: float | None = None) -> None:
        """Add each class's amount (``times`` it, when given) to ``acc``."""
        for c, r in enumerate(reps):
            acc[c] += amounts[r] if times is None else times * amounts[r]

    def add(part: str, amounts: Sequence[float], times: float | None = None) -> None:
        add_to(sums[part], amounts, times)

    for name in graph.params + graph.buffers:
        layout = program.source_layouts.get(name, Replicate())
        piece = pieces(name, layout)
        add("params_bytes", piece)
        if graph.values[name].requires_grad:
            state = state_pieces(program, name, piece)
            add("grads_bytes", state)
            add("optimizer_bytes", state, copies)
    if program.state_shares is not None:
        add("grads_bytes", [zero_buffer_bytes(program)] * program.world)
    for name in graph.inputs:
        add("activations_bytes", pieces(name, program.source_layouts.get(name, Replicate())))

    facts = _node_facts(graph)
    saved = saved_values(graph)
    cast_params: set[str] = set()
    # Recomputation: a recomputed call keeps its inputs; what its steps keep lives only while
    # backward reruns it, one call at a time (costmodel.recompute).
    calls = call_of_steps(program)
    per_call: dict[int, list[float]] = {}
    for i, step in enumerate(program.steps):
        call = calls.get(i)
        acc = sums["activations_bytes"] if call is None else per_call.setdefault(call.start, [0.0] * lanes)
        if isinstance(step, Compute):
            node, kept, casts = facts[step.node]
            if kept is None:
                continue                        # a view keeps nothing of its own
            outputs = step.strategy.outputs
            for k, out, times in kept:
                if k < len(outputs):            # as zip(node.outputs, outputs) pairs them
                    add_to(acc, pieces(out, outputs[k]), times)
            for param, layout in cast_weights(program, node, step, cast_params) if casts else ():
                add_to(acc, pieces(param, layout), 0.5)      # its bf16/fp16 copy
            extra = saved_extra(graph, node, step) if saved is not None else None
            if extra is not None:               # its own saved tensors, split as its output (or input)
                add_to(acc, pieces(extra[0], extra[1]), extra[2])
        elif isinstance(step, Redistribute):
            _add_redistribute(program, step, mem, acc, reps, pieces, saved)
    if per_call:
        layouts = program.layouts()
        inputs = {name for call in recomputed_calls(program) for name in saved_inputs(program, call)}
        for name in sorted(inputs):
            add("activations_bytes", pieces(name, layouts[name]))
        acc = sums["activations_bytes"]
        for c in range(lanes):
            acc[c] += max(held[c] for held in per_call.values())
    for part, acc in sums.items():
        for m, total in zip(mem, acc):
            setattr(m, part, total)
    mem = [replace(m) for m in classes.expand(mem)]     # one object per device, as callers expect

    capacity = cluster.memory_bytes() if cluster is not None else None
    names = [d.type for d in cluster.devices] if cluster is not None else []
    label = optimizer if isinstance(optimizer, str) else f"{optimizer} copies"
    return MemoryReport(mem, capacity, label, names)


def state_pieces(program: DistProgram, name: str, piece: Sequence[float]) -> Sequence[float]:
    """Bytes of parameter ``name``'s gradient (and of each optimizer state copy) per rank:
    its local piece, or under ZeRO (``program.state_shares``) a stored-replicated parameter's
    owned rows (:meth:`DistProgram.state_rows`)."""
    rows = program.state_rows(name) if program.state_shares is not None else None
    if rows is None:
        return piece
    total = sum(rows)
    return [b * n / total for b, n in zip(piece, rows)]


def zero_buffer_bytes(program: DistProgram) -> float:
    """ZeRO's buffers in flight (:data:`ZERO_BUCKET_BYTES`), or the whole gradients it shards
    when they are fewer bytes than that (the same with or without ZeRO: a small model's)."""
    if program.state_shares is None:
        return 0.0
    values = program.graph.values
    whole = sum(values[p].meta.nbytes for p in program.graph.params if program.state_rows(p) is not None)
    return float(min(ZERO_BUCKET_BYTES, whole))


def zero_sync_factor(program: DistProgram) -> float:
    """Bytes an all-reduce would move for the same time as ZeRO's synchronisation of one
    byte of gradient: a reduce-scatter to each rank's rows and the all-gather of the updated
    rows move as much as a ring all-reduce when the rows are even, and, padded to the largest
    piece as uneven collectives are, ``world * max(state_shares)`` times it otherwise."""
    if program.state_shares is None:
        return 1.0
    return program.world * max(program.state_shares)


_RECENT_FACTS: list[tuple[Graph, tuple[int, int], dict[str, tuple]]] = []


def _node_facts(graph: Graph) -> dict[str, tuple]:
    """Per node name: (the node, the (output index, name, factor) triples it keeps for backward
    (factor None: whole; 0.5: the low-precision copy autocast saves of a float32 value) or None
    for a view, whether its result is low precision so it may cast weights).
    They depend on the graph alone, and synthesize() works out the memory of a dozen programs
    of one graph, so a few recent graphs keep theirs (by identity, their size as a guard
    against a graph edited in place)."""
    size = (len(graph.nodes), len(graph.values))
    for g, known_size, facts in _RECENT_FACTS:
        if g is graph and known_size == size:
            return facts
    facts = {}
    values = graph.values
    saved = saved_values(graph)
    for node in graph.nodes:
        if op_class(node.op) == "view":
            facts[node.name] = (node, None, False)
            continue
        if saved is None:
            kept = tuple((k, out, None) for k, out in enumerate(node.outputs) if values[out].requires_grad)
        else:
            kept = tuple((k, out, None if out in saved.whole else 0.5) for k, out in enumerate(node.outputs)
                         if out in saved.whole or out in saved.cast)
        low = node.outputs and values[node.outputs[0]].meta.dtype in ("bfloat16", "float16")
        facts[node.name] = (node, kept, bool(low))
    _RECENT_FACTS[:] = [e for e in _RECENT_FACTS if e[0] is not graph][-3:] + [(graph, size, facts)]
    return facts


@dataclass(frozen=True)
class SavedValues:
    """What autograd keeps of a step, graph-wide (:func:`saved_values`)."""

    whole: frozenset[str]        # values kept at their own size (a view's saved base instead)
    cast: frozenset[str]         # float32 values kept only as autocast's low-precision copy
    extra: dict[str, int]        # node name -> bytes of its other saved tensors (whole batch)


def saved_values(graph: Graph) -> SavedValues | None:
    """The values some node saves for backward, from what the tracer recorded per node
    (:mod:`hapc.frontend.saved`): a saved input or output, followed through views to the value
    whose storage it shares, counted once however many nodes save it. A float32 input saved by
    a low-precision (autocast) product is its bf16/fp16 copy. A node without a record keeps, as
    the older rule did, its outputs that need a gradient. None when nothing was recorded."""
    facts = graph.torch_facts
    if facts is None or facts.saved is None:
        return None
    cached = _RECENT_SAVED.get(id(graph))
    if cached is not None and cached[0] is graph:
        return cached[1]
    values = graph.values
    view_of = {out: n.input_refs()[0] for n in graph.nodes if op_class(n.op) == "view" and n.input_refs()
               for out in n.outputs}

    def base(ref: str) -> str:
        seen = 0
        while ref in view_of and seen < 10_000:
            ref, seen = view_of[ref], seen + 1
        return ref

    whole: set[str] = set()
    cast: set[str] = set()
    extra: dict[str, int] = {}
    for node in graph.nodes:
        spec = facts.saved.get(node.name)
        if spec is None:
            if op_class(node.op) != "view":
                whole.update(out for out in node.outputs if values[out].requires_grad)
            continue
        ins, outs, other = spec
        refs = node.input_refs()
        low = bool(node.outputs) and values[node.outputs[0]].meta.dtype in ("bfloat16", "float16")
        for i in ins:
            if i < len(refs):
                ref = base(refs[i])
                (cast if low and values[ref].meta.dtype == "float32" else whole).add(ref)
        whole.update(base(node.outputs[k]) for k in outs if k < len(node.outputs))
        if other:
            extra[node.name] = other
    found = SavedValues(frozenset(whole), frozenset(cast - whole), extra)
    if len(_RECENT_SAVED) > 4:
        _RECENT_SAVED.clear()
    _RECENT_SAVED[id(graph)] = (graph, found)
    return found


_RECENT_SAVED: dict[int, tuple[Graph, SavedValues]] = {}


def kept_outputs(graph: Graph, node) -> list[tuple[int, str, float]]:
    """``node``'s outputs kept for backward: (output index, name, the fraction of its size kept:
    1, or 0.5 for autocast's low-precision copy of a float32 value); none for a view."""
    _, kept, _ = _node_facts(graph)[node.name]
    return [] if kept is None else [(k, out, 1.0 if times is None else times) for k, out, times in kept]


def saved_extra_fraction(graph: Graph, node) -> float:
    """The bytes ``node`` saves besides its inputs and outputs (LayerNorm's statistics, a
    dropout mask, cross-entropy's log-probabilities), as a fraction of its first output's size:
    a program keeps that fraction of its local piece of the output."""
    saved = saved_values(graph)
    extra = saved.extra.get(node.name) if saved is not None else None
    if not extra or not node.outputs:
        return 0.0
    whole = graph.values[node.outputs[0]].meta.nbytes
    return extra / whole if whole else 0.0


def saved_extra(graph: Graph, node, step: Compute) -> tuple[str, object, float] | None:
    """What ``node`` saves besides its inputs and outputs, as (value, its layout in ``step``,
    fraction): a program keeps that fraction of its local piece of the value. The value is the
    node's first output, or its first input where that is larger: a loss keeps the
    log-probabilities of the logits it reduces to one number, which are split as the logits,
    not as the number (whole on every rank, that was the whole batch's log-probabilities)."""
    fraction = saved_extra_fraction(graph, node)
    if not fraction or not step.strategy.outputs:
        return None
    out = graph.values[node.outputs[0]].meta.nbytes
    refs = node.input_refs()
    if refs and step.strategy.inputs and graph.values[refs[0]].meta.nbytes > out:
        return step.inputs[0], step.strategy.inputs[0], fraction * out / graph.values[refs[0]].meta.nbytes
    return node.outputs[0], step.strategy.outputs[0], fraction


def kept_for_backward(program: DistProgram, node, step: Compute) -> list[tuple[str, object, float]]:
    """The outputs of ``step`` that count as activation memory, with their layouts and the
    fraction kept (:func:`kept_outputs`: those some node saves for backward, see
    :func:`saved_values`; without a record, those that need a gradient). One definition for the
    whole-batch memory model and the pipeline's per-stage, per-micro-batch accounting."""
    layouts = step.strategy.outputs
    return [(out, layouts[k], times) for k, out, times in kept_outputs(program.graph, node) if k < len(layouts)]


def cast_weights(program: DistProgram, node, step: Compute, seen: set[str]) -> list[tuple[str, object]]:
    """The float32 weights a bf16/fp16 product casts (a mixed-precision graph, see
    :mod:`hapc.ir.precision`) whose low-precision copy lives until backward, with the layout
    read: once per weight (``seen``; autocast caches the cast), not a weight gathered from
    sharded storage (backward gathers and casts it again)."""
    graph = program.graph
    out = graph.meta(node.outputs[0]).dtype if node.outputs else "float32"
    if out not in ("bfloat16", "float16"):
        return []
    found = []
    for ref, layout in zip(node.input_refs(), step.strategy.inputs):
        v = graph.values[ref]
        if v.kind == "param" and v.meta.dtype == "float32" and ref not in seen \
                and not gathered_for_use(program, ref, layout):
            seen.add(ref)
            found.append((ref, layout))
    return found


def gathered_for_use(program: DistProgram, param: str, layout) -> bool:
    """Whether a product reads ``param`` whole from sharded storage: the gathered weight (and
    autocast's low-precision copy of it) is gathered again in backward, not kept (ZeRO-3,
    :func:`costmodel.transfers.regathered`)."""
    return isinstance(program.source_layouts.get(param), Shard) and not isinstance(layout, Shard)


def _add_redistribute(program: DistProgram, step: Redistribute, mem: list[DeviceMemory],
                      activations_bytes: list[float], reps: Sequence[int], pieces: LocalBytes,
                      saved: SavedValues | None = None) -> None:
    """``mem`` and ``activations_bytes`` hold one entry per class, for the ranks ``reps``. A
    redistributed copy is kept when its value is (some reader saves it, in this copy's layout)."""
    move = forward_move(program, step, pieces)
    if move is None:
        return       # nothing moves; a slice is a view of a value already counted
    out = pieces(step.out, step.dst_layout)
    src = step.src.split("@", 1)[0]
    kept = program.graph.values[src].requires_grad if saved is None else \
        src in saved.whole or src in saved.cast
    kept = kept and not regathered(program, step)        # ZeRO-3: gathered again in backward
    if kept:
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
