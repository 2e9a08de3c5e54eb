"""What ``hapc compile`` prints and writes: the summary table, ``report.md`` and its chart."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hapc.plan.plan import Plan


def summary_text(plan: Plan) -> str:
    from hapc.report.model import baseline_text, batch_rows, facts

    f = facts(plan)
    lines = [
        f["title"],
        f"predicted time per iteration: {f['iteration_ms']:.3f} ms  "
        f"(lower bound {f['lower_bound_ms']:.3f} ms; {f['gap']:.2f}x of it{_gap_note(f['gap'])})"
        if f["gap"] is not None else f"predicted time per iteration: {f['iteration_ms']:.3f} ms",
    ]
    if f["mfu"] is not None:
        lines.append(f"model FLOPs utilisation: {f['mfu'] * 100:.1f}% (the step's FLOPs at the devices' summed "
                     f"peak, over the predicted time per iteration)")
    lines.append(f"precision: {plan.precision.describe()}")
    lines.append(_measured_line(plan))
    if f["baselines"]:
        parts = [baseline_text(*b) for b in f["baselines"]]
        lines.append("baselines (speed-up of this plan): " + ", ".join(parts))
    from hapc.report.pipeline import pipeline_lines

    if plan.pipeline is not None:
        lines.append("the best one-stage plan over all devices, for comparison:")
    lines.append(plan.sim.table(batch_rows(plan)))
    lines += pipeline_lines(plan)
    lines += _memory_lever_lines(plan)
    lines += _expert_lines(plan)
    if plan.search and "segments" in plan.search:      # a baseline, or a replan that kept one, has none
        s = plan.search
        lines.append(f"search: {'optimal under the search cost model' if s.get('exact') else 'time budget hit'}"
                     f", {s.get('segments', '?')} segments ({s.get('distinct_segments', '?')} distinct), "
                     f"{s.get('states_expanded', '?')} states expanded")
    return "\n".join(lines)


def _memory_lever_lines(plan: Plan) -> list[str]:
    """What the plan gives up time for memory with (:mod:`synth.levers`): ZeRO's rows of the
    optimizer state of replicated parameters (ZeRO-2 in one stage, ZeRO-1 under accumulation,
    whose gradients accumulate whole), weights stored sharded (ZeRO-3) and activation
    recomputation."""
    from costmodel.recompute import recomputed_calls
    from hapc.report.pipeline import gathered_weights

    pipe = plan.pipeline
    program = plan.program if pipe is None else pipe.stages[0].program if len(pipe.stages) == 1 else None
    if program is None:
        return []
    lines = []
    if program.recompute:
        lines.append(f"activation recomputation: the program recomputes its {len(recomputed_calls(program))} "
                     "repeated layers in backward (each keeps its input, not its activations)")
    gathered = gathered_weights(program)
    if gathered:
        lines.append(f"ZeRO-3: {len(gathered)} weights stored sharded, gathered whole for use and again in "
                     "backward")
    if program.state_shares is None:
        return lines
    ranks = range(program.world) if pipe is None else pipe.stages[0].ranks
    kept = {}
    for r, share in zip(ranks, program.state_shares):
        kept.setdefault(plan.cluster.devices[r].type, share)
    sharded = sum(1 for p in program.graph.params if program.state_rows(p) is not None)
    what = ("ZeRO-2: the gradients and optimizer state" if pipe is None else "ZeRO-1: the optimizer state")
    return lines + [f"{what} of {sharded} replicated parameters sharded by rows over {program.world} ranks "
                    "(each keeps " + ", ".join(f"{t} {z:.3f}" for t, z in kept.items())
                    + "), reduce-scattered and all-gathered instead of all-reduced"]


def _expert_lines(plan: Plan) -> list[str]:
    """How a mixture of experts is spread: how many of its grouped matmuls shard the experts
    (each rank multiplying the tokens routed to its own; :mod:`hapc.rules.ops_grouped_mm`)."""
    from hapc.ir.program import Compute
    from hapc.rules.expert_rows import GROUPED_MM_OPS

    total = sum(1 for n in plan.graph.nodes if n.op in GROUPED_MM_OPS)
    if not total:
        return []
    at = {n.name: i for i, n in enumerate(plan.graph.nodes)}
    spans = [(plan.program, 0, len(at))] if plan.pipeline is None else \
        [(st.program, st.first_node, st.stop_node) for st in plan.pipeline.stages]   # each stage runs its span
    sharded = {s.node for program, first, stop in spans for s in program.steps
               if isinstance(s, Compute) and (s.strategy.local or "").startswith("grouped_mm_experts")
               and first <= at.get(s.node, -1) < stop}
    return [f"expert parallel: {len(sharded)} of {total} grouped matmuls hold their experts sharded, each rank "
            "multiplying the tokens routed to its own"]


def _gap_note(gap: float) -> str:
    """Why a plan can sit far above the lower bound (every FLOP at the devices' summed peak, with
    no memory traffic, launches or communication), said where that is the case."""
    return ": the work is too small to keep the devices busy; launches, memory traffic and " \
        "communication dominate" if gap >= 10 else ""


def _measured_line(plan: Plan) -> str:
    """Which compute steps were priced from times measured on the device."""
    from costmodel.optable import measured_share

    table = plan.cluster.op_table
    measured, total = measured_share(plan.graph, table, [d.type for d in plan.cluster.devices])
    if table is None or measured == 0:
        return f"compute: all {total} op nodes priced by the roofline (no per-op times measured on the device)"
    return (f"compute: {measured} of {total} op nodes priced from times measured on {table.device} "
            f"({table.device_name}, torch {table.torch_version}), the rest by the roofline")


def write_report(plan: Plan, out_dir: str | Path) -> Path:
    """``report.md`` with the summary, the layout of every collective, and ``report.svg``
    (written as text by :mod:`hapc.report.svg`, the chart the notebook shows too)."""
    from hapc.process.collector import gc_paused

    with gc_paused():       # a row per step, all acyclic (hapc.process.collector)
        return _write_report(plan, out_dir)


def _write_report(plan: Plan, out_dir: str | Path) -> Path:
    from hapc.report.svg import write_svg_chart

    out = Path(out_dir)
    write_svg_chart(plan, out / "report.svg")
    lines = ["# hapc plan report", "", "```", summary_text(plan), "```", ""]
    lines += ["![per-device time and memory](report.svg)", ""]
    lines += ["## Layout changes (collectives)", "", "| value | from | to | method |", "|---|---|---|---|"]
    for value, src, dst, method in plan.collectives():
        lines.append(f"| `{value}` | {src} | {dst} | {method} |")
    lines += ["", "## Strategies", "", "| node | op | inputs | outputs | source |", "|---|---|---|---|---|"]
    nodes = {n.name: n for n in plan.graph.nodes}
    from hapc.ir.program import Compute

    file_names: dict[str, str] = {}         # a few source files, a Path each (not one per step)
    for step in plan.program.steps:
        if isinstance(step, Compute):
            n = nodes[step.node]
            if n.source and n.source.file not in file_names:
                file_names[n.source.file] = Path(n.source.file).name
            src = f"{file_names[n.source.file]}:{n.source.line}" if n.source else ""
            ins = ", ".join(map(repr, step.strategy.inputs))
            outs = ", ".join(map(repr, step.strategy.outputs))
            lines.append(f"| `{n.name}` | `{n.op}` | {ins} | {outs} | {src} |")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
