"""A readable listing of a traced graph: what ``hapc ir`` prints."""

from __future__ import annotations

import os

from hapc.rules.registry import has_rule, strategies
from hapc.frontend.tracer import Traced


def _flops(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.0f}"


def coverage(traced: Traced) -> tuple[int, int]:
    """(nodes whose op has a rule, all nodes)."""
    nodes = traced.graph.nodes
    return sum(1 for n in nodes if has_rule(n.op)), len(nodes)


def format_ir(traced: Traced, *, layouts: bool = True, limit: int | None = None, summary: bool = False) -> str:
    """The graph's header lines, then a line per node (with its allowed layouts); with
    ``summary``, the header and one line per distinct op (nodes, FLOPs, rule) instead."""
    g = traced.graph
    lines = []
    n_params = sum(g.meta(p).numel for p in g.params)
    total = g.total_cost
    covered, count = coverage(traced)
    ops = g.ops()
    ops_with_rules = sum(1 for op in ops if has_rule(op))
    lines.append(f"graph {g.hash()}: {count} nodes, {len(g.params)} parameters ({n_params / 1e6:.2f} M values), "
                 f"{len(g.inputs)} inputs; traced in {traced.seconds:.2f} s")
    lines.append(f"FLOPs per step: forward {_flops(total.fwd_flops)}, backward {_flops(total.bwd_flops)}; "
                 f"rule coverage: {covered}/{count} nodes, {ops_with_rules}/{len(ops)} distinct ops")
    lines.append("")
    if summary:
        lines += _op_table(g)
        return "\n".join(lines)
    for i, node in enumerate(g.nodes):
        if limit is not None and i >= limit:
            lines.append(f"... {count - limit} more nodes")
            break
        outs = ", ".join(f"{o}: {g.meta(o)}" for o in node.outputs)
        src = f"{os.path.basename(node.source.file)}:{node.source.line}" if node.source else "?"
        mark = "" if has_rule(node.op) else "  [no rule: replicated]"
        lines.append(f"{outs} = {node.op}({', '.join(node.input_refs())})  "
                     f"fwd {_flops(node.cost.fwd_flops)} bwd {_flops(node.cost.bwd_flops)}  @ {src}{mark}")
        if layouts:
            for s in strategies(node, g):
                lines.append(f"      {s!r}")
    if g.unsupported:
        lines.append("")
        lines.append("ops without a sharding rule (they run replicated):")
        for op, where in sorted(g.unsupported.items()):
            lines.append(f"  {op} at {', '.join(sorted(set(where))[:3])}")
    return "\n".join(lines)


def _op_table(g) -> list[str]:
    """One line per distinct op, most forward FLOPs first: how many nodes, their FLOPs, whether
    a rule shards it."""
    by_op: dict[str, list] = {}
    for node in g.nodes:
        by_op.setdefault(node.op, []).append(node)
    rows = sorted(by_op.items(), key=lambda kv: (-sum(n.cost.fwd_flops for n in kv[1]), kv[0]))
    width = max(len(op) for op in by_op) if by_op else 2
    out = [f"{'op':<{width}} {'nodes':>6} {'fwd FLOPs':>10} {'bwd FLOPs':>10}  rule"]
    for op, nodes in rows:
        out.append(f"{op:<{width}} {len(nodes):>6} {_flops(sum(n.cost.fwd_flops for n in nodes)):>10} "
                   f"{_flops(sum(n.cost.bwd_flops for n in nodes)):>10}  {'yes' if has_rule(op) else 'no: replicated'}")
    return out
