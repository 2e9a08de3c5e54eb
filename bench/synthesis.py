"""Synthesis time: against depth (GPT 2..48 layers), for the architectures HAP published
times for (ViT, BERT, BERT-MoE) plus VGG19, and against the number of devices.

Two timings per row, both with tracing excluded (the graph is traced once, beforehand):

* **search**: build the search space (strategies and prices per node) and run the A* search
  once, at FLOPs-proportional shares — the ``synth.search`` step on a ``SearchSpace``;
* **synthesize**: the whole loop ``synthesize_program`` runs (standard baselines, search at
  several overlap assumptions, the ratio LP, repeated until the time stops improving,
  every candidate simulated). This is what a user waits for, and what the HAP anchors are
  compared with.

Each is the median of ``--repeats`` runs (at least 2, fewer than ``--repeats`` once the runs
so far took 20 s) in one warm process (imports and a first tiny synthesis done beforehand, so
no run pays for loading scipy).

    python -m bench.synthesis [--repeats 3] [--quick]
    python -m bench.synthesis --models moe-12,vit-24     # chosen rows, printed, not saved
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from bench.common import (
    HAP8,
    HAP_ANCHOR_SECONDS,
    clusters_by_size,
    median_seconds,
    save_section,
    say,
    small_config,
    timed,
    trace_model,
)

DEPTHS = (2, 4, 8, 12, 24, 48)
ARCHITECTURES: tuple[tuple[str, int | None], ...] = (
    ("vit", 12), ("vit", 24), ("vit", 48), ("bert", 12), ("bert", 24), ("vgg", None), ("moe", 12))
DEVICE_BATCH = 64          # every one of 64 devices gets at least one sample
WIDE_BATCH = 512           # beyond 64 devices: issue 13's example, GPT-12 batch 512 on 256 devices
BUDGET_SECONDS = 20.0      # per timing: no further repeat once the runs so far took this long


def time_model(traced, cluster, repeats: int) -> dict[str, Any]:
    """Median search-only and full-synthesis seconds of one traced graph on one cluster."""
    from synth.costs import Prices
    from synth.search import search
    from synth.space import SearchSpace
    from synth.synthesize import synthesize_program

    graph = traced.graph

    def search_once():
        space = SearchSpace.build(graph, Prices(graph, cluster, cluster.flops_shares()))
        return search(space)

    search_s, search_runs, result = median_seconds(search_once, repeats, BUDGET_SECONDS)
    synth_s, synth_runs, syn = median_seconds(lambda: synthesize_program(graph, cluster), repeats,
                                              BUDGET_SECONDS)
    best = syn.best
    return {
        "nodes": len(graph.nodes), "trace_seconds": traced.seconds,
        "search_seconds": search_s, "search_runs": search_runs,
        "search_exact": result.exact, "states_expanded": result.states_expanded,
        "segments": result.segments, "distinct_segments": result.distinct_segments,
        "synthesize_seconds": synth_s, "synthesize_runs": synth_runs,
        "synthesize_inner_search_seconds": syn.search_seconds, "synthesize_lp_seconds": syn.lp_seconds,
        "rounds": len(syn.rounds), "plan": best.name, "plan_seconds": best.seconds,
        "synthesize_searches": syn.searches, "synthesize_states_expanded": syn.states_expanded,
        "warm_starts": syn.warm_starts,
        "plan_exact": best.search.exact if best.search else None,
        "plan_gap": best.search.gap if best.search else None,
    }


def warm_up(cluster) -> None:
    """Pay imports and first-call costs (scipy's HiGHS, cvxpy, rule modules) outside the timings."""
    from synth.synthesize import synthesize_program

    synthesize_program(trace_model("gpt", **small_config("gpt")).graph, cluster)


def depth_rows(cluster, repeats: int, depths=DEPTHS, architectures=ARCHITECTURES) -> list[dict[str, Any]]:
    rows = []
    models = [("gpt", d) for d in depths] + list(architectures)
    for name, layers in models:
        kwargs = {"layers": layers} if layers else {}
        traced = trace_model(name, **kwargs)
        row = {"model": name, "layers": layers, **time_model(traced, cluster, repeats)}
        anchor = HAP_ANCHOR_SECONDS.get((name, layers or 0))
        if anchor is not None:
            row["hap_seconds"] = anchor
            row["speedup_vs_hap_synthesize"] = anchor / row["synthesize_seconds"]
            row["speedup_vs_hap_search"] = anchor / row["search_seconds"]
        say(f"{name}-{layers or ''}: {row['nodes']} nodes, search {row['search_seconds']:.2f} s, "
            f"synthesize {row['synthesize_seconds']:.2f} s" + (f" (HAP {anchor} s)" if anchor else ""))
        rows.append(row)
    return rows


def device_rows(repeats: int, layers: int = 12) -> list[dict[str, Any]]:
    from costmodel.cluster import load_cluster

    traced: dict[int, Any] = {}
    rows = []
    for world, source in clusters_by_size().items():
        cluster = load_cluster(source)
        batch = DEVICE_BATCH if world <= DEVICE_BATCH else WIDE_BATCH
        if batch not in traced:
            traced[batch] = trace_model("gpt", layers=layers, batch=batch)
        row = {"model": "gpt", "layers": layers, "batch": batch, "devices": world,
               "cluster": cluster.name, **time_model(traced[batch], cluster, repeats)}
        say(f"gpt-{layers} on {world} devices: search {row['search_seconds']:.2f} s, "
            f"synthesize {row['synthesize_seconds']:.2f} s")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    from costmodel.cluster import load_cluster

    parser = argparse.ArgumentParser(prog="python -m bench.synthesis", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per timing; the median is kept")
    parser.add_argument("--quick", action="store_true", help="GPT 2/12 and ViT-12 only, one run each")
    parser.add_argument("--models", help="only these depth rows, e.g. moe-12,vit-24 (printed as JSON, "
                                         "results.json left alone)")
    args = parser.parse_args(argv)
    cluster = load_cluster(str(HAP8))
    load_before = os.getloadavg()[0]
    seconds, _ = timed(lambda: warm_up(cluster))
    say(f"warm-up {seconds:.1f} s on {cluster.name}")
    if args.models:
        import json

        chosen = [(name, int(layers) if layers else None)
                  for name, _, layers in (m.strip().partition("-") for m in args.models.split(","))]
        for row in depth_rows(cluster, args.repeats, depths=(), architectures=tuple(chosen)):
            print(json.dumps(row, sort_keys=True))
        return 0
    if args.quick:
        depth = depth_rows(cluster, 1, depths=(2, 12), architectures=(("vit", 12),))
        devices = []
    else:
        depth = depth_rows(cluster, args.repeats)
        devices = device_rows(args.repeats)
    save_section("synthesis", {"cluster": cluster.name, "repeats": 1 if args.quick else args.repeats,
                               "load_avg_1min_before": round(load_before, 2),
                               "depth": depth, "devices": devices})
    return 0


if __name__ == "__main__":
    sys.exit(main())
