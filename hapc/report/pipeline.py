"""How a pipelined plan reads: its stages, their layers, groups, micro-batches and bubble.

Shared by the summary ``hapc compile`` prints, ``hapc explain`` and ``report.md``, so all
three name the same things the same way.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hapc.ir.program import DistProgram
    from hapc.plan.plan import Plan


def _source_span(plan: Plan, first: int, stop: int) -> str:
    """First and last user source line among the stage's nodes (``gpt.py:41 .. gpt.py:88``)."""
    located = [n.source for n in plan.graph.nodes[first:stop] if n.source is not None]
    if not located:
        return "-"
    a, b = located[0], located[-1]
    return f"{os.path.basename(a.file)}:{a.line} .. {os.path.basename(b.file)}:{b.line}"


def _group_text(plan: Plan, ranks: tuple[int, ...]) -> str:
    devices = [plan.cluster.devices[r] for r in ranks]
    nodes = sorted({d.node for d in devices})
    types = sorted({d.type for d in devices})
    where = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {nodes[0]}-{nodes[-1]}"
    return f"ranks {ranks[0]}-{ranks[-1]} ({len(ranks)}x {'/'.join(types)}, {where})" if len(ranks) > 1 \
        else f"rank {ranks[0]} ({types[0]}, {where})"


def pipeline_lines(plan: Plan) -> list[str]:
    """The stage table; empty for a plan that is not pipelined."""
    pipe = plan.pipeline
    if pipe is None:
        return []
    ms = 1e3
    cost = pipe.cost
    used = {r for st in pipe.stages for r in st.ranks}
    without = f"{plan.sim.iteration_seconds * ms:.3f} ms" + ("" if plan.sim.fits else ", does not fit")
    if len(pipe.stages) == 1:
        return _one_stage_lines(plan, without, used)
    lines = [f"pipeline: {len(pipe.stages)} stages, {pipe.microbatches} micro-batches, {pipe.schedule} schedule, "
             f"bubble {cost.bubble_fraction * 100:.1f}% of {cost.pipeline_seconds * ms:.3f} ms "
             f"(one stage over all devices: {without})"]
    if len(used) < plan.cluster.world:
        idle = sorted(set(range(plan.cluster.world)) - used)
        lines.append(f"  devices left idle (the pipeline is faster without them): ranks {idle}")
    lines.append(f"  {'stage':>5} {'nodes':>11} {'source lines':<28} {'group':<40} {'fwd+bwd ms/mb':>13} "
                 f"{'in flight':>9} {'memory GB':>9}")
    for k, (st, mem, inflight) in enumerate(zip(pipe.stages, cost.stage_memory_bytes, cost.inflight)):
        step = (st.cost.fwd_seconds + st.cost.bwd_seconds) * ms if st.cost else 0.0
        lines.append(f"  {k:>5} {f'{st.first_node}-{st.stop_node - 1}':>11} "
                     f"{_source_span(plan, st.first_node, st.stop_node):<28} {_group_text(plan, st.ranks):<40} "
                     f"{step:13.3f} {inflight:>9} {max(mem) / 1e9:9.3f}")
    levers = [(k, stage_levers(st.program)) for k, st in enumerate(pipe.stages)]
    if any(what for _, what in levers):
        lines.append("  memory levers: " + "; ".join(f"stage {k} {', '.join(what)}" for k, what in levers if what))
    return lines


def _one_stage_lines(plan: Plan, without: str, used: set[int]) -> list[str]:
    """A pipeline of one stage: gradient accumulation, over all devices or on part of the
    cluster alone (the others idle), or that part alone with the batch in one go."""
    from hapc.ir.batch import batch_size

    pipe = plan.pipeline
    (stage,) = pipe.stages
    peak = max(max(m) for m in pipe.cost.stage_memory_bytes) / 1e9
    where = "" if len(used) == plan.cluster.world else f" on {_group_text(plan, stage.ranks)} alone"
    other = "one stage over all devices" if where else "without accumulation"
    if pipe.microbatches > 1:
        rows = batch_size(plan.graph) // pipe.microbatches
        lines = [f"gradient accumulation{where}: {pipe.microbatches} micro-batches of {rows} samples, gradients "
                 f"synchronised once per step, {peak:.3f} GB at most on a device ({other}: {without})"]
    else:
        lines = [f"one stage{where}, the batch in one go, {peak:.3f} GB at most on a device ({other}: {without})"]
    if where:
        idle = sorted(set(range(plan.cluster.world)) - used)
        lines.append(f"  devices left idle (the plan is faster without them): ranks {idle}")
    return lines            # its memory levers: the summary's lines for a one-stage program


def stage_levers(program: DistProgram) -> list[str]:
    """What a stage's program gives time for memory with (:mod:`synth.levers`), in words."""
    what = ["layers recomputed in backward"] if program.recompute else []
    if gathered_weights(program):
        what.append("weights stored sharded and gathered for use (ZeRO-3)")
    if program.state_shares is not None:
        what.append("optimizer state in ZeRO-1 rows")
    return what


def explain_pipeline(plan: Plan, limit: int | None = None) -> str:
    """``hapc explain`` for a pipelined plan: the stage table, then each stage's steps (its
    group's program over the stage's nodes) with per-micro-batch times on the slowest rank."""
    from costmodel.groups import sub_cluster
    from costmodel.pipeline import ProgramPricer
    from hapc.ir.program import Redistribute

    pipe = plan.pipeline
    assert pipe is not None
    ms = 1e3
    lines = [repr(plan), *pipeline_lines(plan)]
    index = {n.name: i for i, n in enumerate(plan.graph.nodes)}
    shown = 0
    for k, st in enumerate(pipe.stages):
        group = sub_cluster(plan.cluster, st.ranks)
        prof = ProgramPricer(st.program, group, plan.model.get("optimizer", "adamw")).profile(pipe.microbatches)
        shares = " / ".join(f"{s:.3f}" for s in st.program.shares)
        lines += ["-" * 100, f"stage {k}: nodes {st.first_node}-{st.stop_node - 1} on {_group_text(plan, st.ranks)}, "
                  f"shares {shares}", f"{'step':<44} {'fwd ms/mb':>9} {'bwd ms/mb':>9}  layouts / collective"]
        pending: list[str] = []
        for step in st.program.steps:
            if isinstance(step, Redistribute):
                pending.append(f"  {'-> ' + step.out:<42} {'':>9} {'':>9}  {step.src_layout!r} -> {step.dst_layout!r}")
                continue
            i = index[step.node]
            if not st.first_node <= i < st.stop_node:
                pending = []
                continue
            if limit is not None and shown >= limit:
                lines.append("... more steps (raise --limit)")
                return "\n".join(lines)
            node = plan.graph.nodes[i]
            fwd, bwd = prof.range_seconds(i, i + 1)
            src = f"  @ {os.path.basename(node.source.file)}:{node.source.line}" if node.source else ""
            lines += pending
            lines.append(f"{node.name + ' = ' + node.op.removeprefix('aten.'):<44} {fwd * ms:9.3f} {bwd * ms:9.3f}  "
                         f"{step.strategy!r}{src}")
            pending = []
            shown += 1
    return "\n".join(lines)


def stage_time_split(plan: Plan) -> tuple[list[float], list[float], list[float]]:
    """Per device, in ms: its stage's work over all micro-batches, its tail (gradient sync left
    exposed, optimizer), and the rest of the iteration (bubble and waiting) — for the chart."""
    pipe = plan.pipeline
    assert pipe is not None
    ms = 1e3
    total = pipe.iteration_seconds * ms
    work = [0.0] * plan.cluster.world
    tail = [0.0] * plan.cluster.world
    for st, end in zip(pipe.stages, pipe.cost.stage_end_seconds):
        busy = pipe.microbatches * (st.cost.fwd_seconds + st.cost.bwd_seconds) * ms if st.cost else 0.0
        after = max(0.0, end * ms - pipe.cost.pipeline_seconds * ms)
        for r in st.ranks:
            work[r], tail[r] = busy, after
    idle = [max(0.0, total - w - t) for w, t in zip(work, tail)]
    return work, tail, idle


def resimulate_lines(plan: Plan, cluster) -> list[str]:
    """``hapc simulate`` of a pipelined plan: its stages re-priced on ``cluster`` (same ranks)."""
    from dataclasses import replace

    from synth.stages import price_stages

    pipe = plan.pipeline
    assert pipe is not None
    specs = [(st.first_node, st.stop_node, st.ranks, st.program) for st in pipe.stages]
    again = price_stages(plan.graph, cluster, specs, pipe.microbatches, pipe.schedule,
                         plan.model.get("optimizer", "adamw"))
    moved = replace(plan, cluster=cluster, sim=plan.simulate(cluster), pipeline=again)
    fit = "fits" if moved.fits else "DOES NOT FIT"
    return [f"time per iteration {again.iteration_seconds * 1e3:.3f} ms on {cluster.name or 'the cluster'} "
            f"({len(again.stages)} pipeline stages; {fit})", *pipeline_lines(moved)]


def gathered_weights(program: DistProgram) -> list[str]:
    """The weights ``program`` stores sharded and gathers whole for use (ZeRO-3)."""
    from costmodel.transfers import regathered
    from hapc.ir.program import Redistribute

    return list(dict.fromkeys(s.src for s in program.steps if isinstance(s, Redistribute) and regathered(program, s)))
