"""The simulator: a distributed program on a cluster -> time per iteration, per device.

The model is bulk-synchronous, as an SPMD program with blocking collectives is:

1. **Forward**, step by step. A ``Compute`` costs each rank the roofline time of its share
   of the node (:func:`costmodel.compute.node_seconds`); a ``Redistribute`` that needs a
   collective is a synchronisation point: every rank waits for the slowest (idle time),
   then all spend the collective's time (communication). Local moves cost memory traffic.
2. **Backward**, the steps in reverse: each ``Compute``'s backward roofline and, for each
   ``Redistribute`` of a value that needs a gradient, the dual collective
   (:mod:`costmodel.transfers`).
3. **Gradient synchronisation** of every trainable ``Replicate`` parameter (its gradient is
   ``Partial``): an all-reduce that overlaps with backward compute. A gradient is complete
   once the backward of the parameter's *first* forward use has run; gradients are packed
   into buckets (``bucket_bytes``, 25 MiB like DDP) in the order they complete, and a
   bucket's all-reduce starts when its last gradient is complete on every rank and the
   network is free. All collectives share one network channel, so a backward collective
   also waits for gradient all-reduces in flight. Only ``cluster.comm_overlap`` of each
   all-reduce is hidden: the rest delays every rank's compute (on CPUs gloo reduces on the
   cores that compute).
4. **Optimizer step** on each rank's local parameters once all gradients are synchronised:
   memory-bound (AdamW reads parameter, gradient and two moments and writes three).

Per rank, compute + communication + idle = the iteration time. Ranks the model cannot tell
apart (same device, same piece lengths; :mod:`costmodel.classes`) share one timeline, so a
simulation costs the number of classes, not of devices (3 timelines for 256 GPUs of two kinds),
and gives every rank exactly the numbers a timeline of its own would. A Redistribute's method
``"auto"`` picks the cheapest collective variant (:func:`costmodel.collectives.best_variant`).

Per-rank work of a ``Compute``: the fraction of the op a rank holds is its local length over
the global length of the strategy's sharded dimension (all sharded dimensions of one
strategy are split alike); strategies with no ``Shard`` (all ``Replicate``, or ``Partial``
only) do the full work on every rank. The all-reduces that local ops run inside themselves
(the max and sum of a vocabulary-parallel cross-entropy, a mean loss's global count) are
priced as blocking collectives too (:mod:`costmodel.internal`): a few kilobytes each, but a
millisecond apiece with gloo.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from costmodel.classes import rank_classes
from costmodel.cluster import Cluster, load_cluster
from costmodel.collectives import dual_variant, resolve_variant
from costmodel.memory import PARTS, MemoryReport, optimizer_copies, program_memory, state_pieces
from costmodel.recompute import call_of_steps
from costmodel.simcache import SimulationCache
from costmodel.transfers import LocalBytes, Move, backward_move, forward_move, regathered
from hapc.errors import UserError
from hapc.ir.layout import Replicate, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute

DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass(slots=True)
class Event:
    """One priced step, for explanations: when it ran (slowest rank) and what it was.

    Not frozen: a simulation makes one per step (thousands), and a frozen dataclass's
    ``__init__`` costs four times a plain one's."""

    phase: str             # "fwd", "bwd", "grad_sync" or "optimizer"
    label: str             # node name, or "value: S(0) -> R"
    kind: str              # the aten op, a collective kind, or "local"
    variant: str
    start_seconds: float
    end_seconds: float


@dataclass
class SimResult:
    """Predicted time per iteration of a program on a cluster, and where each device spends it.

    ``memory`` is worked out on first use: the synthesizer simulates many programs that lose
    on time alone (a slower program never beats one that fits, whatever its own memory), and
    the memory model is a quarter of a simulation. The report is the same either way."""

    cluster: Cluster
    shares: tuple[float, ...]
    iteration_seconds: float
    compute_seconds: list[float]
    comm_seconds: list[float]
    idle_seconds: list[float]
    forward_seconds: float
    backward_seconds: float
    grad_sync_seconds: float            # total duration of the gradient all-reduces
    exposed_grad_sync_seconds: float    # the part after the last backward compute
    lower_bound_seconds: float
    events: list[Event] = field(default_factory=list, repr=False)
    # The report once made, or what makes it: (program, optimizer, rank classes).
    _memory: MemoryReport | None = field(default=None, repr=False, compare=False)
    _memory_inputs: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def memory(self) -> MemoryReport:
        if self._memory is None:
            program, optimizer, classes, pieces = self._memory_inputs
            self._memory = program_memory(program, self.cluster, optimizer, classes, pieces)
            self._memory_inputs = None
        return self._memory

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its memory report made (so a copy needs no program)."""
        self.memory  # noqa: B018 - made on first use
        return dict(self.__dict__)

    @property
    def peak_memory_bytes(self) -> list[float]:
        return self.memory.totals

    @property
    def fits(self) -> bool:
        return self.memory.all_fit

    @property
    def gap(self) -> float:
        """Iteration time over the lower bound (1.0 would be perfect)."""
        return self.iteration_seconds / self.lower_bound_seconds if self.lower_bound_seconds > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers for plan.json and reports (seconds and bytes, cluster order)."""
        return {
            "iteration_seconds": self.iteration_seconds, "lower_bound_seconds": self.lower_bound_seconds,
            "forward_seconds": self.forward_seconds, "backward_seconds": self.backward_seconds,
            "grad_sync_seconds": self.grad_sync_seconds,
            "exposed_grad_sync_seconds": self.exposed_grad_sync_seconds,
            "compute_seconds": list(self.compute_seconds), "comm_seconds": list(self.comm_seconds),
            "idle_seconds": list(self.idle_seconds), "peak_memory_bytes": list(self.peak_memory_bytes),
            "memory": [{p: getattr(d, p) for p in PARTS} for d in self.memory.devices],
            "fits": self.memory.fits,
        }

    def _rows(self, batch_rows: Sequence[int] | None = None) -> list[str]:
        """One table row per rank, without its rank and node columns."""
        ms = 1e3
        fits, peaks = self.memory.fits, self.peak_memory_bytes      # once, not once per row
        rows = []
        for r, dev in enumerate(self.cluster.devices):
            fit = "" if fits[r] else "  (does not fit)"
            held = "" if batch_rows is None else f" {batch_rows[r]:>5}"
            rows.append(f"{dev.type:<12} {self.shares[r]:6.3f}{held} {self.compute_seconds[r] * ms:11.3f} "
                        f"{self.comm_seconds[r] * ms:9.3f} {self.idle_seconds[r] * ms:9.3f} "
                        f"{peaks[r] / 1e9:10.3f} {dev.memory_bytes / 1e9:7.1f}{fit}")
        return rows

    def row_groups(self, rows: list[str] | None = None,
                   batch_rows: Sequence[int] | None = None) -> list[tuple[int, int]]:
        """(first rank, last rank + 1) of each row the per-device table shows: one per rank up to
        TABLE_ROWS_BEFORE_GROUPING devices, beyond that one per run of consecutive ranks whose rows
        read the same ("0-127" on nodes "0-15"): 256 identical rows hide what differs. The
        report's chart groups its bars the same way."""
        rows = self._rows(batch_rows) if rows is None else rows
        starts = list(range(len(rows)))
        if len(rows) > TABLE_ROWS_BEFORE_GROUPING:
            starts = [r for r in starts if r == 0 or rows[r] != rows[r - 1]]
        return list(zip(starts, [*starts[1:], len(rows)]))

    def _sync_kind(self) -> str:
        """How the gradients were synchronised: all-reduced, or under ZeRO reduce-scattered to
        each rank's rows and the updated rows all-gathered."""
        zero = any(e.phase == "grad_sync" and e.kind != "all_reduce" for e in self.events)
        return "reduce-scatter + all-gather (ZeRO)" if zero else "all-reduce"

    def table(self, batch_rows: Sequence[int] | None = None) -> str:
        """The time lines and the per-device table; ``batch_rows`` (the batch rows each rank
        computes, :func:`hapc.report.model.batch_rows`) adds a ``rows`` column beside the shares:
        a share is what the balancer asked for, the rows are what it became after rounding."""
        ms = 1e3
        lines = [
            (f"time per iteration {self.iteration_seconds * ms:.3f} ms  (forward {self.forward_seconds * ms:.3f}, "
             f"backward {self.backward_seconds * ms:.3f}; lower bound {self.lower_bound_seconds * ms:.3f} ms, "
             f"{self.gap:.2f}x)"),
            (f"gradient {self._sync_kind()} {self.grad_sync_seconds * ms:.3f} ms, "
             f"{self.exposed_grad_sync_seconds * ms:.3f} ms of it not hidden by backward"),
        ]
        rows = self._rows(batch_rows)
        starts = [a for a, _ in self.row_groups(rows)]
        ends = [*starts[1:], len(rows)]
        width = 4 if len(starts) == len(rows) else 7

        def span(first: int, last: int) -> str:
            return str(first) if first == last else f"{first}-{last}"

        held = "" if batch_rows is None else f" {'rows':>5}"
        lines.append(f"{'rank':>{width}} {'node':>{width}} {'device':<12} {'share':>6}{held} {'compute ms':>11} "
                     f"{'comm ms':>9} {'idle ms':>9} {'memory GB':>10} {'of GB':>7}")
        for a, b in zip(starts, ends):
            nodes = span(self.cluster.devices[a].node, self.cluster.devices[b - 1].node)
            lines.append(f"{span(a, b - 1):>{width}} {nodes:>{width}} {rows[a]}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        fit = "fits" if self.fits else "DOES NOT FIT"
        return (f"SimResult({self.iteration_seconds * 1e3:.3f} ms/iteration on {self.cluster.world} devices, "
                f"lower bound {self.lower_bound_seconds * 1e3:.3f} ms ({self.gap:.2f}x), "
                f"peak memory {max(self.peak_memory_bytes) / 1e9:.3g} GB, {fit})")


# Up to this many devices the table has one row per rank; beyond, one per run of alike ranks.
TABLE_ROWS_BEFORE_GROUPING = 32


def ahead(a: Any, b: Any) -> bool:
    """Whether candidate ``a`` beats ``b``: fitting beats not fitting, then the shorter
    iteration; ties keep ``b`` (the earlier one). Candidates have ``seconds`` and ``fits``
    (synthesize()'s and replan's do); a program no faster than one that fits loses whether it
    fits or not, so its ``fits`` (the memory model, worked out on demand) is not asked."""
    faster = a.seconds < b.seconds * (1 - 1e-9)
    if not faster and b.fits:
        return False
    if a.fits != b.fits:
        return a.fits
    return faster


class _Clock:
    """Timelines, one per class of alike ranks (:mod:`costmodel.classes`), plus the one
    network channel shared by all collectives."""

    def __init__(self, lanes: int) -> None:
        self.t = [0.0] * lanes
        self.compute = [0.0] * lanes
        self.comm = [0.0] * lanes
        self.idle = [0.0] * lanes
        self.channel_free = 0.0
        self.events: list[Event] = []

    def work(self, seconds: list[float], phase: str, label: str, kind: str) -> None:
        t, compute = self.t, self.compute
        start = max(t)
        for r, s in enumerate(seconds):
            t[r] += s
            compute[r] += s
        self.events.append(Event(phase, label, kind, "", start, max(t)))

    def collective(self, seconds: float, phase: str, label: str, kind: str, variant: str) -> None:
        """A blocking collective: wait for every rank (idle) and the channel (comm), then run."""
        arrive = max(self.t)
        start = max(arrive, self.channel_free)
        for r in range(len(self.t)):
            self.idle[r] += arrive - self.t[r]
            self.comm[r] += start - arrive + seconds
            self.t[r] = start + seconds
        self.channel_free = start + seconds
        self.events.append(Event(phase, label, kind, variant, start, start + seconds))


def simulate(program: DistProgram, cluster: Cluster | str | Mapping[str, Any], *,
             optimizer: str | int = "adamw", bucket_bytes: int = DEFAULT_BUCKET_BYTES,
             cache: SimulationCache | None = None) -> SimResult:
    """Time per iteration, per-device compute/communication/idle, memory and the lower bound.

    ``cluster`` may be a :class:`Cluster`, a cluster file path or a dict in the file's form.
    A program built for another number of devices is the user's mistake (``hapc simulate
    PLAN.json --cluster OTHER.yaml``): a one-line :class:`UserError`. ``cache`` carries prices
    from one simulation of the graph on the cluster to the next (:mod:`costmodel.simcache`;
    the same numbers without it, only slower); one for another pair is ignored.
    """
    cluster = load_cluster(cluster)
    if program.world != cluster.world:
        raise UserError(f"the plan runs on {program.world} devices but the cluster "
                        f"{cluster.name or cluster.source or ''} has {cluster.world}; plan for this cluster again")
    graph = program.graph
    if cache is None or not cache.serves(graph, cluster):
        cache = SimulationCache(graph, cluster)
    nodes = cache.nodes
    world = program.world
    # A copy of the program's lists for the memory model, which may run later, maybe after the
    # caller has appended to the original; its byte counts serve both.
    frozen = DistProgram(graph, program.shares, dict(program.source_layouts), list(program.steps),
                         program.state_shares, program.recompute, _blocks=program.blocks())
    pieces = LocalBytes(frozen)
    # One timeline per class of ranks the model cannot tell apart (costmodel.classes), copied
    # to every member at the end: the same floats as one timeline per rank.
    classes = rank_classes(program, cluster)
    reps = classes.representatives
    clock = _Clock(classes.count)
    backward_times: dict[int, list[float]] = {}

    # Ranks with equal capabilities (and measured op table, which goes by type) compute alike:
    # one key per class, made once.
    device_keys = [cache.device_key(r) for r in reps]
    lanes = list(zip(reps, device_keys))
    by_fractions: dict[tuple, tuple[list[float], list[float]]] = {}   # (node key, fractions) -> times
    fractions = _ClassFractions(program, reps, pieces)

    def times(step: Compute, node) -> tuple[list[float], list[float]]:
        """Forward and backward seconds of the step on each class."""
        fracs = fractions.of(step, node.outputs)
        node_key = cache.node_key(node)
        key = (node_key, fracs)
        hit = by_fractions.get(key)
        if hit is None:
            ts = [cache.node_time(node, node_key, r, dk, f) for (r, dk), f in zip(lanes, fracs)]
            hit = by_fractions[key] = ([t.fwd_seconds for t in ts], [t.bwd_seconds for t in ts])
        return hit

    # 1. forward
    chosen: dict[int, str] = {}            # the variant each collective ran, for its dual
    calls = call_of_steps(program)         # recomputed layers run their forward again in backward
    forward_times: dict[int, Any] = {}
    for i, step in enumerate(program.steps):
        if isinstance(step, Compute):
            node = nodes[step.node]
            fwd, backward_times[i] = times(step, node)
            if i in calls:
                forward_times[i] = fwd
            clock.work(fwd, "fwd", step.node, node.op)
            if step.strategy.local is not None:
                _run_internal(clock, cache, step, node, "fwd")
        else:
            chosen[i] = _run_move(clock, cache, forward_move(program, step, pieces), step, "fwd", step.method,
                                  reps)
    forward_end = max(clock.t)

    # 2-3. backward, with gradient all-reduces of Replicate parameters as they complete
    ready_at = _gradient_ready_steps(program)
    bucket: list[str] = []
    bucket_size = 0.0
    sync_total = 0.0

    def flush() -> None:
        nonlocal bucket, bucket_size, sync_total
        if not bucket:
            return
        kind, variant, seconds = _bucket_sync(cache, program, bucket_size)
        start = max(max(clock.t), clock.channel_free)
        clock.channel_free = start + seconds
        # What compute cannot hide takes the ranks' own time (gloo on the cores that compute).
        blocked = (1.0 - cluster.comm_overlap) * seconds
        for r in range(classes.count):
            clock.t[r] += blocked
            clock.comm[r] += blocked
        sync_total += seconds
        label = bucket[0] if len(bucket) == 1 else f"{bucket[0]} .. {bucket[-1]} ({len(bucket)} grads)"
        clock.events.append(Event("grad_sync", label, kind, variant, start, start + seconds))
        bucket, bucket_size = [], 0.0

    for i in range(len(program.steps) - 1, -1, -1):
        step = program.steps[i]
        call = calls.get(i)
        if call is not None and i == call.stop - 1:
            _recompute(clock, cache, program, pieces, call, forward_times, chosen, reps)
        if isinstance(step, Compute):
            node = nodes[step.node]
            clock.work(backward_times[i], "bwd", step.node, node.op)
            if step.strategy.local is not None:
                _run_internal(clock, cache, step, node, "bwd")
            if step.strategy.local == SFB_LOCAL and world > 1:
                _factor_gather(clock, cache, pieces, step, node)
        else:
            if regathered(program, step) and call is None:     # ZeRO-3: gathered again for backward
                _run_move(clock, cache, forward_move(program, step, pieces), step, "bwd", chosen.get(i, step.method),
                          reps)
            _run_move(clock, cache, backward_move(program, step, pieces), step, "bwd", chosen.get(i, step.method),
                      reps)
        for param in ready_at.get(i, []):
            bucket.append(param)
            bucket_size += cache.whole_bytes(param)
            if bucket_size >= bucket_bytes:
                flush()
    flush()
    backward_end = max(clock.t)

    # Wait for the last gradient all-reduce: covered time is communication, gaps are idle.
    sync_events = [e for e in clock.events if e.phase == "grad_sync"]
    end = max([clock.channel_free, *clock.t]) if sync_events else max(clock.t)
    for r in range(classes.count):
        if clock.t[r] < end and sync_events:
            covered = sum(max(0.0, min(e.end_seconds, end) - max(e.start_seconds, clock.t[r])) for e in sync_events)
            clock.comm[r] += covered
            clock.idle[r] += end - clock.t[r] - covered
            clock.t[r] = end
    exposed = max(0.0, end - backward_end) if sync_events else 0.0

    # 4. optimizer step
    clock.work(_optimizer_seconds(program, cluster, optimizer, reps, cache, pieces), "optimizer", "optimizer step", "elementwise")

    iteration = max(clock.t)
    for r in range(classes.count):
        clock.idle[r] += iteration - clock.t[r]
    return SimResult(
        cluster=cluster, shares=tuple(program.shares), iteration_seconds=iteration,
        compute_seconds=classes.expand(clock.compute), comm_seconds=classes.expand(clock.comm),
        idle_seconds=classes.expand(clock.idle),
        forward_seconds=forward_end, backward_seconds=backward_end - forward_end,
        grad_sync_seconds=sync_total, exposed_grad_sync_seconds=exposed,
        lower_bound_seconds=cache.lower_bound_seconds(), events=clock.events,
        _memory_inputs=(frozen, optimizer, classes, pieces))


def _fractions(program: DistProgram, step: Compute, outputs: tuple[str, ...],
               ranks: Sequence[int] | None = None) -> list[float]:
    """Each of ``ranks``' (default: every rank's) share of a Compute's work: local over global
    length of its sharded dimension."""
    if ranks is None:
        ranks = range(program.world)
    pairs = list(zip(step.inputs, step.strategy.inputs)) + list(zip(outputs, step.strategy.outputs))
    for name, layout in pairs:
        if isinstance(layout, Shard):
            d = program._dim(name, layout.dim)
            length = program.shape(name)[d]
            if length > 0:
                lengths = program.lengths(name, d)
                return [lengths[r] / length for r in ranks]
    return [1.0] * len(ranks)


class _ClassFractions:
    """:func:`_fractions` for the representatives of the rank classes, remembered by what it
    depends on (the sharded dimension's length and block count), so the steps of repeated
    layers share one tuple."""

    def __init__(self, program: DistProgram, reps: Sequence[int], pieces: LocalBytes) -> None:
        self.program, self.reps = program, reps
        self.blocks = program.blocks()
        self.size = pieces.size            # (bytes, shape) by value name, remembered
        self.whole = (1.0,) * len(reps)
        self.known: dict[tuple[int, int], tuple[float, ...]] = {}

    def of(self, step: Compute, outputs: tuple[str, ...]) -> tuple[float, ...]:
        strategy = step.strategy
        for names, layouts in ((step.inputs, strategy.inputs), (outputs, strategy.outputs)):
            for name, layout in zip(names, layouts):
                if isinstance(layout, Shard):
                    shape = self.size(name)[1]
                    d = layout.dim + len(shape) if layout.dim < 0 else layout.dim
                    length = shape[d]
                    if length > 0:
                        key = (length, self.blocks.get((name, d), length))
                        hit = self.known.get(key)
                        if hit is None:
                            lengths = self.program.lengths(name, d)
                            hit = self.known[key] = tuple(lengths[r] / length for r in self.reps)
                        return hit
        return self.whole


def _run_move(clock: _Clock, cache: SimulationCache, move: Move | None, step: Redistribute, phase: str,
              method: str, reps: Sequence[int]) -> str:
    """Price one move; returns the variant it ran ("auto" for none).

    The backward runs the variant its forward ran (``method``), as the emitted program's
    collectives do (each autograd dual takes its forward's method), not the cheapest one for
    the gradient's own sizes.
    """
    if move is None:
        return "auto"
    label = f"{step.src}: {step.src_layout!r} -> {step.dst_layout!r}"
    cluster = cache.cluster
    if move.kind == "local":
        hbm = cluster.efficiency["hbm"]
        clock.work([move.piece_bytes[r] / (cluster.devices[r].hbm_bandwidth_Bps * hbm) for r in reps],
                   phase, label, "local")
        return "auto"
    matrix = move.send_matrix
    if phase == "bwd":
        method = dual_variant(move.kind, method)
    if method == "auto":
        variant, seconds = cache.best(move.kind, move.piece_bytes, matrix)
    else:
        variant = resolve_variant(move.kind, method)
        seconds = cache.seconds(move.kind, move.piece_bytes, variant, matrix)
    clock.collective(seconds, phase, label, move.kind, variant)
    return variant


def _recompute(clock: _Clock, cache: SimulationCache, program: DistProgram, pieces: LocalBytes, call,
               forward_times: Mapping[int, Any], chosen: Mapping[int, str], reps: Sequence[int]) -> None:
    """A recomputed call's forward again, at the start of its backward (costmodel.recompute)."""
    nodes = cache.nodes
    for j in range(call.start, call.stop):
        step = program.steps[j]
        if isinstance(step, Compute):
            node = nodes[step.node]
            clock.work(forward_times[j], "bwd", f"{step.node} (recomputed)", node.op)
            if step.strategy.local is not None:
                _run_internal(clock, cache, step, node, "fwd")
        else:
            _run_move(clock, cache, forward_move(program, step, pieces), step, "bwd", chosen.get(j, step.method), reps)


def _run_internal(clock: _Clock, cache: SimulationCache, step: Compute, node, phase: str) -> None:
    """The all-reduces a local op runs inside itself (:mod:`costmodel.internal`)."""
    world = cache.cluster.world
    if world <= 1 or step.strategy.local is None:
        return
    fwd, bwd = cache.internal(step.strategy.local, node)
    for nbytes in fwd if phase == "fwd" else bwd:
        variant, seconds = cache.best("all_reduce", [nbytes] * world)
        clock.collective(seconds, phase, f"{step.node}: inside {step.strategy.local}", "all_reduce", variant)


def _gradient_ready_steps(program: DistProgram) -> dict[int, list[str]]:
    """Trainable Replicate parameters, keyed by the index of the step of their first use.

    In backward (steps reversed) that step runs last among the parameter's uses, so the
    gradient is complete right after it. Unused parameters get no all-reduce.
    """
    graph = program.graph
    if program.world <= 1:
        return {}
    wanted = {p for p in graph.params if graph.values[p].requires_grad
              and isinstance(program.source_layouts.get(p, _REPLICATE), Replicate)}
    # One pass over the steps finds both every first use and the parameters only
    # sufficient-factor steps read (factor_synced_params), which are then left out.
    params = set(graph.params)
    first: dict[str, int] = {}
    by_factors: set[str] = set()
    by_others: set[str] = set()
    for i, step in enumerate(program.steps):
        if isinstance(step, Compute):
            reads = step.inputs
            seen = by_factors if step.strategy.local == SFB_LOCAL else by_others
        else:
            reads, seen = (step.src,), by_others
        for name in reads:
            if name in params:
                seen.add(name)
                if name in wanted and name not in first:
                    first[name] = i
    synced_by_factors = by_factors - by_others
    out: dict[int, list[str]] = {}
    for p in graph.params:          # parameter order, for a deterministic bucket order
        if p in first and p not in synced_by_factors:
            out.setdefault(first[p], []).append(p)
    return out


SFB_LOCAL = "linear_sfb"
_REPLICATE = Replicate()          # the layout of a source the program does not name (read only)


def factor_synced_params(program: DistProgram) -> set[str]:
    """Parameters read only by sufficient-factor-broadcasting steps: their gradients are
    rebuilt whole on every rank from gathered factors, so they need no all-reduce."""
    sfb: set[str] = set()
    other: set[str] = set()
    params = set(program.graph.params)
    for step in program.steps:
        reads = step.inputs if isinstance(step, Compute) else (step.src,)
        target = sfb if isinstance(step, Compute) and step.strategy.local == SFB_LOCAL else other
        target.update(r for r in reads if r in params)
    return sfb - other


def _factor_gather(clock: _Clock, cache: SimulationCache, pieces: LocalBytes, step: Compute, node) -> None:
    """The backward of a sufficient-factor step: gather the input and output-gradient pieces."""
    pieces_x = pieces(step.inputs[0], step.strategy.inputs[0])
    pieces_y = pieces(node.outputs[0], step.strategy.outputs[0])
    for pieces in (pieces_x, pieces_y):
        variant, seconds = cache.best("all_gather", pieces)
        clock.collective(seconds, "bwd", f"{step.node}: sufficient factors", "all_gather", variant)


def _bucket_sync(cache: SimulationCache, program: DistProgram, nbytes: float) -> tuple[str, str, float]:
    """(kind, variant, seconds) of synchronising one bucket of ``nbytes`` of gradients: an
    all-reduce, or under ZeRO (``state_shares``) a reduce-scatter to each rank's rows and, after
    the step, the all-gather of the updated rows (uneven pieces when the shares are)."""
    if program.state_shares is None:
        return ("all_reduce", *cache.best("all_reduce", [nbytes] * program.world))
    pieces = [nbytes * z for z in program.state_shares]
    scatter, t_scatter = cache.best("reduce_scatter", pieces)
    gather, t_gather = cache.best("all_gather", pieces)
    return "reduce_scatter+all_gather", f"{scatter}+{gather}", t_scatter + t_gather


def _optimizer_seconds(program: DistProgram, cluster: Cluster, optimizer: str | int,
                       reps: Sequence[int], cache: SimulationCache | None = None,
                       pieces: LocalBytes | None = None) -> list[float]:
    """Memory-bound update of each rank's local trainable parameters.

    Per element it reads the parameter, its gradient and each state copy, and writes the
    parameter and each state copy: ``3 + 2 * copies`` accesses (7 for AdamW).
    """
    accesses = 3 + 2 * optimizer_copies(optimizer)
    graph = program.graph
    pieces_of = pieces or LocalBytes(program)
    local = [0.0] * len(reps)
    for p in graph.params:
        if graph.values[p].requires_grad:
            layout = program.source_layouts.get(p, _REPLICATE)
            if cache is not None and not isinstance(layout, Shard):     # whole on every rank
                piece = [cache.whole_bytes(p)] * program.world
            else:
                piece = pieces_of(p, layout)
            piece = state_pieces(program, p, piece)             # ZeRO: its rows only
            for c, r in enumerate(reps):
                local[c] += piece[r]
    out = []
    for c, dev in enumerate(cluster.devices[r] for r in reps):
        nbytes = local[c] * accesses
        bw = dev.hbm_bandwidth_Bps * cluster.efficiency["hbm"]
        out.append(nbytes / bw + (cluster.launch_latency_seconds if nbytes > 0 else 0.0))
    return out
