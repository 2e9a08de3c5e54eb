"""Whole-``synthesize()`` time of this checkout against another one, paired so that machine
load cancels out: two warm worker processes (one per checkout) synthesize the same traced
model back to back, in ABBA order, many times; the figure is the median of the per-pair
ratios of CPU seconds. On a shared machine whose load swings from 1 to 5 within a minute,
separate benchmark runs differ by 2x; paired ratios stay within a few percent.

Each worker also reports the plan it found (predicted seconds per iteration), so a speed-up
that changed the plan shows at once.

    mkdir -p /tmp/main && git archive main | tar -x -C /tmp/main
    python -m bench.synthesis_ab --base /tmp/main --models vit:24,vit:48,bert:24,moe:12 --pairs 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import HAP8

# Run inside each checkout (its own hapc, synth and costmodel), so the base needs no copy of
# this file: trace the models, warm up, then synthesize the model named on each input line.
WORKER = """
import sys, time
from bench.common import trace_model
from costmodel.cluster import load_cluster
from synth.synthesize import synthesize_program
cluster = load_cluster(sys.argv[1])
graphs = {}
for spec in sys.argv[2].split(","):
    name, _, layers = spec.partition(":")
    graphs[spec] = trace_model(name, **({"layers": int(layers)} if layers else {})).graph
    synthesize_program(graphs[spec], cluster)
print("ready", flush=True)
for line in sys.stdin:
    graph = graphs[line.strip()]
    start = time.process_time()
    best = synthesize_program(graph, cluster).best
    print(time.process_time() - start, repr(best.seconds), flush=True)
"""


class Worker:
    def __init__(self, tree: Path, cluster: str, models: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.process = subprocess.Popen([sys.executable, "-c", WORKER, cluster, models], cwd=tree, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the worker in {tree} did not start")

    def synthesize(self, model: str) -> tuple[float, str]:
        self.process.stdin.write(model + "\n")
        self.process.stdin.flush()
        seconds, plan = self.process.stdout.readline().split()
        return float(seconds), plan

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.synthesis_ab", description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="the other checkout (a git archive of main)")
    parser.add_argument("--models", default="vit:24,vit:48,bert:24,moe:12", help="NAME:LAYERS,...")
    parser.add_argument("--pairs", type=int, default=10, help="paired runs per model")
    parser.add_argument("--cluster", default=str(HAP8))
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    base, new = (Worker(tree, args.cluster, args.models) for tree in (args.base.resolve(), here))
    try:
        for model in args.models.split(","):
            ratios, base_runs, new_runs, plans = [], [], [], set()
            for i in range(args.pairs):
                order = (base, new) if i % 2 == 0 else (new, base)
                got = {worker: worker.synthesize(model) for worker in order}
                base_runs.append(got[base][0])
                new_runs.append(got[new][0])
                ratios.append(got[new][0] / got[base][0])
                plans.add((got[base][1], got[new][1]))
            same = all(a == b for a, b in plans)
            print(f"{model}: CPU s base median {statistics.median(base_runs):.3f} (min {min(base_runs):.3f}), "
                  f"this checkout {statistics.median(new_runs):.3f} (min {min(new_runs):.3f}); "
                  f"median ratio {statistics.median(ratios):.3f} over {args.pairs} pairs; "
                  f"plans {'equal' if same else 'DIFFER ' + str(sorted(plans))}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        base.close()
        new.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
