"""The one model of a plan that every rendering reads: the headline figures, baselines and
per-device rows (:func:`facts`: the summary, report.md, the notebook's Markdown and HTML) and
the per-device chart (:func:`chart`: the SVG of report.md, the notebook's PNG). Renderers
format; they compute nothing of their own, so two views of one plan cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hapc.plan.plan import Plan

MS = 1e3
GB = 1e9

# Up to this many devices the chart has one bar per rank; beyond, one per row of the summary
# table (a run of alike ranks; no one reads 256 bars).
BARS_BEFORE_GROUPING = 32


def facts(plan: Plan) -> dict[str, Any]:
    """What the text and notebook views show, as plain numbers (milliseconds, gigabytes); the
    device rows are the summary table's (alike ranks in one row beyond 32 devices)."""
    sim = plan.sim
    devices = []
    totals, fits = sim.memory.totals, sim.memory.fits        # once, not once per device
    for rank, last in sim.row_groups():       # a row per rank, or per run of alike ranks (as the table)
        dev = plan.cluster.devices[rank]
        used, capacity = totals[rank], dev.memory_bytes
        devices.append({
            "rank": str(rank) if last - rank == 1 else f"{rank}-{last - 1}", "count": last - rank,
            "node": dev.node, "device": dev.type, "share": plan.ratios[rank],
            "compute_ms": sim.compute_seconds[rank] * MS, "comm_ms": sim.comm_seconds[rank] * MS,
            "idle_ms": sim.idle_seconds[rank] * MS, "memory_GB": used / GB, "capacity_GB": capacity / GB,
            "memory_used": used / capacity if capacity else float("nan"), "fits": fits[rank],
        })
    model = Path(str(plan.model.get("file") or "model")).name
    return {
        "title": f"hapc plan '{plan.name}' for {model} on {plan.cluster.name or 'cluster'} "
                 f"({plan.cluster.world} devices)",
        "iteration_ms": plan.cost * MS, "lower_bound_ms": plan.lower_bound * MS,
        "gap": plan.cost / plan.lower_bound if plan.lower_bound > 0 else None,
        "baselines": [(name, seconds * MS, seconds / plan.cost if plan.cost > 0 else float("nan"))
                      for name, seconds in sorted(plan.baselines.items())],
        "devices": devices, "fits": all(d["fits"] for d in devices),
    }


@dataclass(frozen=True)
class Chart:
    """Per-device time (stacked series, ms per iteration) and memory (GB) beside capacity, one
    bar per label: a rank, or a run of alike ranks on large clusters."""

    title: str
    labels: list[str]
    series: list[list[float]]
    names: list[str]
    memory_gb: list[float]
    capacity_gb: list[float]


def chart(plan: Plan) -> Chart:
    """The chart of ``plan``: compute, communication and idle time per device; for a pipeline,
    each device's stage work, gradient sync and bubble, labelled with its stage."""
    sim = plan.sim
    ranks = range(plan.cluster.world)
    labels = [f"{r}:{d.type}" for r, d in zip(ranks, plan.cluster.devices)]
    series = [[x * MS for x in sim.compute_seconds], [x * MS for x in sim.comm_seconds],
              [x * MS for x in sim.idle_seconds]]
    names = ["compute", "communication", "idle"]
    title = "time per device"
    if plan.pipeline is not None:      # name each device's pipeline stage; memory is the stage's
        from hapc.report.pipeline import stage_time_split

        stage_of = {r: k for k, st in enumerate(plan.pipeline.stages) for r in st.ranks}
        labels = [f"{label} stage {stage_of[r]}" if r in stage_of else f"{label} idle"
                  for r, label in zip(ranks, labels)]
        series = [list(s) for s in stage_time_split(plan)]
        names = ["stage work (all micro-batches)", "gradient sync + optimizer", "idle (bubble)"]
        title = "time per device by pipeline stage"
    memory_gb = [b / GB for b in plan.memory]
    capacity_gb = [d.memory_bytes / GB for d in plan.cluster.devices]
    if len(labels) > BARS_BEFORE_GROUPING and plan.pipeline is None:     # the summary table's rows
        groups = plan.sim.row_groups()
        firsts = [a for a, _ in groups]
        labels = [labels[a] if b - a == 1 else f"{a}-{b - 1}:{labels[a].split(':', 1)[1]}" for a, b in groups]
        series = [[s[r] for r in firsts] for s in series]
        memory_gb, capacity_gb = [memory_gb[r] for r in firsts], [capacity_gb[r] for r in firsts]
    elif len(labels) > BARS_BEFORE_GROUPING:
        firsts, labels = rank_runs(labels, *series, memory_gb, capacity_gb)
        series = [[s[r] for r in firsts] for s in series]
        memory_gb, capacity_gb = [memory_gb[r] for r in firsts], [capacity_gb[r] for r in firsts]
    return Chart(title, labels, series, names, memory_gb, capacity_gb)


def rank_runs(labels: list[str], *per_rank: list[float]) -> tuple[list[int], list[str]]:
    """First rank and label of each run of consecutive ranks whose device type and figures
    are all equal: ``"0-127:A100-80GB"``."""
    key = [(label.split(":", 1)[1], *(xs[r] for xs in per_rank)) for r, label in enumerate(labels)]
    firsts = [r for r in range(len(key)) if r == 0 or key[r] != key[r - 1]]
    ends = [*firsts[1:], len(key)]
    out = [labels[a] if b - a == 1 else f"{a}-{b - 1}:{labels[a].split(':', 1)[1]}" for a, b in zip(firsts, ends)]
    return firsts, out
