"""The stage planner: pipeline stages chosen jointly with each stage's uneven SPMD program.

A pipelined plan is a plan of plans. Stages are contiguous node ranges of the graph, each on
a device group; inside a group the existing A* + share LP finds the SPMD program (uneven
shares included), priced on the group as a cluster of its own. The planner chooses

* the **groups**: a node, an equal part of one (halves, quarters on small clusters), or a run
  of identical whole nodes; stages take groups in the cluster's node order or the reverse;
* the **cuts**: positions between nodes of the graph where few activation bytes are live
  (between transformer blocks, say), since everything live crosses the link;
* the **micro-batch count** (powers of two that leave every group member a sample) and the
  schedule (1F1B; GPipe when it fits and is faster).

**Memoised pricing.** Each distinct group (same devices and links, wherever it sits) is
synthesised once, for the whole graph; :func:`costmodel.pipeline.profile_program` prices its
program per node and keeps prefix sums, so a layer range on that group costs two
subtractions. The group's program is chosen for speed with memory left unbounded; memory is
checked per stage for the layers it holds and the micro-batches in flight.

**Search.** For a cap ``B`` on the slowest pipeline step, a DP over (stages left, first device
position, first cut) minimises the sum of stage and transfer steps subject to every step
<= ``B`` and every stage fitting its memory with ``min(m, stages left)`` micro-batches in flight
(1F1B); the iteration is about ``sum + (m - 1) * max``, so sweeping ``B`` over the distinct
step values explores the trade-off. Each DP optimum is then priced exactly by
:func:`costmodel.pipeline.schedule_cost` (gradient sync, optimizer tails, both schedules) and
the fastest that fits wins. The result is the optimum of the swept caps, not a proven optimum
of the whole space; the caller keeps the one-stage plan over all devices as a candidate, so a
pipelined plan is only chosen when it is predicted faster.

Deterministic: groups, cuts and caps are enumerated in fixed orders and ties keep the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from costmodel.cluster import Cluster, Link
from costmodel.collectives import best_variant
from costmodel.groups import group_key, link_between, sub_cluster
from costmodel.pipeline import (
    SCHEDULES,
    ProgramPricer,
    ProgramProfile,
    ScheduleCost,
    StageCost,
    boundary_bytes,
    schedule_cost,
    send_seconds,
)
from hapc.errors import UserError
from hapc.ir.graph import Graph
from hapc.ir.program import DistProgram

CAPS = 17                # step caps swept by the DP (quantiles of the stage steps)
MAX_CUTS = 48            # cut candidates kept for the DP (evenly by work when there are more)
UNBOUNDED_MEMORY = 10**18


@dataclass
class Stage:
    """One pipeline stage: graph nodes ``[first_node, stop_node)`` on global ``ranks``."""

    first_node: int
    stop_node: int
    ranks: tuple[int, ...]
    program: DistProgram          # the group's SPMD program (over the whole graph; the stage runs its range)
    cost: StageCost | None        # None for the one stage of a plan that is not pipelined

    def __repr__(self) -> str:
        return f"Stage(nodes {self.first_node}..{self.stop_node - 1} on ranks {list(self.ranks)})"


@dataclass
class Pipeline:
    """A pipelined plan: its stages, micro-batches, schedule and what the cost model predicts."""

    stages: list[Stage]
    microbatches: int
    schedule: str
    cost: ScheduleCost
    search: dict = field(default_factory=dict)

    @property
    def iteration_seconds(self) -> float:
        return self.cost.iteration_seconds


@dataclass
class _Group:
    ranks: tuple[int, ...]
    cluster: Cluster                # the group as a cluster of its own
    key: str
    end: int                        # device position after the group (index into the order)


class StagePlanner:
    """Plans pipelines for one graph on one cluster; group programs and profiles memoised."""

    def __init__(self, graph: Graph, cluster: Cluster, *, optimizer: str | int = "adamw",
                 group_synthesizer: Callable[[Graph, Cluster], DistProgram] | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.graph = graph
        self.cluster = cluster
        self.optimizer = optimizer
        self.say = progress or (lambda msg: None)
        self._synthesize_group = group_synthesizer or self._default_group_program
        self._programs: dict[str, DistProgram] = {}
        self._pricers: dict[str, ProgramPricer] = {}
        self._profiles: dict[tuple[str, int], ProgramProfile] = {}
        self._matrices: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self.fwd_bytes, self.bwd_bytes = boundary_bytes(graph)
        self.cuts = cut_candidates(graph, self.fwd_bytes)
        self.batch = batch_size(graph)
        self.group_syntheses = 0

    # ---- groups ------------------------------------------------------------------------------
    def _default_group_program(self, graph: Graph, group: Cluster) -> DistProgram:
        """The group's SPMD program: the A* at FLOPs-proportional shares, then (for a group of
        unequal devices) the share LP's rounds. A homogeneous group's LP optimum is its even
        split, so it needs one search only. Memory is left unbounded here: a stage holds only
        part of the model, and the planner checks what it holds."""
        from synth.costs import Prices
        from synth.search import search, to_program
        from synth.space import SearchSpace
        from synth.synthesize import synthesize_program

        roomy = replace(group, devices=[replace(d, memory_bytes=UNBOUNDED_MEMORY) for d in group.devices])
        if not roomy.is_homogeneous:
            return synthesize_program(graph, roomy, optimizer=self.optimizer, baselines=(), max_rounds=3,
                                      overlaps=(0.75,)).best.program
        shares = roomy.flops_shares()
        space = SearchSpace.build(graph, Prices(graph, roomy, shares, grad_sync_overlap=0.75))
        return to_program(space, search(space), shares)

    def group_program(self, group: _Group) -> DistProgram:
        if group.key not in self._programs:
            self.say(f"pipeline: synthesising the program of a {group.cluster.describe()} group")
            self._programs[group.key] = self._synthesize_group(self.graph, group.cluster)
            self.group_syntheses += 1
        return self._programs[group.key]

    def profile(self, group: _Group, microbatches: int) -> ProgramProfile:
        key = (group.key, microbatches)
        if key not in self._profiles:
            if group.key not in self._pricers:
                self._pricers[group.key] = ProgramPricer(self.group_program(group), group.cluster, self.optimizer)
            self._profiles[key] = self._pricers[group.key].profile(microbatches)
        return self._profiles[key]

    def device_orders(self) -> list[list[list[int]]]:
        """Nodes (each a list of ranks) in cluster order and, when it differs, reversed."""
        nodes = [list(h.devices) for h in self.cluster.nodes]
        orders = [nodes]
        if len(nodes) > 1:
            orders.append(nodes[::-1])
        return orders

    def groups_of(self, nodes: list[list[int]]) -> tuple[list[int], dict[int, list[_Group]]]:
        """Device positions and, per position, the groups that may start there."""
        flat = [r for node in nodes for r in node]
        parts = 4 if len(nodes) <= 2 else 2 if len(nodes) <= 4 else 1
        starts: list[int] = []
        node_start: list[int] = []
        pos = 0
        for node in nodes:
            node_start.append(pos)
            split = max(p for p in range(1, min(parts, len(node)) + 1) if len(node) % p == 0)
            step = len(node) // split
            starts.extend(range(pos, pos + len(node), step))
            pos += len(node)
        positions = starts + [pos]
        node_of_pos = {}
        for i, node in enumerate(nodes):
            for p in range(node_start[i], node_start[i] + len(node)):
                node_of_pos[p] = i
        out: dict[int, list[_Group]] = {}
        for a in starts:
            i = node_of_pos[a]
            end_of_node = node_start[i] + len(nodes[i])
            ends = [p for p in positions if a < p <= end_of_node]
            if a == node_start[i]:       # runs of identical whole nodes
                shape = self._node_shape(nodes[i])
                j = i + 1
                while j < len(nodes) and self._node_shape(nodes[j]) == shape:
                    ends.append(node_start[j] + len(nodes[j]))
                    j += 1
            groups = []
            for b in ends:
                ranks = tuple(flat[a:b])
                sub = sub_cluster(self.cluster, ranks)
                groups.append(_Group(ranks, sub, group_key(sub), b))
            out[a] = groups
        return positions, out

    def _node_shape(self, ranks: list[int]) -> str:
        return group_key(sub_cluster(self.cluster, ranks))

    # ---- per-group matrices over cut pairs ---------------------------------------------------------
    def matrices(self, group: _Group, m: int) -> dict[str, np.ndarray]:
        """Stage step, tail and memory limits for every cut pair ``(i, j)`` on ``group``."""
        key = (group.key, m)
        if key in self._matrices:
            return self._matrices[key]
        prof = self.profile(group, m)
        cuts = np.array(self.cuts)
        c = len(cuts)

        def diff(prefix: np.ndarray) -> np.ndarray:
            at = prefix[cuts]
            return at[None, :] - at[:, None]

        fwd = diff(prof.fwd_compute).max(axis=2) + diff(prof.fwd_comm)
        bwd = diff(prof.bwd_compute).max(axis=2) + diff(prof.bwd_comm)
        static = diff(prof.static_bytes)                         # [c, c, world]
        act = diff(prof.activation_bytes)
        opt = diff(prof.optimizer_seconds).max(axis=2)
        grad = diff(prof.grad_sync_bytes)
        shared_tail = np.zeros((c, c))
        for p, uses in prof.param_uses.items():
            first = prof.param_first_use[p]
            if len(uses) < 2:
                continue
            used = np.zeros(len(self.graph.nodes) + 1)
            for u in uses:
                used[u + 1] += 1
            used = np.cumsum(used)
            holds = (used[cuts][None, :] - used[cuts][:, None] > 0) & (cuts[:, None] > first)
            static = static + holds[:, :, None] * prof.param_static_bytes[p][None, None, :]
            if p in prof.param_grad_bytes:
                shared_tail += holds * send_seconds(self.cluster.network or group.cluster.group_link(),
                                                    prof.param_grad_bytes[p])
        sync = _all_reduce_seconds(group.cluster, grad)
        exposed = sync - np.minimum(sync, bwd) * self.cluster.comm_overlap
        cap = np.array([d.memory_bytes for d in group.cluster.devices], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            room = (cap[None, None, :] - static) / act
            room = np.where(act > 0, room, np.where(cap[None, None, :] >= static, np.inf, -1.0))
        inflight_max = np.floor(room.min(axis=2))
        upper = np.triu(np.ones((c, c), dtype=bool), 1)
        out = {"fwd": fwd, "bwd": bwd, "step": np.where(upper, fwd + bwd, np.inf), "tail": opt + shared_tail,
               "sync": sync, "exposed": exposed, "inflight_max": np.where(upper, inflight_max, -1.0),
               "static": static, "act": act}
        self._matrices[key] = out
        return out

    # ---- the search --------------------------------------------------------------------------------
    def microbatch_counts(self, groups: Sequence[_Group]) -> list[int]:
        """Powers of two that divide the batch and leave the smallest group a sample per
        member (a group too big for a count is left out of that count's DP)."""
        smallest = min(len(g.ranks) for g in groups)
        counts = []
        m = 1
        while m <= self.batch and self.batch // m >= smallest and m <= 64:
            if self.batch % m == 0:
                counts.append(m)
            m *= 2
        return counts or [1]

    def plan(self, *, stages: int | None = None, microbatches: int | None = None,
             schedule: str | None = None) -> Pipeline | None:
        """The fastest pipeline found (at least two stages unless forced), or None.

        ``stages``/``microbatches``/``schedule`` force those choices (the CLI's flags)."""
        started = time.perf_counter()
        if len(self.cuts) < 3:
            if stages:
                raise UserError(f"--stages {stages}: the model has no place to cut into stages "
                                f"(no point between its {len(self.graph.nodes)} nodes where few activations are live)")
            return None
        if stages is not None and stages > len(self.cuts) - 1:
            raise UserError(f"--stages {stages}: the model has only {len(self.cuts) - 1} places to cut into "
                            f"stages ({len(self.cuts) - 2} cut points)")
        if microbatches is not None and microbatches > self.batch:
            raise UserError(f"--microbatches {microbatches} is more than the batch of {self.batch} samples")
        best: Pipeline | None = None
        best_at: tuple = ()
        explored = 0
        for nodes in self.device_orders():
            positions, starts = self.groups_of(nodes)
            all_groups = [g for gs in starts.values() for g in gs]
            if stages is not None and stages > len(positions) - 1:
                raise UserError(f"--stages {stages}: the cluster's {self.cluster.world} devices split into at most "
                                f"{len(positions) - 1} groups (nodes, or halves/quarters of a node)")
            counts = [microbatches] if microbatches else self.microbatch_counts(all_groups)
            for m in counts:
                for cand in self._dp(positions, starts, m, stages):
                    explored += 1
                    pipe = self._best_schedule(cand, m, schedule, stages)
                    if pipe is not None and (best is None or pipe.iteration_seconds < best.iteration_seconds * (1 - 1e-9)):
                        best, best_at = pipe, (positions, starts)
        if best is not None:
            # Refine: sweep caps finely just under the winner's slowest step (a better-balanced
            # split often hides between two of the coarse caps).
            worst = max(max((st.cost.fwd_seconds + st.cost.bwd_seconds) for st in best.stages),
                        max(st.cost.send_fwd_seconds + st.cost.send_bwd_seconds for st in best.stages))
            caps = list(worst * np.linspace(0.5, 1.0, CAPS))
            for cand in self._dp(*best_at, best.microbatches, stages, caps=caps):
                explored += 1
                pipe = self._best_schedule(cand, best.microbatches, schedule, stages)
                if pipe is not None and pipe.iteration_seconds < best.iteration_seconds * (1 - 1e-9):
                    best = pipe
            best.search = {"group_syntheses": self.group_syntheses, "candidates_priced": explored,
                           "cut_candidates": len(self.cuts) - 2, "exact": False,
                           "seconds": time.perf_counter() - started}
        return best

    def _best_schedule(self, cand: list[tuple[_Group, int, int]], m: int, schedule: str | None,
                       stages: int | None) -> Pipeline | None:
        best = None
        for sched in ([schedule] if schedule else SCHEDULES):
            pipe = self._price(cand, m, sched)
            if pipe is None or (stages is None and len(pipe.stages) < 2):
                continue
            if best is None or pipe.iteration_seconds < best.iteration_seconds * (1 - 1e-9):
                best = pipe
        return best

    def _dp(self, positions: list[int], starts: dict[int, list[_Group]], m: int,
            forced_stages: int | None, caps: Sequence[float] | None = None) -> list[list[tuple[_Group, int, int]]]:
        """Stage lists ``[(group, first cut, stop cut), ...]``: one DP optimum per step cap."""
        cuts_n = len(self.cuts)
        pos_index = {p: i for i, p in enumerate(positions)}
        n_pos = len(positions)
        max_stages = forced_stages or min(n_pos - 1, cuts_n - 1, 16)
        links: dict[tuple[str, int], np.ndarray] = {}
        mats: dict[int, list[tuple[_Group, dict, np.ndarray]]] = {}
        for a, groups in starts.items():
            mats[a] = []
            for g in groups:
                if len(g.ranks) > max(1, self.batch // m):
                    continue                     # a member would get no sample of a micro-batch
                mat = self.matrices(g, m)
                link = self._link_after(g, starts)
                key = (str(g.ranks), g.end)
                if key not in links:
                    xf = np.array([send_seconds(link, b / m) for b in self.fwd_bytes[self.cuts]])
                    xb = np.array([send_seconds(link, b / m) for b in self.bwd_bytes[self.cuts]])
                    links[key] = xf + xb
                mats[a].append((g, mat, links[key]))
        if caps is None:
            steps = np.concatenate([mat["step"][np.isfinite(mat["step"])].ravel()
                                    for gs in mats.values() for _, mat, _ in gs])
            caps = sorted(set(np.quantile(steps, np.linspace(0.0, 1.0, CAPS)).tolist())) + [np.inf]
        caps = np.array(caps)
        n_caps = len(caps)
        # value[k, cap, position, cut]: least sum of steps covering the graph from ``cut`` with k
        # stages on the devices from ``position`` on, every step under the cap (all caps at once).
        value = np.full((max_stages + 1, n_caps, n_pos, cuts_n), np.inf)
        value[0, :, :, cuts_n - 1] = 0.0
        take_group = np.full((max_stages + 1, n_caps, n_pos, cuts_n), -1, dtype=np.int64)
        take_cut = np.zeros((max_stages + 1, n_caps, n_pos, cuts_n), dtype=np.int64)
        last = np.arange(cuts_n) == cuts_n - 1
        for k in range(1, max_stages + 1):
            need = min(m, k)
            for pi in range(n_pos - 1, -1, -1):
                for gi, (g, mat, x) in enumerate(mats.get(positions[pi], [])):
                    nxt = value[k - 1, :, pos_index[g.end]]                      # [caps, cuts]
                    xk = np.where(last, 0.0, x)
                    ok = np.isfinite(mat["step"]) & (mat["inflight_max"] >= need)
                    worst = np.maximum(mat["step"], xk[None, :])                 # [cuts, cuts]
                    allowed = ok[None] & (worst[None] <= caps[:, None, None])     # [caps, cuts, cuts]
                    total = np.where(allowed, (mat["step"] + xk[None, :])[None] + nxt[:, None, :], np.inf)
                    j = np.argmin(total, axis=2)                                  # [caps, cuts]
                    t = np.take_along_axis(total, j[:, :, None], axis=2)[:, :, 0]
                    better = t < value[k, :, pi] - 1e-15
                    value[k, :, pi] = np.where(better, t, value[k, :, pi])
                    take_group[k, :, pi] = np.where(better, gi, take_group[k, :, pi])
                    take_cut[k, :, pi] = np.where(better, j, take_cut[k, :, pi])
        found: list[list[tuple[_Group, int, int]]] = []
        seen: set[tuple] = set()
        ks = [forced_stages] if forced_stages else range(1, max_stages + 1)
        for ci_cap in range(n_caps):
            for k in ks:
                if k > max_stages or not np.isfinite(value[k, ci_cap, 0, 0]) or (k == 1 and m > 1):
                    continue
                plan = []
                pi, ci = 0, 0
                for kk in range(k, 0, -1):
                    g = mats[positions[pi]][int(take_group[kk, ci_cap, pi, ci])][0]
                    cj = int(take_cut[kk, ci_cap, pi, ci])
                    plan.append((g, ci, cj))
                    pi, ci = pos_index[g.end], cj
                sig = tuple((g.ranks, a, b) for g, a, b in plan)
                if sig not in seen:
                    seen.add(sig)
                    found.append(plan)
        return found

    def _link_after(self, group: _Group, starts: dict[int, list[_Group]]) -> Link | None:
        """The link to whichever group starts right after ``group`` (same node: its link)."""
        following = starts.get(group.end)
        if not following:
            return self.cluster.network
        return link_between(self.cluster, group.ranks, following[0].ranks[:1])

    def _price(self, plan: list[tuple[_Group, int, int]], m: int, schedule: str,
               require_fit: bool = True) -> Pipeline | None:
        """The exact schedule cost of one stage list; None when a stage does not fit."""
        stage_costs: list[StageCost] = []
        stages: list[Stage] = []
        for s, (g, ci, cj) in enumerate(plan):
            mat = self.matrices(g, m)
            if s + 1 < len(plan):
                link = link_between(self.cluster, g.ranks, plan[s + 1][0].ranks)
                xf = send_seconds(link, self.fwd_bytes[self.cuts[cj]] / m)
                xb = send_seconds(link, self.bwd_bytes[self.cuts[cj]] / m)
            else:
                xf = xb = 0.0
            cost = StageCost(float(mat["fwd"][ci, cj]), float(mat["bwd"][ci, cj]), xf, xb,
                             float(mat["sync"][ci, cj]), float(mat["tail"][ci, cj]),
                             tuple(float(v) for v in mat["static"][ci, cj]),
                             tuple(float(v) for v in mat["act"][ci, cj]))
            stage_costs.append(cost)
            stages.append(Stage(self.cuts[ci], self.cuts[cj], g.ranks, self.group_program(g), cost))
        sched = schedule_cost(stage_costs, m, schedule, self.cluster.comm_overlap)
        for st, mem in zip(stages, sched.stage_memory_bytes):
            if not require_fit:
                break
            if any(b > self.cluster.devices[r].memory_bytes for r, b in zip(st.ranks, mem)):
                return None
        return Pipeline(stages, m, schedule, sched)


    def group(self, ranks: Sequence[int]) -> _Group:
        sub = sub_cluster(self.cluster, ranks)
        return _Group(tuple(ranks), sub, group_key(sub), -1)


def price_stages(graph: Graph, cluster: Cluster, stages: Sequence[tuple[int, int, Sequence[int], DistProgram]],
                 microbatches: int, schedule: str, optimizer: str | int = "adamw") -> Pipeline:
    """Price given stages ``(first node, stop node, ranks, group program)``: a loaded plan's."""
    planner = StagePlanner(graph, cluster, optimizer=optimizer)
    planner.cuts = sorted({0, len(graph.nodes)} | {b for a, b, _, _ in stages} | {a for a, _, _, _ in stages})
    at = {c: i for i, c in enumerate(planner.cuts)}
    chosen = []
    for first, stop, ranks, program in stages:
        g = planner.group(ranks)
        planner._programs[g.key] = program
        chosen.append((g, at[first], at[stop]))
    pipe = planner._price(chosen, microbatches, schedule, require_fit=False)
    assert pipe is not None
    return pipe


def pipeline_even(planner: StagePlanner) -> Pipeline | None:
    """The ``pipeline-even`` baseline: one stage per node with equal numbers of layers (cut
    candidates), data parallel with even shares inside each node, the best micro-batch count.
    None for a one-node cluster or a model with fewer cut places than nodes."""
    from synth.baselines import baseline_program

    nodes = [list(h.devices) for h in planner.cluster.nodes]
    inner = planner.cuts[1:-1]
    if len(nodes) < 2 or len(inner) < len(nodes) - 1:
        return None
    picks = [inner[round(k * (len(inner) + 1) / len(nodes)) - 1] for k in range(1, len(nodes))]
    bounds = [0] + picks + [len(planner.graph.nodes)]
    at = {c: i for i, c in enumerate(planner.cuts)}
    even = StagePlanner(planner.graph, planner.cluster, optimizer=planner.optimizer,
                        group_synthesizer=lambda graph, group: baseline_program("dp-even", graph, group))
    even.cuts = planner.cuts
    best: Pipeline | None = None
    for m in even.microbatch_counts([even.group(n) for n in nodes]):
        if any(len(n) > max(1, even.batch // m) for n in nodes):
            continue
        chosen = [(even.group(n), at[bounds[k]], at[bounds[k + 1]]) for k, n in enumerate(nodes)]
        pipe = even._price(chosen, m, "1f1b")
        if pipe is not None and (best is None or pipe.iteration_seconds < best.iteration_seconds):
            best = pipe
    return best


def _all_reduce_seconds(group: Cluster, nbytes: np.ndarray) -> np.ndarray:
    """Gradient all-reduce time over ``group`` for each byte count: alpha-beta, so affine in
    bytes for the best variant at large sizes; priced at two sizes and interpolated."""
    if group.world <= 1:
        return np.zeros_like(nbytes)
    small, large = 1e6, 1e9
    t_small = best_variant("all_reduce", [small] * group.world, group)[1]
    t_large = best_variant("all_reduce", [large] * group.world, group)[1]
    slope = (t_large - t_small) / (large - small)
    base = t_small - slope * small
    return np.where(nbytes > 0, base + slope * nbytes, 0.0)


def cut_candidates(graph: Graph, live_bytes: np.ndarray) -> list[int]:
    """Node indices where a stage may start: 0, the end, and the positions between nodes where
    the live activation bytes are at their smallest (within 1.5x of the least, not counting
    positions before the first or after the last parameter use), at most :data:`MAX_CUTS`."""
    n = len(graph.nodes)
    reads_param = [i for i, node in enumerate(graph.nodes)
                   if any(graph.values[r].kind == "param" for r in node.input_refs())]
    if len(reads_param) < 2:
        return [0, n]
    lo, hi = reads_param[0] + 1, reads_param[-1]
    inner = [i for i in range(lo, hi + 1) if live_bytes[i] > 0]
    if not inner:
        return [0, n]
    least = min(live_bytes[i] for i in inner)
    chosen = [i for i in inner if live_bytes[i] <= 1.5 * least]
    # Two cuts with nothing in between that does work are the same cut: keep the first.
    work = np.cumsum([0.0] + [node.cost.fwd_flops + node.cost.bwd_flops + node.cost.fwd_bytes for node in graph.nodes])
    dedup: list[int] = []
    for i in chosen:
        if not dedup or work[i] > work[dedup[-1]]:
            dedup.append(i)
    if len(dedup) > MAX_CUTS:
        targets = np.linspace(work[dedup[0]], work[dedup[-1]], MAX_CUTS)
        picks = sorted({dedup[int(np.argmin([abs(work[i] - t) for i in dedup]))] for t in targets})
        dedup = picks
    return [0] + dedup + [n]


def batch_size(graph: Graph) -> int:
    """Samples in one global batch: the largest leading dimension of the model inputs."""
    sizes = [graph.meta(x).shape[0] for x in graph.inputs if graph.meta(x).shape]
    return max(sizes) if sizes else 1
