"""The stage planner: pipeline stages chosen jointly with each stage's uneven SPMD program.

A pipelined plan is a plan of plans. Stages are contiguous node ranges of the graph, each on
a device group; inside a group the existing A* + share LP finds the SPMD program (uneven
shares included), priced on the group as a cluster of its own. The planner chooses the
device **groups**, the **cuts** and the **micro-batch count** (:mod:`synth.stagespace`), and
the schedule (1F1B; GPipe when forced, see below).

**Memoised pricing.** Each distinct group (same devices and links, wherever it sits) is
synthesised once, for the whole graph; :func:`costmodel.pipeline.profile_program` prices its
program per node and keeps prefix sums, so a layer range on that group costs two
subtractions. The group's program is chosen for speed with memory left unbounded; memory is
checked per stage for the layers it holds and the micro-batches in flight. The groups' A*
searches and pricers are independent jobs, shared with a forked child (:mod:`synth.stagejobs`).

**Search, exact under the cost model.** The planner builds one problem per device order and
micro-batch count: every group at every position, priced for every pair of cuts (what a
stage there adds to the schedule of :func:`costmodel.pipeline.schedule_cost`).
:mod:`synth.stagedp` solves them all, exactly: a DP per cap on the slowest step, caps bisected
with bounds, the open intervals of every problem taken least bound first, and a DP over
Pareto fronts where a later stage's tail ends the iteration. The search runs twice: the cheap
bound alone first, for a good incumbent over every order and micro-batch count, then again
with the fronts where needed. The plan reports ``exact`` and its ``gap`` to the least bound
left open (non-zero only when a budget of :mod:`synth.stagedp` cut the proof short, or when
GPipe is forced: its bound is the 1F1B relaxation).

**Cut-pair arrays** (:mod:`synth.stagecosts`): a group's profile turned into what a stage over
any pair of cuts costs on it, and with the sends to its neighbours into the DP's arcs; the same
group between the same links is built once, whatever its position or device order.

**Groups priced by bounds first** (``lazy_groups=True``). A group's program costs an A* (and
for unequal devices the share LP's rounds); :mod:`costmodel.stagebounds` bounds what any
program on the group costs per node range without one. Arcs of groups not yet synthesised
carry those bounds; the DP stays a valid lower bound, a plan that cannot beat the incumbent is
dropped unpriced, and when one that might is found the groups it uses are synthesised and its
problem solved again. So the result is the same, with fewer syntheses when the bounds are
tight enough; with small homogeneous groups and near-equal plans they rarely are, and the
restarts cost more than they save, hence off by default. A second pass only reruns
problems whose first-pass bounds stay under the final incumbent, and a plan is only priced
when its bound is under the incumbent.

The space searched: the groups and orders, the cut candidates and the power-of-two
micro-batch counts of :mod:`synth.stagespace`, up to :data:`MAX_STAGES` stages;
each group runs its own whole-graph program (chosen with memory unbounded), a stage its
slice of it. GPipe is priced only when forced: per stage list its steady state pays
``max(f) + max(b)`` per micro-batch where 1F1B pays ``max(f + b)``, and it holds more
micro-batches, so it never wins under this model. The caller keeps the one-stage plan over
all devices as a candidate, so a pipelined plan is only chosen when it is predicted faster.

Deterministic: groups, cuts and caps are enumerated in fixed orders and ties keep the first.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from costmodel.cluster import Cluster, Link
from costmodel.compute import lower_bound_seconds
from costmodel.groups import link_between
from costmodel.stagebounds import StageBounds, bounds_available
from costmodel.pipeline import (  # noqa: I001
    SCHEDULES,  # noqa: F401  (the API checks --schedule against it)
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
from hapc.process.collector import gc_paused
from synth import stagespace
from synth.stagecosts import arc_terms, bound_pair_terms, cut_pair_terms
from synth.stagedp import EXACT_TOLERANCE, Arc, StageProblem, StageSearch, solve_pass
from synth.stagejobs import GroupJobs
from synth.stagespace import Group, batch_size, cut_candidates

MAX_STAGES = 16          # most stages a plan may have
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

    def fits_in(self, cluster: Cluster) -> bool:
        """Whether every stage's predicted peak fits each of its devices' memory."""
        return all(b <= cluster.devices[r].memory_bytes
                   for st, mem in zip(self.stages, self.cost.stage_memory_bytes) for r, b in zip(st.ranks, mem))

    @property
    def shape(self) -> str:
        """``3 pipeline stages, 8 micro-batches``, or ``4 micro-batches accumulated`` for one stage."""
        if len(self.stages) == 1:
            return f"{self.microbatches} micro-batches accumulated"
        return f"{len(self.stages)} pipeline stages, {self.microbatches} micro-batches"


class StagePlanner(GroupJobs):
    """Plans pipelines for one graph on one cluster; group programs and profiles memoised."""

    def __init__(self, graph: Graph, cluster: Cluster, *, optimizer: str | int = "adamw",
                 group_synthesizer: Callable[[Graph, Cluster], DistProgram] | None = None,
                 progress: Callable[[str], None] | None = None, lazy_groups: bool = False,
                 like: StagePlanner | None = None) -> None:
        self.graph = graph
        self.cluster = cluster
        self.optimizer = optimizer
        self.say = progress or (lambda msg: None)
        self._synthesize_group = group_synthesizer or self._default_group_program
        self._default_synthesizer = group_synthesizer is None
        self._programs: dict[str, DistProgram] = {}
        self._pricers: dict[str, ProgramPricer] = {}
        self._profiles: dict[tuple[str, int], ProgramProfile] = {}
        self._matrices: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self._like = like if like is not None and like.graph is graph else None   # the same graph's facts, found once
        self.batch = batch_size(graph)
        self.group_syntheses = 0
        # With lazy_groups, groups are priced by lower bounds until a plan worth pricing uses them
        # (module docstring; off by default).
        self.lazy_groups = lazy_groups and bounds_available(cluster)
        self._bounds: dict[str, StageBounds] = {}
        self._bound_matrices: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self._send_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._arc_terms: dict[tuple, tuple[np.ndarray, ...]] = {}    # see _arc
        self._groups_by_order: dict[tuple, tuple] = {}                 # see groups_of
        self._shared: tuple | None = None      # the group work shared with a child (start_groups)
        self.shared_counts: dict[str, float] = {}   # how the group work was shared (not in plans: timing decides)
        self._baseline: StagePlanner | None = None
        self._splits_batch: bool | None = None      # see splits_batch

    # ---- the graph's cut places: found when first asked (after the group jobs have started) ----------
    @functools.cached_property
    def _graph_cuts(self) -> tuple[np.ndarray, np.ndarray, list[int]]:
        if self._like is not None:
            return self._like._graph_cuts
        fwd_bytes, bwd_bytes = boundary_bytes(self.graph)
        return fwd_bytes, bwd_bytes, cut_candidates(self.graph, fwd_bytes)

    @property
    def fwd_bytes(self) -> np.ndarray:
        """Activation bytes live across each place between nodes (:func:`costmodel.pipeline.boundary_bytes`)."""
        return self._graph_cuts[0]

    @property
    def bwd_bytes(self) -> np.ndarray:
        """... the part of them that carries a gradient back."""
        return self._graph_cuts[1]

    @functools.cached_property
    def cuts(self) -> list[int]:
        """Where stages may start (:func:`cut_candidates`); set by hand to price given stages."""
        return self._like.cuts if self._like is not None else self._graph_cuts[2]

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

    def group_program(self, group: Group) -> DistProgram:
        if group.key not in self._programs:
            self.say(f"pipeline: synthesising the program of a {group.cluster.describe()} group")
            self._programs[group.key] = self._synthesize_group(self.graph, group.cluster)
            self.group_syntheses += 1
        return self._programs[group.key]

    def baseline_planner(self) -> StagePlanner:
        """The planner that prices the ``pipeline-even`` baseline's stages (:func:`pipeline_even`):
        dp-even programs on whole nodes, this planner's graph facts and cuts."""
        if self._baseline is None:
            from synth.baselines import baseline_program

            self._baseline = StagePlanner(self.graph, self.cluster, optimizer=self.optimizer, like=self,
                                          group_synthesizer=lambda graph, group: baseline_program("dp-even", graph,
                                                                                                  group))
        return self._baseline

    def profile(self, group: Group, microbatches: int) -> ProgramProfile:
        key = (group.key, microbatches)
        if key not in self._profiles:
            if group.key not in self._pricers:
                self._pricers[group.key] = ProgramPricer(self.group_program(group), group.cluster, self.optimizer)
            self._profiles[key] = self._pricers[group.key].profile(microbatches)
        return self._profiles[key]

    def device_orders(self) -> list[list[list[int]]]:
        """Nodes (each a list of ranks) in cluster order and, when it differs, reversed."""
        return stagespace.device_orders(self.cluster)

    def groups_of(self, nodes: list[list[int]]) -> tuple[list[int], dict[int, list[Group]]]:
        """Device positions and, per position, the groups that may start there (found once per
        device order: each group is a sub-cluster and its key; read only)."""
        key = tuple(tuple(node) for node in nodes)
        if key not in self._groups_by_order:
            self._groups_by_order[key] = stagespace.find_groups(self.cluster, nodes)
        return self._groups_by_order[key]

    def group(self, ranks: Sequence[int]) -> Group:
        return stagespace.group_of(self.cluster, ranks)

    # ---- per-group matrices over cut pairs ---------------------------------------------------------
    def matrices(self, group: Group, m: int) -> dict[str, np.ndarray]:
        """Stage step, tail and memory limits for every cut pair ``(i, j)`` on ``group``."""
        key = (group.key, m)
        if key not in self._matrices:
            self._matrices[key] = self._cut_pair_terms(group, m, np.array(self.cuts))
        return self._matrices[key]

    def _cut_pair_terms(self, group: Group, m: int, cuts: np.ndarray) -> dict[str, np.ndarray]:
        """:meth:`matrices` over the given cut positions only (the same floats per pair)."""
        return cut_pair_terms(self.profile(group, m), cuts, len(self.graph.nodes), group.cluster, self.cluster)

    def bound_matrices(self, group: Group, m: int) -> dict[str, np.ndarray]:
        """What :meth:`matrices` gives, bounded below (in-flight limits bounded above) for every
        program the group could run (:mod:`costmodel.stagebounds`): no synthesis needed."""
        key = (group.key, m)
        if key not in self._bound_matrices:
            if group.key not in self._bounds:
                self._bounds[group.key] = StageBounds(self.graph, group.cluster, self.optimizer)
            self._bound_matrices[key] = bound_pair_terms(self._bounds[group.key].profile(m), np.array(self.cuts))
        return self._bound_matrices[key]

    def _synthesised(self, group: Group) -> bool:
        """Whether ``group`` is priced by its program (else by bounds, until a plan needs it)."""
        return not self.lazy_groups or group.key in self._programs

    # ---- the search --------------------------------------------------------------------------------
    def microbatch_counts(self, groups: Sequence[Group]) -> list[int]:
        """:func:`synth.stagespace.microbatch_counts` for this graph's batch; one micro-batch only
        when the model's samples are coupled (:mod:`synth.microbatching`)."""
        if not self.splits_batch():
            return [1]
        return stagespace.microbatch_counts(self.batch, groups)

    def splits_batch(self) -> bool:
        """Whether micro-batches compute the whole batch's loss and gradients (worked out once)."""
        if self._splits_batch is None:
            from synth.microbatching import MicroBatchingRefused, loss_split

            try:
                loss_split(self.graph, self.batch)
                self._splits_batch = True
            except MicroBatchingRefused:
                self._splits_batch = False
        return self._splits_batch

    def plan(self, *, stages: int | None = None, microbatches: int | None = None,
             schedule: str | None = None, incumbent_seconds: float | None = None) -> Pipeline | None:
        """The fastest pipeline (at least two stages unless forced), or None.

        ``stages``/``microbatches``/``schedule`` force those choices (the CLI's flags).
        ``incumbent_seconds`` (the best plan without stages) prunes: a pipeline is only
        returned when it is faster, and None then means none is (up to the reported gap)."""
        try:
            with gc_paused():    # arrays and small tuples, no cycles (hapc.process.collector)
                return self._plan(stages, microbatches, schedule, incumbent_seconds)
        finally:
            self.close()

    def _plan(self, stages: int | None, microbatches: int | None, schedule: str | None,
              incumbent_seconds: float | None) -> Pipeline | None:
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
        if microbatches is not None and self.batch % microbatches:
            raise UserError(f"--microbatches {microbatches} does not divide the batch of {self.batch} samples "
                            f"(micro-batches must be equal)")
        bound = math.inf if incumbent_seconds is None else float(incumbent_seconds)
        if bound < math.inf and lower_bound_seconds(self.graph, self.cluster) >= bound:
            return None          # not even a perfectly balanced pipeline computes faster than the incumbent
        self._finish_groups()
        problems = []
        for order, nodes in enumerate(self.device_orders()):
            positions, starts = self.groups_of(nodes)
            all_groups = [g for gs in starts.values() for g in gs]
            if stages is not None and stages > len(positions) - 1:
                raise UserError(f"--stages {stages}: the cluster's {self.cluster.world} devices split into at most "
                                f"{len(positions) - 1} groups (nodes, or halves/quarters of a node)")
            counts = [microbatches] if microbatches else self.microbatch_counts(all_groups)
            for m in counts:
                problems.append(self._problem(nodes, positions, starts, m, stages, schedule == "gpipe"))
        schedule = schedule or "1f1b"
        search = StageSearch(bound, lambda chosen, m: self._price([(arc.group, i, j) for arc, i, j in chosen],
                                                                  m, schedule))
        # First the cheap bound alone, for a good incumbent; then again, proving it with the
        # exact front DP only where the cheap bound stays under that incumbent. A problem whose
        # first-pass bounds all reach the final incumbent is proven already and not run again.
        lazy = {"synthesise": lambda groups: [self.group_program(g) for g in groups], "rebuild": self._refreshed}
        first_pass = solve_pass(problems, search, fronts=False, **lazy)
        search.lower_bounds.clear()
        search.pass_runs = 0
        again = [prob for prob, proven in zip(problems, first_pass) if any(search.open(b) for b in proven)]
        search.skipped = len(problems) - len(again)
        solve_pass(again, search, fronts=True, **lazy)
        best = search.best
        if best is not None:
            lower = min([best.iteration_seconds] + search.lower_bounds)
            gap = max(0.0, (best.iteration_seconds - lower) / best.iteration_seconds)
            bounded_only = {a.group.key for prob in problems for a in prob.arcs} - set(self._programs)
            best.search = {"group_syntheses": self.group_syntheses, "groups_bounded_only": len(bounded_only),
                           "restarts": search.restarts, "candidates_priced": search.priced,
                           "dp_runs": search.dp_runs, "problems": len(problems),
                           "problems_proven_in_first_pass": search.skipped, "front_dp_runs": search.pareto_runs, "cut_candidates": len(self.cuts) - 2,
                           "exact": bool(gap <= EXACT_TOLERANCE), "gap": float(gap), "lower_bound_seconds": float(lower),
                           "seconds": time.perf_counter() - started}
        return best

    # ---- the exact search: a DP per step cap, caps bisected with bounds ----------------------------
    def _problem(self, nodes: list[list[int]], positions: list[int], starts: dict[int, list[Group]], m: int,
                 forced_stages: int | None, gpipe_memory: bool) -> StageProblem:
        """One device order at one micro-batch count: every group at every position, priced for
        every cut pair (what the DP adds per stage)."""
        c = len(self.cuts)
        flat = [r for node in nodes for r in node]
        pos_index = {p: i for i, p in enumerate(positions)}
        arcs: list[Arc] = []
        for a in sorted(starts):
            for g in starts[a]:
                if len(g.ranks) > max(1, self.batch // m):
                    continue                     # a member would get no sample of a micro-batch
                ready = self._synthesised(g)
                arcs.append(Arc(g, pos_index[a], pos_index[g.end], *self._arc(g, flat, a, starts, m, ready),
                                bound=not ready))
        max_stages = forced_stages or min(len(positions) - 1, c - 1, MAX_STAGES)
        ks = [forced_stages] if forced_stages else list(range(2, max_stages + 1))
        gates = {id(a.gate): a.gate for a in arcs}          # shared by arcs of the same group and links
        finite = [gate[np.isfinite(gate)] for gate in gates.values()]
        steps = np.unique(np.concatenate(finite)) if finite else np.zeros(0)
        return StageProblem(m, len(positions), c, arcs, max_stages, ks, gpipe_memory, steps,
                        source=(nodes, positions, starts, m, forced_stages, gpipe_memory))

    def _arc(self, g: Group, flat: list[int], a: int, starts: dict[int, list[Group]], m: int,
             ready: bool) -> tuple[np.ndarray, ...]:
        """The arc arrays of group ``g`` at device position ``a`` (:func:`synth.stagecosts.
        arc_terms`). The same group between the same links costs the same wherever it sits
        (other positions of a node, the other device order): built once, shared, read only."""
        after = self._link_after(g, starts)
        before = link_between(self.cluster, (flat[a - 1],), g.ranks) if a > 0 else None
        key = (g.key, m, ready, after, before)
        if key not in self._arc_terms:
            c = len(self.cuts)
            fwd_bytes, bwd_bytes = self.fwd_bytes[self.cuts] / m, self.bwd_bytes[self.cuts] / m
            mat = self.matrices(g, m) if ready else self.bound_matrices(g, m)
            after_sends = self._sends(after, fwd_bytes, bwd_bytes)
            for x in after_sends:
                x[c - 1] = 0.0                   # the last stage sends nothing on
            before_sends = self._sends(before, fwd_bytes, bwd_bytes)
            for x in before_sends:
                x[0] = 0.0                       # the first stage receives nothing
            self._arc_terms[key] = arc_terms(mat, after_sends, before_sends, 1.0 - self.cluster.comm_overlap)
        return self._arc_terms[key]

    def _prepare_arcs(self) -> None:
        """Build ahead the arcs of every group whose program is here, for every device order and
        micro-batch count :meth:`_plan` will solve (not knowing yet which ones it will)."""
        for nodes in self.device_orders():
            _, starts = self.groups_of(nodes)
            flat = [r for node in nodes for r in node]
            for m in self.microbatch_counts([g for gs in starts.values() for g in gs]):
                for a in sorted(starts):
                    for g in starts[a]:
                        if g.key in self._programs and len(g.ranks) <= max(1, self.batch // m):
                            self._arc(g, flat, a, starts, m, self._synthesised(g))

    def _refreshed(self, prob: StageProblem) -> StageProblem:
        """``prob`` built again when a group it bounds has been synthesised since."""
        if any(arc.bound and self._synthesised(arc.group) for arc in prob.arcs):
            return self._problem(*prob.source)
        return prob

    def _sends(self, link: Link | None, fwd_bytes: np.ndarray, bwd_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Seconds to send the activations (and their gradients back) of every cut over ``link``."""
        key = (link, float(fwd_bytes.sum()))
        if key not in self._send_cache:
            self._send_cache[key] = (np.array([send_seconds(link, b) for b in fwd_bytes]),
                                     np.array([send_seconds(link, b) for b in bwd_bytes]))
        xf, xb = self._send_cache[key]
        return xf.copy(), xb.copy()

    def _link_after(self, group: Group, starts: dict[int, list[Group]]) -> Link | None:
        """The link to whichever group starts right after ``group`` (same node: its link)."""
        following = starts.get(group.end)
        if not following:
            return self.cluster.network
        return link_between(self.cluster, group.ranks, following[0].ranks[:1])

    def _price(self, plan: list[tuple[Group, int, int]], m: int, schedule: str,
               require_fit: bool = True) -> Pipeline | None:
        """The exact schedule cost of one stage list; None when a stage does not fit."""
        stage_costs: list[StageCost] = []
        stages: list[Stage] = []
        for s, (g, first, stop) in enumerate(plan):
            ci, cj = first, stop
            mat = self._matrices.get((g.key, m))
            if mat is None:              # a stage list priced alone (a baseline, a loaded plan): its pairs only
                mat = self._cut_pair_terms(g, m, np.array([self.cuts[first], self.cuts[stop]]))
                ci, cj = 0, 1
            if s + 1 < len(plan):
                link = link_between(self.cluster, g.ranks, plan[s + 1][0].ranks)
                xf = send_seconds(link, self.fwd_bytes[self.cuts[stop]] / m)
                xb = send_seconds(link, self.bwd_bytes[self.cuts[stop]] / m)
            else:
                xf = xb = 0.0
            cost = StageCost(float(mat["fwd"][ci, cj]), float(mat["bwd"][ci, cj]), xf, xb,
                             float(mat["sync"][ci, cj]), float(mat["tail"][ci, cj]),
                             tuple(float(v) for v in mat["static"][ci, cj]),
                             tuple(float(v) for v in mat["act"][ci, cj]))
            stage_costs.append(cost)
            stages.append(Stage(self.cuts[first], self.cuts[stop], g.ranks, self.group_program(g), cost))
        pipe = Pipeline(stages, m, schedule, schedule_cost(stage_costs, m, schedule, self.cluster.comm_overlap))
        return None if require_fit and not pipe.fits_in(self.cluster) else pipe


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


def best_sub_cluster(planner: StagePlanner) -> Pipeline | None:
    """The fastest plan on part of the cluster alone: one stage on one node, or on a run of
    alike consecutive nodes, the other devices idle; None for a one-node cluster or when none
    fits. Slow devices behind a slow network can cost more than they give: no plan over more
    devices should be slower than leaving them out, and neither the one-stage search over all
    devices nor a pipeline across nodes (which gives every stage work) can leave a node idle.
    Where the batch does not fit the part in one go, the part accumulates gradients over
    micro-batches (:func:`synth.accumulation.accumulation`)."""
    from synth.accumulation import accumulation

    nodes = planner.cluster.nodes
    if len(nodes) < 2:
        return None
    firsts = [0]
    for host in nodes:
        firsts.append(firsts[-1] + len(host.devices))
    kinds = [planner.group(range(firsts[i], firsts[i + 1])).key for i in range(len(nodes))]
    best: Pipeline | None = None
    for a in range(len(nodes)):
        if a > 0 and kinds[a - 1] == kinds[a]:
            continue            # a run of alike nodes is tried from its first node, at every length
        b = a + 1
        while b <= len(nodes) and kinds[b - 1] == kinds[a]:
            if not (a == 0 and b == len(nodes)):         # all devices: the one-stage plan itself
                group = planner.group(range(firsts[a], firsts[b]))
                pipe = planner._price([(group, 0, len(planner.cuts) - 1)], 1, "1f1b")     # None: does not fit
                if pipe is None:
                    pipe = accumulation(planner, ranks=group.ranks,
                                        incumbent_seconds=None if best is None else best.iteration_seconds)
                if pipe is not None and (best is None or pipe.iteration_seconds < best.iteration_seconds):
                    best = pipe
            b += 1
    return best


class LeverPlanner(StagePlanner):
    """The stage planner over ``base``'s group programs with a memory lever applied to each
    (``lever``, from :mod:`synth.levers`: layers recomputed in backward, weights stored sharded):
    planned as another pass where memory binds, so that pipelines of big models may hold more
    micro-batches, or fit at all. The group programs are ``base``'s, not searched again; a
    program the lever does not apply to stays as it is."""

    def __init__(self, base: StagePlanner, lever: Callable[[DistProgram], DistProgram | None]) -> None:
        super().__init__(base.graph, base.cluster, optimizer=base.optimizer, like=base,
                         group_synthesizer=lambda graph, group: base._synthesize_group(graph, group))
        self.base, self.lever = base, lever
        self._shared = (None, [])           # no group jobs of its own: base has the programs

    def group_program(self, group: Group) -> DistProgram:
        if group.key not in self._programs:
            program = self.base.group_program(group)
            self._programs[group.key] = self.lever(program) or program
        return self._programs[group.key]


def pipeline_even(planner: StagePlanner) -> Pipeline | None:
    """The ``pipeline-even`` baseline: one stage per node with equal numbers of layers (cut
    candidates), data parallel with even shares inside each node, the best micro-batch count.
    None for a one-node cluster or a model with fewer cut places than nodes."""
    nodes = [list(h.devices) for h in planner.cluster.nodes]
    inner = planner.cuts[1:-1]
    if len(nodes) < 2 or len(inner) < len(nodes) - 1:
        return None
    planner._finish_groups()        # the stage search's groups and this baseline's, partly in a child
    picks = [inner[round(k * (len(inner) + 1) / len(nodes)) - 1] for k in range(1, len(nodes))]
    bounds = [0] + picks + [len(planner.graph.nodes)]
    at = {c: i for i, c in enumerate(planner.cuts)}
    even = planner.baseline_planner()
    best: Pipeline | None = None
    for m in even.microbatch_counts([even.group(n) for n in nodes]):
        if any(len(n) > max(1, even.batch // m) for n in nodes):
            continue
        chosen = [(even.group(n), at[bounds[k]], at[bounds[k + 1]]) for k, n in enumerate(nodes)]
        pipe = even._price(chosen, m, "1f1b")
        if pipe is not None and (best is None or pipe.iteration_seconds < best.iteration_seconds):
            best = pipe
    return best

