"""Plan quality: hapc's predicted time per iteration against every standard baseline and the
lower bound (total FLOPs over total cluster FLOPS), for every example cluster.

All figures come from one synthesis per cluster, scored by the same cost model, so the
speed-ups are ratios within one run. The model is GPT-12 (hidden 768) with a global batch of
8 per 8 devices (every device gets a sample), except on the two CPU-worker clusters
(small-mixed, cpu4), where it is the SMALL GPT that the demo and the tests run.

    python -m bench.quality
"""

from __future__ import annotations

import sys
from typing import Any

from bench.common import CLUSTERS_DIR, ROOT, save_section, say, small_config, timed, trace_model

CPU_CLUSTERS = {"small-mixed", "cpu4"}


def model_for(cluster) -> tuple[str, dict[str, Any]]:
    if cluster.name in CPU_CLUSTERS or all(d.type == "cpu" for d in cluster.devices):
        return "gpt-small", small_config("gpt")
    return f"gpt-12 batch {max(8, cluster.world)}", {"layers": 12, "batch": max(8, cluster.world)}


def cluster_row(path, traces: dict[str, Any]) -> dict[str, Any]:
    from costmodel.cluster import load_cluster
    from hapc.api import synthesize

    cluster = load_cluster(str(path))
    label, kwargs = model_for(cluster)
    if label not in traces:                 # clusters of the same size share one traced graph
        traces[label] = trace_model("gpt", **kwargs)
    traced = traces[label]
    seconds, plan = timed(lambda: synthesize(traced, None, cluster))
    baselines = dict(sorted(plan.baselines.items()))
    best_baseline = min(baselines, key=baselines.__getitem__)
    return {
        "cluster": cluster.name or path.stem, "file": str(path.relative_to(ROOT)), "devices": cluster.world,
        "device_types": sorted({d.type for d in cluster.devices}), "model": label,
        "plan": plan.name, "plan_seconds": plan.cost, "lower_bound_seconds": plan.lower_bound,
        "baselines_seconds": baselines,
        "speedups": {k: v / plan.cost for k, v in baselines.items()},
        "best_baseline": best_baseline, "speedup_vs_best_baseline": baselines[best_baseline] / plan.cost,
        "gap_to_lower_bound": plan.cost / plan.lower_bound if plan.lower_bound > 0 else None,
        "shares": plan.ratios, "memory_fraction_max": max(m / c for m, c in
                                                          zip(plan.memory, cluster.memory_bytes())),
        "synthesize_seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    rows: list[dict[str, Any]] = []
    traces: dict[str, Any] = {}
    for path in sorted(CLUSTERS_DIR.glob("*.yaml")):
        row = cluster_row(path, traces)
        say(f"{row['cluster']}: {row['plan']} {row['plan_seconds'] * 1e3:.3f} ms/iter, "
            f"{row['speedups']['dp-even']:.2f}x over dp-even, "
            f"{row['speedup_vs_best_baseline']:.2f}x over {row['best_baseline']}")
        rows.append(row)
    save_section("quality", {"clusters": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
