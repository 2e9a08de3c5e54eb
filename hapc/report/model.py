"""The one model of a plan that every rendering reads: the headline figures, baselines and
per-device rows (:func:`facts`: the summary, report.md, the notebook's Markdown and HTML) and
the per-device chart (:func:`chart`: the SVG of report.md and of the notebook). Renderers
format; they compute nothing of their own, so two views of one plan cannot disagree."""

from __future__ import annotations

import math
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
    rows = batch_rows(plan)
    devices = []
    totals, fits = sim.memory.totals, sim.memory.fits        # once, not once per device
    for rank, last in sim.row_groups(batch_rows=rows):       # a row per rank, or per run of alike ranks (as the table)
        dev = plan.cluster.devices[rank]
        used, capacity = totals[rank], dev.memory_bytes
        devices.append({
            "rank": str(rank) if last - rank == 1 else f"{rank}-{last - 1}", "count": last - rank,
            "node": dev.node, "device": dev.type, "share": plan.ratios[rank],
            "rows": None if rows is None else rows[rank],
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
        "mfu": model_flops_utilisation(plan),
        # (name, ms, speed-up of this plan or None, why none): no speed-up over a baseline that does
        # not fit or does not split the batch
        "baselines": [(name, seconds * MS,
                       (seconds / plan.cost if plan.cost > 0 else float("nan")) if claimable(plan, name) else None,
                       unclaimable_because(plan, name))
                      for name, seconds in sorted(plan.baselines.items())],
        "devices": devices, "fits": plan.fits,      # a pipeline's stages, not the one-stage table's
    }


def model_flops_utilisation(plan: Plan) -> float | None:
    """Predicted model-FLOPs utilisation: the graph's FLOPs at the summed peak of every device
    in the cluster (idle ones too), over the predicted step (:func:`costmodel.compute.peak_seconds`);
    None for an empty graph. Real systems reach 40-55% on large LLMs; a toy model far less."""
    from costmodel.compute import peak_seconds

    ideal = peak_seconds(plan.graph, plan.cluster)
    return ideal / plan.cost if ideal > 0 and plan.cost > 0 else None


def batch_rows(plan: Plan) -> list[int] | None:
    """The batch rows each rank computes in a one-stage plan: the pieces of the first batched
    user input where the program cuts it along its first dimension (every rank holds the whole
    batch when the program never cuts it). A share is the balancer's real number; the rows are
    what it became after rounding (batch 5 on shares .33/.33/.17/.17 is rows 2/1/1/1), which
    is what the time follows. ``None`` for a pipeline (its stages split micro-batches) or a
    program whose first input is cut along another dimension."""
    if plan.pipeline is not None:
        return None
    from hapc.ir.layout import Shard
    from hapc.ir.program import Redistribute

    program = plan.program
    graph = program.graph
    batched = [name for name in graph.inputs if graph.meta(name).shape]
    if not batched:
        return None
    first = batched[0]
    layouts = [program.source_layouts.get(first)]
    layouts += [s.dst_layout for s in program.steps if isinstance(s, Redistribute) and s.src.split("@", 1)[0] == first]
    cuts = [lay.dim % len(graph.meta(first).shape) for lay in layouts if isinstance(lay, Shard)]
    if not cuts:
        return [graph.meta(first).shape[0]] * program.world
    return list(program.lengths(first, 0)) if 0 in cuts else None


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
    # The peak memory by part (one list per part, a value per bar, GB), summing to memory_gb.
    memory_parts: list[list[float]]
    memory_names: list[str]


MEMORY_PART_NAMES = {"params_bytes": "parameters", "grads_bytes": "gradients", "optimizer_bytes": "optimizer state",
                     "activations_bytes": "activations", "comm_buffer_bytes": "communication buffers"}


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
    if plan.pipeline is None:
        from costmodel.memory import PARTS

        devices = plan.sim.memory.devices
        parts = [[getattr(d, p) / GB for d in devices] for p in PARTS]
        part_names = [MEMORY_PART_NAMES[p] for p in PARTS]
    else:           # a stage's peak, not split by part
        parts, part_names = [memory_gb], ["predicted peak"]
    if len(labels) > BARS_BEFORE_GROUPING and plan.pipeline is None:     # the summary table's rows
        groups = plan.sim.row_groups(batch_rows=batch_rows(plan))
        firsts = [a for a, _ in groups]
        labels = [labels[a] if b - a == 1 else f"{a}-{b - 1}:{labels[a].split(':', 1)[1]}" for a, b in groups]
    elif len(labels) > BARS_BEFORE_GROUPING:
        firsts, labels = rank_runs(labels, *series, memory_gb, capacity_gb)
    else:
        firsts = list(range(len(labels)))
    def pick(xs: list[float]) -> list[float]:
        return [xs[r] for r in firsts]
    return Chart(title, labels, [pick(s) for s in series], names, pick(memory_gb), pick(capacity_gb),
                 [pick(p) for p in parts], part_names)


DATA_PARALLEL = ("dp-even", "dp-flops")


def claimable(plan: Plan, name: str) -> bool:
    """Whether a speed-up over baseline ``name`` means something: it fits in memory, and data
    parallelism has a sample for every device (with fewer, every device computes the whole batch:
    a degenerate baseline that DDP would not run)."""
    return unclaimable_because(plan, name) == ""


def unclaimable_because(plan: Plan, name: str) -> str:
    """Why no speed-up over baseline ``name`` is claimed ('' when one is)."""
    if name in plan.baseline_shortfall:
        return f"does not fit: {memory_text(plan.baseline_shortfall[name] / GB)} short"
    if name in DATA_PARALLEL:
        from synth.stagespace import batch_size

        batch = batch_size(plan.graph)
        if batch < plan.cluster.world:
            return f"not split: a batch of {batch} for {plan.cluster.world} devices"
    return ""


def baseline_text(name: str, ms: float, speedup: float | None, why: str) -> str:
    """``dp-even 1.130 ms (1.25x)``, or ``... (does not fit: 2.1 GB short)``."""
    return f"{name} {ms:.3f} ms ({speedup_text(speedup, why)})"


def speedup_text(speedup: float | None, why: str) -> str:
    return f"{speedup:.2f}x" if speedup is not None else why


def rank_runs(labels: list[str], *per_rank: list[float]) -> tuple[list[int], list[str]]:
    """First rank and label of each run of consecutive ranks whose device type and figures
    are all equal: ``"0-127:A100-80GB"``."""
    key = [(label.split(":", 1)[1], *(xs[r] for xs in per_rank)) for r, label in enumerate(labels)]
    firsts = [r for r in range(len(key)) if r == 0 or key[r] != key[r - 1]]
    ends = [*firsts[1:], len(key)]
    out = [labels[a] if b - a == 1 else f"{a}-{b - 1}:{labels[a].split(':', 1)[1]}" for a, b in zip(firsts, ends)]
    return firsts, out


UNITS = (("TB", 1e-3), ("GB", 1.0), ("MB", 1e3), ("kB", 1e6), ("B", 1e9))      # (name, per GB)


def memory_unit(gb: float) -> tuple[str, float]:
    """The largest unit in which ``gb`` is at least 1 (a tiny model reads in kB, not 6e-06 GB)."""
    return next(((name, per) for name, per in UNITS if gb * per >= 1), UNITS[-1])


def memory_text(gb: float) -> str:
    """``17.53 MB``: a size in the largest unit in which it is at least 1."""
    unit, per = memory_unit(gb)
    return f"{figure(gb * per)} {unit}"


def memory_label(used_gb: float, capacity_gb: float) -> str:
    """``6.2 kB of 80 GB, <1%`` (and how much is short, past capacity): the figure of a memory
    bar and of a notebook row."""
    used = memory_text(used_gb)
    if capacity_gb <= 0:
        return used
    cap_unit, cap_per = memory_unit(capacity_gb)
    share = used_gb / capacity_gb
    pct = "<1%" if 0 < share < 0.01 else f"{share:.0%}"
    short = f", {figure((used_gb - capacity_gb) * cap_per)} {cap_unit} short" if share > 1 else ""
    return f"{used} of {capacity_gb * cap_per:g} {cap_unit}, {pct}{short}"


def figure(x: float) -> str:
    """A figure with 4 significant digits, never in exponent notation (``0.0012``, ``1342``)."""
    if x == 0:
        return "0"
    digits = max(0, 3 - math.floor(math.log10(abs(x))))
    return f"{x:.{digits}f}" if digits else f"{x:.0f}"
