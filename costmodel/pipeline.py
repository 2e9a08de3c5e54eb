"""Pipeline stages priced: per-node costs of a group's program, a stage's slice of them, and
the schedule (1F1B or GPipe) that runs the stages over micro-batches.

**A stage's cost from its group's program.** A stage runs nodes ``[first, stop)`` of the
graph on a device group with that group's SPMD program (found by the A* + LP on the group as
a cluster of its own, :mod:`costmodel.groups`). :func:`profile_program` prices that program
*once* per node and per micro-batch count, as the simulator does (roofline per rank,
collectives blocking, gradient all-reduce, optimizer), and keeps prefix sums, so any node range
on that group is priced in O(1): the stage planner asks for thousands of ranges and each costs
two subtractions. A layout change is charged to the node that consumes it.

**Micro-batches.** With ``m`` micro-batches a node that depends on the batch does ``1/m`` of its
work per micro-batch (FLOPs and bytes; the kernel launch stays whole), and a collective of a
batch-dependent value moves ``1/m`` of its bytes (the latency stays whole). Work that does not
depend on the batch (a weight transpose, the position ids) runs whole for every micro-batch.
Gradient all-reduces and the optimizer run once per iteration.

**The schedule.** Stages ``s = 0..S-1`` take ``w_s = f_s + b_s`` per micro-batch; between
stage ``k-1`` and ``k`` the boundary activations go forward and their gradients back over the
link between the groups (``x_k``, a point-to-point send, treated as a pipeline stage of its
own; the part compute cannot hide, ``1 - comm_overlap``, is added to both stages' steps). With ``m`` micro-batches:

    1F1B:  T_pipe = sum(w) + sum(x) + (m - 1) * max(w ∪ x)
    GPipe: T_pipe = sum(f) + sum(x_f) + (m - 1) * max(f ∪ x_f) + the same for backward

Stage ``s`` finishes its last backward ``sum_{k<s}(b_k + x_k^bwd)`` before the pipeline does;
then its gradient all-reduce (the part its last micro-batch's backward could not hide) and its
optimizer step run, so the iteration is ``max_s`` of those ends. 1F1B keeps at most
``min(m, S - s)`` micro-batches' activations on stage ``s``; GPipe keeps all ``m``. The bubble
fraction is the share of ``S * T_pipe`` during which stages wait.

Parameters read by two stages (a language model's head tied to its embedding) are held by
both; their gradients are summed across the two groups over the link between them after the
last backward.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from costmodel.cluster import Cluster, Link
from costmodel.memory import cast_weights, kept_for_backward, optimizer_copies, saved_extra, state_pieces, \
    zero_buffer_bytes, zero_sync_factor
from costmodel.recompute import call_of_steps, saved_inputs
from costmodel.simcache import SimulationCache
from costmodel.simulator import SFB_LOCAL, _ClassFractions, factor_synced_params
from costmodel.transfers import LocalBytes, backward_move, forward_move, local_bytes, regathered
from hapc.ir.batch import batch_values
from hapc.ir.graph import Graph
from hapc.ir.layout import Replicate
from hapc.ir.program import Compute, DistProgram, Redistribute

SCHEDULES = ("1f1b", "gpipe")


def batch_dependent_values(graph: Graph) -> set[str]:
    """Values computed from a model input: they shrink with the micro-batch."""
    return set(graph_facts(graph).batch)


@dataclass
class ProgramProfile:
    """A group's program priced per node, as prefix sums (index ``i`` = nodes ``[0, i)``).

    Per micro-batch: ``fwd_compute``/``bwd_compute`` per rank (``[n+1, world]``) and the
    blocking collectives ``fwd_comm``/``bwd_comm`` (``[n+1]``). Per iteration: the bytes of
    gradients to all-reduce (``grad_sync_bytes``), each rank's optimizer seconds and its
    parameter + gradient + optimizer-state bytes (``static_bytes``); per micro-batch, each
    rank's activation bytes kept for backward (``activation_bytes``). A parameter is charged
    to the node that reads it first; for a parameter read by two or more nodes (a head tied
    to its embedding), ``param_uses`` lists them, for stages that share it.
    """

    cluster: Cluster
    microbatches: int
    fwd_compute: np.ndarray
    bwd_compute: np.ndarray
    fwd_comm: np.ndarray
    bwd_comm: np.ndarray
    grad_sync_bytes: np.ndarray
    optimizer_seconds: np.ndarray
    static_bytes: np.ndarray
    activation_bytes: np.ndarray
    param_first_use: dict[str, int]
    param_uses: dict[str, list[int]]
    param_static_bytes: dict[str, np.ndarray]
    param_grad_bytes: dict[str, float]
    # Recomputed layer calls (costmodel.recompute): each call's first node and, per rank, the
    # activations it holds while backward reruns it, one micro-batch's. A stage holds its
    # largest call's once, whatever the micro-batches in flight (one call reruns at a time).
    call_nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    call_bytes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    def range_seconds(self, first: int, stop: int) -> tuple[float, float]:
        """(forward, backward) seconds of one micro-batch through nodes ``[first, stop)``:
        the slowest rank's compute plus the collectives every rank waits for."""
        f = float(np.max(self.fwd_compute[stop] - self.fwd_compute[first])) + float(self.fwd_comm[stop] - self.fwd_comm[first])
        b = float(np.max(self.bwd_compute[stop] - self.bwd_compute[first])) + float(self.bwd_comm[stop] - self.bwd_comm[first])
        return f, b


@dataclass(frozen=True)
class GraphFacts:
    """What every group's pricer asks of the graph, found once per graph: node positions, the
    values that shrink with the micro-batch, the nodes whose outputs do, which nodes read
    each parameter, buffer and input, and what each node reads (``refs``, in node order)."""

    index: dict[str, int]
    nodes: dict[str, Any]
    batch: set[str]
    scaled: list[bool]
    uses: dict[str, list[int]]
    refs: list[tuple[str, ...]]


_FACTS: dict[int, tuple[weakref.ref, GraphFacts]] = {}


def graph_facts(graph: Graph) -> GraphFacts:
    """:class:`GraphFacts` of ``graph``, cached while the graph lives (a stage planner prices
    one graph on many groups)."""
    hit = _FACTS.get(id(graph))
    if hit is not None and hit[0]() is graph:
        return hit[1]
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    refs = [tuple(node.input_refs()) for node in graph.nodes]
    batch = batch_values(graph)
    uses: dict[str, list[int]] = {}
    for i, reads in enumerate(refs):
        for ref in reads:
            if graph.values[ref].kind in ("param", "buffer", "input"):
                uses.setdefault(ref, []).append(i)
    facts = GraphFacts(index, {node.name: node for node in graph.nodes}, batch,
                       [any(o in batch for o in node.outputs) for node in graph.nodes], uses, refs)
    for key in [k for k, (ref, _) in _FACTS.items() if ref() is None]:
        del _FACTS[key]
    _FACTS[id(graph)] = (weakref.ref(graph), facts)
    return facts


def profile_program(program: DistProgram, cluster: Cluster, microbatches: int = 1,
                    optimizer: str | int = "adamw") -> ProgramProfile:
    """Price every node of ``program`` on ``cluster`` (its group) for ``microbatches``."""
    return ProgramPricer(program, cluster, optimizer).profile(microbatches)


class ProgramPricer:
    """What a group's program costs, taken apart once so that any micro-batch count is cheap.

    The roofline is linear in the work a rank does, so a node's time with ``1/m`` of the
    batch is its whole-batch time less the launch, over ``m``, plus the launch: the per-node
    times are computed once. Collectives are re-priced per ``m`` (the best variant may change
    with size); there are few of them.
    """

    def __init__(self, program: DistProgram, cluster: Cluster, optimizer: str | int = "adamw") -> None:
        self.program, self.cluster, self.optimizer = program, cluster, optimizer
        graph = program.graph
        n, world = len(graph.nodes), cluster.world
        self.n, self.world = n, world
        facts = graph_facts(graph)
        index, nodes, uses = facts.index, facts.nodes, facts.uses
        self.batch = batch = facts.batch
        # Per node and rank: whole-batch fwd/bwd seconds, launches inside them, batch-scaled or
        # not; gathered as Python rows per node (many small numpy updates cost more than the math).
        fwd_rows: dict[int, list[float]] = {}
        bwd_rows: dict[int, list[float]] = {}
        fwd_launches: dict[int, list[float]] = {}
        bwd_launches: dict[int, list[float]] = {}
        self.scaled = np.zeros(n, dtype=bool)
        # Collectives: (node index, phase, kind, pieces, matrix, scales with the batch)
        self.moves: list[tuple[int, str, str, tuple[float, ...], tuple | None, bool]] = []
        self.fixed_comm = np.zeros((n, 2))   # internal all-reduces (a few bytes; not scaled)
        launch = cluster.launch_latency_seconds
        # Repeated layers price alike: node times, a step's share of the work and collectives
        # are looked up by what they depend on (the simulator's own caches, the same floats).
        cache = self._cache = SimulationCache(graph, cluster)
        shares = _ClassFractions(program, range(world), LocalBytes(program))
        lanes = [(r, cache.device_key(r)) for r in range(world)]
        rows_of: dict[tuple, tuple[list[float], list[float], list[float], list[float]]] = {}
        pending: list[tuple[int, Redistribute]] = []
        calls = call_of_steps(program)     # recomputed layers: their forward again in backward

        def add_move(i: int, k: int, step: Redistribute) -> None:
            scales = step.src.split("@", 1)[0] in batch
            # In backward: a recomputed call's forward moves again, else ZeRO-3's gather again.
            again = forward_move(program, step) if k in calls or regathered(program, step) else None
            for move, phase in ((forward_move(program, step), "fwd"), (again, "bwd"),
                                (backward_move(program, step), "bwd")):
                if move is not None:
                    self.moves.append((i, phase, move.kind, move.piece_bytes, move.send_matrix, scales))

        def all_reduces_seconds(nbytes: list[float]) -> float:
            return sum(cache.best("all_reduce", [b] * world)[1] for b in nbytes)

        for k, step in enumerate(program.steps):
            if isinstance(step, Redistribute):
                pending.append((k, step))
                continue
            i = index[step.node]
            node = nodes[step.node]
            for r_k, r_step in pending:
                add_move(i, r_k, r_step)
            pending = []
            self.scaled[i] = facts.scaled[i]
            node_key = cache.node_key(node)
            fracs = shares.of(step, node.outputs)
            priced = rows_of.get((node_key, fracs))
            if priced is None:
                times = [cache.node_time(node, node_key, r, dk, f) for (r, dk), f in zip(lanes, fracs)]
                f_row, b_row = [t.fwd_seconds for t in times], [t.bwd_seconds for t in times]
                priced = rows_of[(node_key, fracs)] = (f_row, b_row, [launch if x > 0 else 0.0 for x in f_row],
                                                       [launch if x > 0 else 0.0 for x in b_row])
            if k in calls:               # recomputed: backward runs the forward first
                priced = (priced[0], [a + b for a, b in zip(priced[0], priced[1])], priced[2],
                          [a + b for a, b in zip(priced[2], priced[3])])
            for rows, launches, row, here in ((fwd_rows, fwd_launches, priced[0], priced[2]),
                                              (bwd_rows, bwd_launches, priced[1], priced[3])):
                if i in rows:            # a node priced by two steps: add up
                    row = [a + b for a, b in zip(rows[i], row)]
                    here = [a + b for a, b in zip(launches[i], here)]
                rows[i], launches[i] = row, here
            if world > 1:
                fwd_b, bwd_b = cache.internal(step.strategy.local, node)
                if fwd_b:
                    self.fixed_comm[i, 0] += all_reduces_seconds(fwd_b)
                if bwd_b:
                    self.fixed_comm[i, 1] += all_reduces_seconds(bwd_b)
                if step.strategy.local == SFB_LOCAL:
                    for name, lay in ((step.inputs[0], step.strategy.inputs[0]),
                                      (node.outputs[0], step.strategy.outputs[0])):
                        self.moves.append((i, "bwd", "all_gather", tuple(local_bytes(program, name, lay)), None,
                                           bool(self.scaled[i])))
        for r_k, r_step in pending:
            add_move(n - 1, r_k, r_step)

        def per_node(rows: dict[int, list[float]]) -> np.ndarray:
            out = np.zeros((n, world))
            if rows:
                at = np.fromiter(rows, dtype=np.int64, count=len(rows))
                out[at] = np.array(list(rows.values()), dtype=float).reshape(len(rows), world)
            return out

        self.fwd, self.bwd = per_node(fwd_rows), per_node(bwd_rows)
        self.fwd_launch, self.bwd_launch = per_node(fwd_launches), per_node(bwd_launches)

        # Activations kept for backward, per whole batch, charged to the node that makes them.
        act_rows: dict[int, list[float]] = {}
        fixed_rows: dict[int, list[float]] = {}
        # A recomputed call's own activations live one call at a time (costmodel.recompute).
        call_rows: dict[tuple[int, bool], dict[int, list[float]]] = {}

        def charge(k: int, i: int, scaled: bool, piece: list[float]) -> None:
            call = calls.get(k)
            rows = (act_rows if scaled else fixed_rows) if call is None else \
                call_rows.setdefault((call.start, scaled), {})
            rows[i] = [a + b for a, b in zip(rows[i], piece)] if i in rows else list(piece)

        cast: set[str] = set()
        for k, step in enumerate(program.steps):
            if isinstance(step, Compute):
                node, i = nodes[step.node], index[step.node]
                for out, lay, times in kept_for_backward(program, node, step):
                    charge(k, i, out in batch, [times * b for b in local_bytes(program, out, lay)])
                extra = saved_extra(graph, node, step)
                if extra is not None:                   # its own saved tensors (costmodel.memory)
                    charge(k, i, node.outputs[0] in batch,
                           [extra[2] * b for b in local_bytes(program, extra[0], extra[1])])
                # autocast's low-precision copies of float32 weights: one per micro-batch in flight
                for param, lay in cast_weights(program, node, step, cast):
                    charge(k, i, False, [0.5 * b for b in local_bytes(program, param, lay)])
        self.call_nodes, self.call_act, self.call_fixed = np.zeros(0, dtype=np.int64), np.zeros((0, world)), \
            np.zeros((0, world))
        if call_rows:
            self._charge_recomputed(program, calls, call_rows, act_rows, fixed_rows, index, batch)
        self.act, self.act_fixed = per_node(act_rows), per_node(fixed_rows)

        # Parameters: who reads them, what they hold, what their gradients and optimizer cost.
        copies = optimizer_copies(optimizer)
        accesses = 3 + 2 * copies
        synced_by_factors = factor_synced_params(program)
        hbm_Bps = np.array([d.hbm_bandwidth_Bps for d in cluster.devices]) * cluster.efficiency["hbm"]
        self.static = np.zeros((n, world))
        self.opt = np.zeros((n, world))
        self.grad = np.zeros(n)
        self.first_use: dict[str, int] = {}
        self.param_uses: dict[str, list[int]] = {}
        self.param_static: dict[str, np.ndarray] = {}
        self.param_grad: dict[str, float] = {}
        for name in graph.params + graph.buffers + graph.inputs:
            if name not in uses:
                continue
            i = uses[name][0]
            layout = program.source_layouts.get(name, Replicate())
            piece = np.array(local_bytes(program, name, layout))
            value = graph.values[name]
            if value.kind == "input":
                self.act[i] += piece
                continue
            held = piece.copy()
            if value.requires_grad:
                # ZeRO-1 under micro-batches: the gradients accumulate whole, the optimizer
                # state and its update are the rank's rows only (state_shares, synth.zero).
                state = np.array(state_pieces(program, name, piece))
                held += piece + state * copies
                self.opt[i] += np.where(state > 0, state * accesses / hbm_Bps + cluster.launch_latency_seconds, 0.0)
                if isinstance(layout, Replicate) and world > 1 and name not in synced_by_factors:
                    self.grad[i] += piece[0] * zero_sync_factor(program)
                    if len(uses[name]) > 1:
                        self.param_grad[name] = float(piece[0])
            self.static[i] += held
            if value.kind == "param" and len(uses[name]) > 1:      # only a shared one can be in two stages
                self.first_use[name] = i
                self.param_uses[name] = uses[name]
                self.param_static[name] = held
        if n:
            self.static[0] += zero_buffer_bytes(program)     # ZeRO's buckets in flight, if any

    def _charge_recomputed(self, program: DistProgram, calls: dict, call_rows: dict, act_rows: dict,
                           fixed_rows: dict, index: dict[str, int], batch: set[str]) -> None:
        """Recomputed calls keep their inputs (charged to each call's first node, per micro-batch
        in flight) and, while backward reruns one, that call's activations: kept apart per call
        (``call_nodes``, ``call_act``, ``call_fixed``), for a stage to hold its largest once."""
        layouts = program.layouts()
        first_node = {}
        for k, call in calls.items():
            step = program.steps[k]
            if isinstance(step, Compute):
                first_node.setdefault(call.start, index[step.node])
        for call in {c.start: c for c in calls.values()}.values():
            for name in saved_inputs(program, call):
                rows = act_rows if name.split("@", 1)[0] in batch else fixed_rows
                i = first_node[call.start]
                piece = list(local_bytes(program, name, layouts[name]))
                rows[i] = [a + b for a, b in zip(rows[i], piece)] if i in rows else piece
        starts = sorted(first_node)
        zero = [0.0] * self.world

        def held(start: int, scaled: bool) -> list[float]:
            per = call_rows.get((start, scaled))
            return list(np.sum(list(per.values()), axis=0)) if per else zero

        self.call_nodes = np.array([first_node[s] for s in starts], dtype=np.int64)
        self.call_act = np.array([held(s, True) for s in starts], dtype=float).reshape(len(starts), self.world)
        self.call_fixed = np.array([held(s, False) for s in starts], dtype=float).reshape(len(starts), self.world)

    def profile(self, microbatches: int) -> ProgramProfile:
        m = max(1, int(microbatches))
        per = np.where(self.scaled[:, None], 1.0 / m, 1.0)
        fwd_c = (self.fwd - self.fwd_launch) * per + self.fwd_launch
        bwd_c = (self.bwd - self.bwd_launch) * per + self.bwd_launch
        comm = self.fixed_comm.copy()
        for i, phase, kind, pieces, matrix, scales in self.moves:
            s = 1.0 / m if scales else 1.0
            sized = [b * s for b in pieces]
            if kind == "local":
                for r, dev in enumerate(self.cluster.devices):
                    target = fwd_c if phase == "fwd" else bwd_c
                    target[i, r] += sized[r] / (dev.hbm_bandwidth_Bps * self.cluster.efficiency["hbm"])
                continue
            mat = None if matrix is None else [[b * s for b in row] for row in matrix]
            comm[i, 0 if phase == "fwd" else 1] += self._cache.best(kind, sized, mat)[1]
        act = self.act / m + self.act_fixed

        def prefix(a: np.ndarray) -> np.ndarray:
            return np.concatenate([np.zeros((1,) + a.shape[1:]), np.cumsum(a, axis=0)])

        return ProgramProfile(self.cluster, m, prefix(fwd_c), prefix(bwd_c), prefix(comm[:, 0]), prefix(comm[:, 1]),
                              prefix(self.grad), prefix(self.opt), prefix(self.static), prefix(act),
                              self.first_use, self.param_uses, self.param_static, self.param_grad,
                              self.call_nodes, self.call_act / m + self.call_fixed)


def boundary_bytes(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Bytes of activations live across each cut ``i`` (produced before node ``i``, read at or
    after it), forward and the part that carries a gradient back: index ``i`` in ``[0, n]``."""
    n = len(graph.nodes)
    produced: dict[str, int] = {}
    last_use: dict[str, int] = {}
    for i, (node, reads) in enumerate(zip(graph.nodes, graph_facts(graph).refs)):
        for out in node.outputs:
            produced[out] = i
        for ref in reads:
            last_use[ref] = i
    fwd = np.zeros(n + 1)
    bwd = np.zeros(n + 1)
    for value, p in produced.items():
        last = last_use.get(value, p)
        if last > p:
            nbytes = graph.meta(value).nbytes
            fwd[p + 1:last + 1] += nbytes
            if graph.values[value].requires_grad:
                bwd[p + 1:last + 1] += nbytes
    return fwd, bwd


@dataclass(frozen=True)
class StageCost:
    """One stage of a pipeline as the schedule sees it (seconds per micro-batch unless named)."""

    fwd_seconds: float
    bwd_seconds: float
    send_fwd_seconds: float          # activations to the next stage (0 for the last)
    send_bwd_seconds: float          # their gradients back from the next stage
    grad_sync_seconds: float         # the group's gradient all-reduce, once per iteration
    tail_seconds: float              # optimizer step + shared-parameter gradient exchange
    static_bytes: tuple[float, ...]  # per rank of the group: parameters, gradients, optimizer state
    activation_bytes: tuple[float, ...]   # per rank, one micro-batch's activations kept for backward


@dataclass(frozen=True)
class ScheduleCost:
    iteration_seconds: float
    pipeline_seconds: float           # fill + steady state + drain, before the tails
    bubble_fraction: float
    stage_end_seconds: tuple[float, ...]
    inflight: tuple[int, ...]         # micro-batches whose activations stage s holds at once
    stage_memory_bytes: tuple[tuple[float, ...], ...]


def inflight_microbatches(schedule: str, stages: int, microbatches: int, stage: int) -> int:
    """How many micro-batches' activations stage ``stage`` keeps at its peak."""
    if schedule == "gpipe":
        return microbatches
    return min(microbatches, stages - stage)


def schedule_cost(stages: Sequence[StageCost], microbatches: int, schedule: str = "1f1b",
                  comm_overlap: float = 1.0) -> ScheduleCost:
    """Iteration time, bubble and per-stage peak memory of ``stages`` under ``schedule``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    m = max(1, microbatches)
    s_count = len(stages)
    xf = [s.send_fwd_seconds for s in stages[:-1]]
    xb = [s.send_bwd_seconds for s in stages[:-1]]
    # What compute cannot hide of a send (gloo on the cores that compute) delays both ends.
    blocked = 1.0 - comm_overlap
    f = [s.fwd_seconds + blocked * ((xf[k] if k < s_count - 1 else 0.0) + (xf[k - 1] if k else 0.0))
         for k, s in enumerate(stages)]
    b = [s.bwd_seconds + blocked * ((xb[k] if k < s_count - 1 else 0.0) + (xb[k - 1] if k else 0.0))
         for k, s in enumerate(stages)]
    if schedule == "1f1b":
        steps = [fi + bi for fi, bi in zip(f, b)] + [a + c for a, c in zip(xf, xb)]
        pipe = sum(steps) + (m - 1) * max(steps)
    else:
        pipe = sum(f) + sum(xf) + (m - 1) * max(f + xf) + sum(b) + sum(xb) + (m - 1) * max(b + xb)
    ends = []
    drained = 0.0
    for k, st in enumerate(stages):
        hidden = min(st.grad_sync_seconds, st.bwd_seconds) * comm_overlap
        ends.append(pipe - drained + (st.grad_sync_seconds - hidden) + st.tail_seconds)
        if k < s_count - 1:
            drained += b[k] + xb[k]
    busy = m * sum(fi + bi for fi, bi in zip(f, b))
    bubble = max(0.0, 1.0 - busy / (s_count * pipe)) if pipe > 0 else 0.0
    inflight = tuple(inflight_microbatches(schedule, s_count, m, k) for k in range(s_count))
    memory = tuple(tuple(a + n_in * c for a, c in zip(st.static_bytes, st.activation_bytes))
                   for st, n_in in zip(stages, inflight))
    return ScheduleCost(max(ends), pipe, bubble, tuple(ends), inflight, memory)


def send_seconds(link: Link | None, nbytes: float) -> float:
    """One point-to-point transfer of ``nbytes`` over ``link`` (free inside one group)."""
    if link is None or nbytes <= 0:
        return 0.0
    return link.seconds(nbytes)
