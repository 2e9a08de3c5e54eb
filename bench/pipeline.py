"""Pipeline stages (issue 12): on every multi-node example cluster, the best plan with stages
against the best one-stage (1-D) plan and every baseline, ``pipeline-even`` included, all
scored by the same cost model in one synthesis per cluster.

The models: the 48-layer GPT of issue 12 (hidden 768, 12 heads, seq 256, batch 64, vocab 8192)
on the 8-GPU two-node cluster, GPT-12 and BERT-base (batch 64) on HAP's 64-GPU cluster, GPT-12
(batch 16) on the two-node V100 cluster; and the 48-layer GPT on 64 GPUs for the stage
planner's own time (wall and CPU, with its counts: group syntheses, DP runs, exact front DPs,
plans priced, and whether the plan is proven optimal under the cost model).

The measured CPU step time of a pipelined plan against the 1-D plan comes from running both
emitted programs on 4 gloo ranks: ``scripts/pipeline_step.sh`` (quiet 2-core machine,
2026-12-01: one-stage 0.67-0.76 s, pipelined 0.93-0.98 s per step; one host has no slow link
for the pipeline to save, so this is its overhead). It is filled in under ``"measured"`` when given.

    python -m bench.pipeline [--no-overhead]            # make bench: everything
    python -m bench.pipeline --overhead [--repeats N]   # only what stages="auto" adds on 8 devices
"""

from __future__ import annotations

import sys
import time
from typing import Any

from bench.common import CLUSTERS_DIR, HAP8, HAP64, save_section, say, timed, trace_model

GPT48 = {"layers": 48, "hidden": 768, "heads": 12, "seq": 256, "batch": 64, "vocab": 8192}
CASES = (
    ("gpt-48 (issue 12)", "gpt", GPT48, HAP8),
    ("gpt-12 batch 64", "gpt", {"layers": 12, "batch": 64}, HAP64),
    ("bert-base batch 64", "bert", {"layers": 12, "batch": 64}, HAP64),
    ("gpt-12 batch 16", "gpt", {"layers": 12, "batch": 16}, CLUSTERS_DIR / "v100x16-2nodes-25gbps.yaml"),
)


def case_row(label: str, model: str, kwargs: dict[str, Any], cluster_path) -> dict[str, Any]:
    from costmodel.cluster import load_cluster
    from hapc.api import synthesize

    cluster = load_cluster(str(cluster_path))
    traced = trace_model(model, **kwargs)
    seconds, plan = timed(lambda: synthesize(traced, None, cluster, stages="auto"))
    pipe = plan.pipeline
    one_stage = plan.sim.iteration_seconds
    row: dict[str, Any] = {
        "model": label, "cluster": cluster.name, "devices": cluster.world, "nodes": len(cluster.nodes),
        "plan_seconds": plan.cost, "one_stage_seconds": one_stage, "lower_bound_seconds": plan.lower_bound, "baselines_seconds": dict(sorted(plan.baselines.items())),
        "speedup_vs_one_stage": one_stage / plan.cost,
        "speedup_vs_dp_even": plan.baselines["dp-even"] / plan.cost,
        "never_worse": all(plan.cost <= v * (1 + 1e-9) for v in plan.baselines.values()) and plan.cost <= one_stage,
        "synthesize_seconds": seconds,
    }
    if pipe is not None:
        row.update(stages=[{"nodes": [s.first_node, s.stop_node], "ranks": [s.ranks[0], s.ranks[-1]]}
                           for s in pipe.stages],
                   microbatches=pipe.microbatches, schedule=pipe.schedule, bubble=pipe.cost.bubble_fraction,
                   **{k: pipe.search.get(k) for k in ("group_syntheses", "dp_runs", "front_dp_runs",
                                                        "candidates_priced", "exact", "gap")})
    return row


def planner_time_64() -> dict[str, Any]:
    """The stage planner alone (the one-stage search excluded) for the 48-layer GPT on 64 GPUs."""
    from costmodel.cluster import load_cluster
    from synth.stages import StagePlanner

    traced = trace_model("gpt", **GPT48)
    cluster = load_cluster(str(HAP64))
    cpu_before = time.process_time()
    seconds, pipe = timed(lambda: StagePlanner(traced.graph, cluster).plan())
    cpu = time.process_time() - cpu_before
    search = pipe.search if pipe else {}
    return {"model": "gpt-48", "cluster": cluster.name, "planner_seconds": seconds, "planner_cpu_seconds": cpu,
            "stages": len(pipe.stages) if pipe else 1, "iteration_seconds": pipe.iteration_seconds if pipe else None,
            **{k: search.get(k, 0) for k in ("group_syntheses", "dp_runs", "front_dp_runs", "candidates_priced")},
            "exact": search.get("exact")}


OVERHEAD_MODELS = (("gpt-48", "gpt", GPT48), ("vit-24", "vit", {"layers": 24}), ("bert-24", "bert", {"layers": 24}))
# Issue 13's whole-synthesize budgets (wall seconds), which stages="auto" must fit on 8 devices:
# ViT-24 0.93, BERT-24 0.8, 48 layers 1.5.
OVERHEAD_BUDGETS = {"gpt-48": 1.5, "vit-24": 0.93, "bert-24": 0.8}


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children: the stage planner searches device
    groups in a forked child (synth.stages.StagePlanner.start_groups), whose time counts too."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def stage_overhead(repeats: int = 3) -> list[dict[str, Any]]:
    """What ``stages="auto"`` adds to a one-stage ``synthesize()`` on HAP's 8 devices (issue 13:
    the stage search must fit the synthesis budgets there): both timed alternately, ``repeats``
    times each, medians of wall and CPU seconds (children included), with the stage search's
    counts. The budgets are wall time: on two cores the group searches run beside the
    one-stage search."""
    import statistics

    from costmodel.cluster import load_cluster
    from hapc.api import synthesize

    cluster = load_cluster(str(HAP8))
    rows = []
    for label, model, kwargs in OVERHEAD_MODELS:
        traced = trace_model(model, **kwargs)
        synthesize(traced, None, cluster)                      # warm caches and lazy imports alike
        times: dict[str, list[tuple[float, float]]] = {"one": [], "auto": []}
        plan = None
        for _ in range(repeats):
            for key, stages in (("one", None), ("auto", "auto")):
                cpu, wall = _cpu_seconds(), time.perf_counter()
                result = synthesize(traced, None, cluster, stages=stages)
                times[key].append((time.perf_counter() - wall, _cpu_seconds() - cpu))
                plan = result if stages else plan
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
        search = plan.pipeline.search if plan is not None and plan.pipeline is not None else {}
        rows.append({"model": label, "cluster": cluster.name, "one_stage_seconds": med["one"][0],
                     "auto_seconds": med["auto"][0], "one_stage_cpu_seconds": med["one"][1],
                     "auto_cpu_seconds": med["auto"][1], "added_cpu_seconds": med["auto"][1] - med["one"][1],
                     "ratio": med["auto"][1] / med["one"][1], "plan_seconds": plan.cost if plan else None,
                     "stages": len(plan.pipeline.stages) if plan is not None and plan.pipeline is not None else 1,
                     **{k: search.get(k) for k in ("group_syntheses", "dp_runs", "problems",
                                                   "problems_proven_in_first_pass", "front_dp_runs",
                                                   "candidates_priced", "exact")}})
        r = rows[-1]
        say(f"{label} on {cluster.name}: one stage {r['one_stage_seconds']:.2f} s wall "
            f"({r['one_stage_cpu_seconds']:.2f} CPU), stages=auto {r['auto_seconds']:.2f} s wall "
            f"({r['auto_cpu_seconds']:.2f} CPU, +{r['added_cpu_seconds']:.2f} s, {r['ratio']:.2f}x); "
            f"{r['group_syntheses']} group syntheses, {r['dp_runs']} DP runs, {r['front_dp_runs']} front DPs")
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if "--overhead" in argv:
        repeats = int(argv[argv.index("--repeats") + 1]) if "--repeats" in argv else 3
        save_section("pipeline_overhead", {"rows": stage_overhead(repeats)})
        return 0
    rows = []
    for label, model, kwargs, path in CASES:
        row = case_row(label, model, kwargs, path)
        say(f"{row['cluster']} {label}: {row['plan_seconds'] * 1e3:.3f} ms/iter, "
            f"{row['speedup_vs_one_stage']:.2f}x over the 1-D plan, {row['speedup_vs_dp_even']:.2f}x over dp-even")
        rows.append(row)
    planner = planner_time_64()
    say(f"stage planner, gpt-48 on 64 GPUs: {planner['planner_seconds']:.1f} s")
    save_section("pipeline", {"clusters": rows, "planner_64": planner})
    if "--no-overhead" not in argv:
        save_section("pipeline_overhead", {"rows": stage_overhead()})
    return 0


def render_section(res: dict[str, Any]) -> list[str]:
    """The BENCHMARKS.md section (called by bench.render)."""
    data = res.get("pipeline")
    out = ["## 6. Pipeline stages (predicted time per iteration)", ""]
    if not data:
        return out + ["Not run yet (`python -m bench.pipeline`).", ""]
    out += ["| cluster | model | plan ms | 1-D plan ms | pipeline-even ms | dp-even ms | vs 1-D | vs dp-even | "
            "stages | micro-batches | bubble | exact | never worse |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["clusters"]:
        b = r["baselines_seconds"]
        even = b.get("pipeline-even")
        out.append(f"| {r['cluster']} | {r['model']} | {r['plan_seconds'] * 1e3:.1f} | {r['one_stage_seconds'] * 1e3:.1f} "
                   f"| {even * 1e3 if even else float('nan'):.1f} | {b['dp-even'] * 1e3:.1f} "
                   f"| {r['speedup_vs_one_stage']:.2f}x | {r['speedup_vs_dp_even']:.2f}x | {len(r.get('stages', [])) or 1} "
                   f"| {r.get('microbatches', 1)} | {r.get('bubble', 0.0) * 100:.0f}% "
                   f"| {_exactness(r)} | {'yes' if r['never_worse'] else 'NO'} |")
    p = data.get("planner_64")
    if p:
        cpu = f", {p['planner_cpu_seconds']:.1f} s of CPU" if "planner_cpu_seconds" in p else ""
        counts = f", {p['dp_runs']} DP runs, {p['front_dp_runs']} front DPs" if "dp_runs" in p else ""
        out += ["", f"Stage planner alone, {p['model']} on {p['cluster']}: {p['planner_seconds']:.1f} s wall{cpu} "
                f"({p['group_syntheses']} group syntheses{counts}; target 10 s)."]
    overhead = res.get("pipeline_overhead")
    if overhead:
        out += ["", "What `stages=\"auto\"` adds to a one-stage synthesize() on 8 devices (`python -m bench.pipeline "
                "--overhead`; seconds, medians; CPU includes the child that searches device groups):", "",
                "| model | one stage wall | stages=auto wall | budget (issue 13) | one stage CPU | stages=auto CPU "
                "| added CPU | group syntheses | DP runs | front DPs | exact |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in overhead["rows"]:
            budget = OVERHEAD_BUDGETS.get(r["model"])
            verdict = "-" if budget is None else f"{budget:g} s: {'met' if r['auto_seconds'] <= budget else 'NOT met'}"
            out.append(f"| {r['model']} | {r['one_stage_seconds']:.2f} | {r['auto_seconds']:.2f} | {verdict} "
                       f"| {r['one_stage_cpu_seconds']:.2f} | {r['auto_cpu_seconds']:.2f} "
                       f"| {r['added_cpu_seconds']:.2f} | {r['group_syntheses']} | {r['dp_runs']} | {r['front_dp_runs']} "
                       f"| {'yes' if r['exact'] else 'no'} |")
    measured = data.get("measured")
    out += ["", f"Measured CPU step, pipelined vs 1-D plan: {measured}" if measured else
            "Measured CPU step of a pipelined plan: run scripts/pipeline_step.sh (not part of this section's run)."]
    return out + [""]


def _exactness(row: dict[str, Any]) -> str:
    if "exact" not in row or row["exact"] is None:
        return "-"
    return "yes" if row["exact"] else f"gap {row['gap'] * 100:.2f}%"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
