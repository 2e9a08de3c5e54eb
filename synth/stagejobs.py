"""The group jobs of the stage planner: every device group's program and profiles, shared
with a forked child process.

Each group's A* and pricer (and the ``pipeline-even`` baseline's dp-even nodes) are
independent jobs: ``synthesize(stages=...)`` starts them in a forked child before the one-stage
search, and the planner takes the rest from the other end once free
(:mod:`hapc.process.sharedjobs`); the results are those of one job after the other.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from costmodel.pipeline import ProgramPricer
from hapc.ir.program import DistProgram
from hapc.process.collector import gc_paused

if TYPE_CHECKING:
    from synth.stages import StagePlanner
    from synth.stagespace import Group


class GroupJobs:
    """The part of :class:`synth.stages.StagePlanner` that runs the group jobs; it reads and
    fills the planner's memos (``_programs``, ``_profiles``) and its progress counters."""

    _shared: tuple | None
    shared_counts: dict[str, float]

    def start_groups(self) -> None:
        """Start synthesising and pricing the search's groups (and the ``pipeline-even``
        baseline's) in a forked child on the spare core (:mod:`hapc.process.sharedjobs`), while this
        process goes on (the one-stage search when started before it); :meth:`_finish_groups`
        then takes the child's results and runs what is left here, from the other end. Each
        group's A* and pricer do not depend on another's, so the results are the same as one
        after the other; without a spare core (or with ``HAPC_SERIAL`` set) everything runs here,
        when first asked for. Not with ``lazy_groups``: that synthesises only the groups a plan
        needs."""
        if self._shared is not None or self.lazy_groups:
            return
        from hapc.process.sharedjobs import SharedJobs

        work: dict[str, tuple[Group, set[int]]] = {}
        for nodes in self.device_orders():
            _, starts = self.groups_of(nodes)
            groups = [g for gs in starts.values() for g in gs]
            for m in self.microbatch_counts(groups):
                for g in groups:
                    if len(g.ranks) <= max(1, self.batch // m) and g.key not in self._programs:
                        work.setdefault(g.key, (g, set()))[1].add(m)
        # Shared: the groups whose program is one A* (equal devices, the default synthesiser);
        # an unequal group's share LP would run HiGHS, whose threads a fork does not copy.
        shared = [(self, g, sorted(ms)) for g, ms in work.values()
                  if g.cluster.is_homogeneous and self._default_synthesizer]
        if shared:
            shared += self._baseline_work()       # pipeline-even's dp-even nodes: no search, no LP
        self._shared = (SharedJobs([functools.partial(planner._group_work, g, ms) for planner, g, ms in shared]),
                        shared)

    def _baseline_work(self) -> list[tuple]:
        """``pipeline-even``'s node groups and the micro-batch counts it prices them at."""
        nodes = [list(h.devices) for h in self.cluster.nodes]
        if len(nodes) < 2:            # (whether the model has places enough to cut is found later)
            return []
        even = self.baseline_planner()
        groups = {g.key: g for g in (even.group(n) for n in nodes)}
        counts = [m for m in even.microbatch_counts(list(groups.values()))
                  if all(len(n) <= max(1, even.batch // m) for n in nodes)]
        return [(even, g, counts) for g in groups.values() if g.key not in even._programs]

    def _group_work(self, group: Group, counts: list[int]) -> tuple:
        """One group's program (as parts) and its profiles at ``counts`` micro-batches; no
        side effects, so a child can run it and send the result back."""
        with gc_paused():        # thousands of acyclic steps and rows (hapc.process.collector)
            program = self._programs.get(group.key) or self._synthesize_group(self.graph, group.cluster)
            pricer = ProgramPricer(program, group.cluster, self.optimizer)
            return program.steps, program.source_layouts, program.shares, program._blocks, \
                [pricer.profile(m) for m in counts]

    def _finish_groups(self) -> None:
        """The groups :meth:`start_groups` shared, done and taken in (the child's part as it
        arrives, the rest here)."""
        if self._shared is None:
            self.start_groups()
        if self._shared is None or self._shared[0] is None:
            return
        jobs, shared = self._shared
        self._shared = (None, [])
        self.shared_counts = {"group_jobs": len(shared)}

        def take(results: dict[int, tuple]) -> None:
            """Results taken in while the child finishes its job, and the stage DP's arcs of
            those groups built meanwhile (else this process would idle)."""
            for at, result in results.items():
                self._take_group(*shared[at], result)
            self._prepare_arcs()

        with gc_paused():        # the child's results unpickled: acyclic steps and arrays
            results = jobs.results(while_waiting=take)
            for (planner, group, counts), result in zip(shared, results):
                self._take_group(planner, group, counts, result)
        self.shared_counts["group_jobs_from_child"] = jobs.from_child
        self.shared_counts["group_jobs_wait_seconds"] = jobs.wait_seconds

    def _take_group(self, planner: StagePlanner, group: Group, counts: list[int], result: tuple) -> None:
        """One group job's result (:meth:`_group_work`) kept by ``planner``, once."""
        if group.key in planner._programs:
            return
        steps, layouts, shares, blocks, profiles = result
        if planner is self:
            self.say(f"pipeline: synthesising the program of a {group.cluster.describe()} group")
            self.group_syntheses += 1
        planner._programs[group.key] = DistProgram(self.graph, shares, layouts, steps, _blocks=blocks)
        for m, prof in zip(counts, profiles):
            planner._profiles.setdefault((group.key, m), prof)

    def close(self) -> None:
        """Stop a child :meth:`start_groups` left running (a plan that returned early, a failed search)."""
        if self._shared is not None and self._shared[0] is not None:
            self._shared[0].cancel()
            self._shared = None
