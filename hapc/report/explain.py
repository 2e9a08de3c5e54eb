"""``hapc explain``: every step of a plan with its layouts, what it costs and where it comes from.

For each node: the strategy chosen, its forward and backward time on the slowest rank, the
collectives that feed it (with the variant the cost model picked), and the user's source
line; then the gradient all-reduces. The cheapest alternative strategy that would need no
extra collective is named too, so "why not data parallel here?" has an answer.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING

from hapc.ir.program import Compute, Redistribute

if TYPE_CHECKING:
    from hapc.plan.plan import Plan


def explain(plan: Plan, limit: int | None = None) -> str:
    if plan.pipeline is not None:
        from hapc.report.pipeline import explain_pipeline

        return explain_pipeline(plan, limit)
    sim = plan.sim
    spent: dict[tuple[str, str], float] = defaultdict(float)
    variant: dict[str, str] = {}
    for e in sim.events:
        spent[(e.phase, e.label)] += e.end_seconds - e.start_seconds
        if e.variant:
            variant[e.label] = e.variant
    nodes = {n.name: n for n in plan.graph.nodes}
    ms = 1e3
    lines = [f"hapc plan '{plan.name}': {sim.iteration_seconds * ms:.3f} ms per iteration on {plan.cluster.world} devices.",
             "Each step's time is the slowest rank's at that step (the critical path). The steps add up to the",
             "forward and backward; the iteration adds the gradient all-reduce left after backward and the",
             "optimizer step (the last lines).",
             f"{'step':<44} {'fwd ms':>8} {'bwd ms':>8}  layouts / collective", "-" * 100]
    shown = 0
    for step in plan.program.steps:
        if limit is not None and shown >= limit:
            lines.append(f"... {len(plan.program.steps) - shown} more steps")
            break
        shown += 1
        if isinstance(step, Compute):
            n = nodes[step.node]
            src = f"  @ {os.path.basename(n.source.file)}:{n.source.line}" if n.source else ""
            lines.append(f"{n.name + ' = ' + n.op.removeprefix('aten.'):<44} "
                         f"{spent[('fwd', n.name)] * ms:8.3f} {spent[('bwd', n.name)] * ms:8.3f}  "
                         f"{step.strategy!r}{src}")
        elif isinstance(step, Redistribute):
            label = f"{step.src}: {step.src_layout!r} -> {step.dst_layout!r}"
            lines.append(f"  {'-> ' + step.out:<42} {spent[('fwd', label)] * ms:8.3f} "
                         f"{spent[('bwd', label)] * ms:8.3f}  {step.src_layout!r} -> {step.dst_layout!r} "
                         f"({variant.get(label, 'local' if spent[('fwd', label)] == 0 else 'auto')})")
    syncs = [(label, t) for (phase, label), t in spent.items() if phase == "grad_sync"]
    if syncs:
        lines.append("-" * 100)
        lines.append(f"gradient all-reduces: {len(syncs)} buckets, {sum(t for _, t in syncs) * ms:.3f} ms in all, "
                     f"{sim.exposed_grad_sync_seconds * ms:.3f} ms not hidden behind backward")
    lines.append("-" * 100)
    optimizer = sum(e.end_seconds - e.start_seconds for e in sim.events if e.phase == "optimizer")
    rest = sim.iteration_seconds - sim.forward_seconds - sim.backward_seconds - sim.exposed_grad_sync_seconds
    tail = f"optimizer step {optimizer * ms:.3f}" + (f" + waiting {(rest - optimizer) * ms:.3f}"
                                                      if abs(rest - optimizer) * ms >= 0.0005 else "")
    lines.append(f"iteration {sim.iteration_seconds * ms:.3f} ms = forward {sim.forward_seconds * ms:.3f} + backward "
                 f"{sim.backward_seconds * ms:.3f} + gradient all-reduce not hidden "
                 f"{sim.exposed_grad_sync_seconds * ms:.3f} + {tail}")
    from hapc.report.model import batch_rows

    lines.append(sim.table(batch_rows(plan)).split("\n", 2)[2])          # the per-device table (its time lines are above)
    lines.append("memory per device: what makes up each one's peak (activations: what backward needs kept"
                 + (", here each recomputed layer's input and one layer's own" if plan.program.recompute else "")
                 + "; comm: the largest collective buffer)")
    lines.append(sim.memory.table())
    return "\n".join(lines)
