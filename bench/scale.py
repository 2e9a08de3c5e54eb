"""Growth with the cluster: synthesis time of GPT-12 (batch 512) against the number of devices
(8, 64, 256: nodes of 8, half A100-80GB and half V100) and, at 256 devices, against the number
of device types (1, 2, 4).

What should grow is the number of distinct kinds of device and of nodes, not of devices: the
simulator runs one timeline per class of alike ranks (:mod:`costmodel.classes`), the share LP
has one variable per class of identical devices (:func:`synth.ratios.device_classes`) and
collectives are priced per node. Each row gives the counts behind that (classes, LP
variables) beside the seconds, so the table says *why* as well as how fast:

* **synthesize**: ``synthesize_program`` with tracing excluded (the graph is traced once),
  median of ``--repeats`` in one warm process;
* **simulate**: one simulation of the chosen plan (median);
* **compile** (``--compile``): ``hapc compile`` of the issue's example on the 256-device file,
  end to end in a fresh process (imports, tracing, search, emission, report).

Timings on a loaded machine are several times too slow and noisy; compare rows of one run.

* **phases** (``--phases``, nothing saved): CPU seconds of each phase of ``hapc compile`` of
  the example on 8 and on 256 devices, each in a fresh process.

    python -m bench.scale [--repeats 3] [--compile]
    python -m bench.scale --phases
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import CLUSTERS_DIR, ROOT, median_seconds, model_path, save_section, say, trace_model

LAYERS, BATCH = 12, 512
EXAMPLE = CLUSTERS_DIR / "a100x128-v100x128-256gpu.yaml"
# Device types in the order the type sweep adds them, each with its node's link.
TYPES = (("A100-80GB", "nvlink3"), ("V100-32GB", "nvlink2"), ("H100", "nvlink4"), ("A10", "pcie4"))


def growth_cluster(devices: int, types: int) -> dict[str, Any]:
    """``devices`` in nodes of 8 (fewer per node when there are fewer nodes than types), the
    nodes split evenly between the first ``types`` of :data:`TYPES`, 100 Gb/s between nodes."""
    per_node = min(8, devices)
    nodes = devices // per_node
    if nodes < types:                 # 8 devices of two types: two nodes of 4
        per_node, nodes = devices // types, types
    if nodes % types:
        raise ValueError(f"{nodes} nodes do not split evenly over {types} device types")
    return {
        "name": f"growth-{devices}gpu-{types}types",
        "nodes": [{"count": nodes // types, "devices": [{"type": t, "count": per_node}], "intra_link": link}
                  for t, link in TYPES[:types]],
        "network": {"bandwidth_Gbps": 100, "latency_us": 20},
    }


CASES = ((8, 2), (64, 2), (256, 2), (256, 1), (256, 4))


def row(graph, devices: int, types: int, repeats: int) -> dict[str, Any]:
    from costmodel.classes import rank_classes
    from costmodel.cluster import load_cluster
    from costmodel.simulator import simulate
    from synth.loads import share_problem
    from synth.ratios import device_classes
    from synth.synthesize import synthesize_program

    cluster = load_cluster(growth_cluster(devices, types))
    synth_s, runs, syn = median_seconds(lambda: synthesize_program(graph, cluster), repeats, 60.0)
    best = syn.best
    sim_s, _, _ = median_seconds(lambda: simulate(best.program, cluster), max(repeats, 3))
    lp_vars = len(device_classes(share_problem(best.program, best.sim, cluster)))
    out = {"devices": devices, "device_types": types, "nodes": len(cluster.nodes),
           "synthesize_seconds": synth_s, "synthesize_runs": runs, "simulate_seconds": sim_s,
           "rank_classes": rank_classes(best.program, cluster).count, "lp_variables": lp_vars,
           "searches": syn.searches, "plan": best.name, "plan_ms": best.seconds * 1e3}
    say(f"{devices:>4} devices, {types} type(s), {out['nodes']:>2} nodes: synthesize {synth_s:6.2f} s, "
        f"simulate {sim_s * 1e3:7.1f} ms, {out['rank_classes']} rank classes, {lp_vars} LP variables, "
        f"{syn.searches} searches; plan {best.name} {out['plan_ms']:.3f} ms")
    return out


def compile_seconds(repeats: int) -> list[float]:
    """``hapc compile`` of the example, end to end, each in a fresh process."""
    import tempfile

    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "hapc.cli", "compile", str(model_path("gpt")),
                            "--cluster", str(EXAMPLE), "--set", f"batch={BATCH}", "-o", out,
                            "--no-trace-cache"],            # cold, as the first compile of a model is
                           cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            runs.append(time.perf_counter() - start)
    return runs


def compile_phases(cluster: str) -> dict[str, float]:
    """CPU seconds of each phase of ``hapc compile`` (the example model) on ``cluster``, in this
    process from its start: CPU time is less distorted than wall time on a shared machine.
    Run it in a fresh process (:func:`phases_in_fresh_process`) so that the imports count."""
    import tempfile
    from pathlib import Path

    def cpu_seconds() -> float:     # forked children's too (hapc.frontend.blocktrace traces in one)
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    clock = [cpu_seconds()]

    def mark() -> None:
        clock.append(cpu_seconds())

    from hapc.frontend.torchimport import import_for_tracing

    import_for_tracing()          # as hapc compile imports torch
    mark()
    from costmodel.cluster import load_cluster
    from hapc.api import synthesize
    from synth.lp_highspy import preferred_backend
    from hapc.frontend.modelfile import load_model_file, trace_for_device
    from hapc.report.summary import write_report
    from hapc.frontend.tracer import trace
    mark()
    model = str(model_path("gpt"))
    mf = load_model_file(model, {"batch": BATCH})
    from hapc.codegen.launch import run_device
    traced = trace_for_device(mf, trace, run_device(load_cluster(cluster)))
    mark()
    plan = synthesize(traced, None, load_cluster(cluster), model_file=model, model_kwargs={"batch": BATCH},
                      backend=preferred_backend())
    mark()
    with tempfile.TemporaryDirectory() as out:
        plan.save(Path(out) / "plan.json")
        write_report(plan, out)
        plan.emit(out, constants=traced.constants)
        plan.summary()
    mark()
    names = ("torch imports (torch, _dynamo, export)", "hapc imports", "trace", "synthesize", "save, report, emit")
    return {name: b - a for name, a, b in zip(names, clock, clock[1:])}


def phases_in_fresh_process(cluster: str) -> dict[str, float]:
    import json

    code = f"import json; from bench.scale import compile_phases; print(json.dumps(compile_phases({cluster!r})))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per timing; the median is kept")
    parser.add_argument("--compile", action="store_true", help="also time hapc compile of the 256-device example")
    parser.add_argument("--phases", action="store_true",
                        help="only the CPU seconds of each compile phase, example model on 8 and on 256 devices")
    args = parser.parse_args(argv)
    if args.phases:
        for name, cluster in (("8", growth_cluster(8, 2)), ("256", str(EXAMPLE))):
            if isinstance(cluster, dict):            # a file, as hapc compile reads one
                import tempfile

                import yaml

                with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                    yaml.safe_dump(cluster, f)
                cluster = f.name
            phases = phases_in_fresh_process(cluster)
            say(f"{name:>3} devices, CPU s: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
                + f"; total {sum(phases.values()):.2f}")
        return 0
    from synth.synthesize import synthesize_program
    from costmodel.cluster import load_cluster

    graph = trace_model("gpt", layers=LAYERS, batch=BATCH).graph
    synthesize_program(graph, load_cluster(growth_cluster(8, 2)))     # imports and first calls, untimed
    rows = [row(graph, devices, types, args.repeats) for devices, types in CASES]
    data: dict[str, Any] = {"model": f"gpt-{LAYERS} batch {BATCH}", "rows": rows}
    if args.compile:
        runs = compile_seconds(args.repeats)
        data["compile_seconds"] = statistics.median(runs)
        data["compile_runs"] = runs
        say(f"hapc compile, GPT-{LAYERS} batch {BATCH} on {EXAMPLE.name}: {statistics.median(runs):.1f} s "
            f"(runs {', '.join(f'{x:.1f}' for x in runs)})")
    save_section("scale", data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
