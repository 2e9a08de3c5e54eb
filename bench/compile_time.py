"""``hapc compile`` of a 48-layer GPT (hidden 768, 12 heads, sequence 256, batch 64, vocabulary
8192: issue 13's setting), end to end: a fresh process that starts Python, traces the model on
the meta device, synthesizes, writes plan.json and the report, and emits program.py — the wall
time a user waits. The target is 5 s.

Two kinds of run, alternated so that both see the same machine load: **cold** (a fresh trace
cache: torch is imported, the model traced with torch.export and the trace stored) and
**warm** (a repeat compile: the graph and its node strategies come from the trace cache,
:mod:`hapc.frontend.cache.store`, and torch.export never runs). ``wall_seconds`` is the cold median,
as recorded before the cache existed; ``warm_wall_seconds`` the warm one.

Also recorded: the time ``hapc compile`` itself reports (from loading the cluster to the
last file written; without interpreter start-up and imports), and the process's CPU seconds
(close to the wall time on an idle machine; on a loaded one the wall time is not).

``--phases`` instead runs the same steps in this process and prints the CPU seconds of each
(imports, model build, trace, synthesize, plan.json, report, program.py; a forked child's
counted in the step that waited for it); ``--phases --warm``
the steps of a warm compile (after one cold compile in a subprocess fills a fresh cache).
A cold ``hapc compile`` does not run these steps in one line: it traces in a child forked
before torch is imported (:mod:`hapc.frontend.cache.child`) and plans as a warm compile does, so its
wall time is about the imports, model build and trace of the first list, then the warm
list's steps from synthesize on (its imports and cluster load overlap the child's).

``--timeline`` runs one cold compile in a fresh process and prints when each of its steps
began and ended, in the planning process and in the child that traces.

    python -m bench.compile_time [--repeats 3] [--layers 48] [--phases [--warm]] [--timeline]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import HAP8, ROOT, model_path, save_section, say


# Issue 13's 48-layer GPT; ``layers`` comes from --layers.
SETTINGS = {"hidden": 768, "heads": 12, "seq": 256, "batch": 64, "vocab": 8192}


def compile_once(layers: int, out: Path, cache_dir: Path) -> tuple[float, float | None, bool, str, float]:
    """One ``hapc compile`` in a fresh process with the trace cache in ``cache_dir``."""
    sets = [x for k, v in {"layers": layers, **SETTINGS}.items() for x in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-m", "hapc.cli", "compile", str(model_path("gpt")), "--cluster", str(HAP8),
           "-o", str(out), *sets, "-q"]
    start = time.perf_counter()
    cpu_before = os.times()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False,
                          env=dict(os.environ, HAPC_CACHE_DIR=str(cache_dir)))
    wall = time.perf_counter() - start
    cpu_after = os.times()
    cpu = (cpu_after.children_user - cpu_before.children_user) + (cpu_after.children_system - cpu_before.children_system)
    if proc.returncode != 0:
        raise RuntimeError(f"hapc compile failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    said = re.search(r"wrote .* in ([0-9.]+) s", proc.stdout)
    summary = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    return wall, float(said.group(1)) if said else None, (out / "program.py").exists(), summary, cpu


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds of this process, and of its forked children that have ended (the short
    trace of 3 blocks runs beside the main line)."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def phases(layers: int) -> list[tuple[str, float]]:
    """CPU seconds of each step of a cold ``hapc compile``, run in this process (call it in a
    fresh one: the imports are steps), forked children's included and named."""
    clock = [_cpu_seconds()]
    rows: list[tuple[str, float]] = []

    def step(name: str) -> None:
        now = _cpu_seconds()
        own, children = now[0] - clock[0][0], now[1] - clock[0][1]
        rows.append((name + (f" ({children:.2f} s in a child)" if children > 0.005 else ""), own + children))
        clock[0] = now

    from hapc.process.collector import gc_paused

    with gc_paused(freeze_after=True):      # as hapc compile imports them (hapc.frontend.torchimport)
        import torch  # noqa: F401
        step("import torch")
        import torch._dynamo  # noqa: F401  (torch.export imports it on first use)
        step("import torch._dynamo")
        import torch.export._trace  # noqa: F401  (and this, with aot_autograd and networkx)
        step("import torch.export's tracer")
    from costmodel.cluster import load_cluster
    from hapc.api import synthesize
    from synth.lp_highspy import preferred_backend    # the LP backend hapc compile uses
    from hapc.frontend.modelfile import load_model_file
    from hapc.report.summary import write_report
    from hapc.frontend.tracer import trace
    from hapc.frontend.cache.keys import TraceKey
    from hapc.frontend.cache.sources import Recorder
    from hapc.frontend.cache.store import TraceCache
    step("import hapc")
    overrides = {"layers": layers, **SETTINGS}
    cluster = load_cluster(str(HAP8))
    recorder = Recorder()          # what the trace read, as hapc compile records it for the cache
    with recorder.active():
        mf = load_model_file(str(model_path("gpt")), overrides)
        model = mf.build_model(device="meta")
        inputs = tuple(t.to("meta") for t in mf.build_inputs())
        step("load cluster, build model (meta)")
        traced = trace(model, inputs)
        step("trace (2 short exports, IR, FLOPs)")
    with tempfile.TemporaryDirectory() as tmp:
        TraceCache(tmp, note=say).store(TraceKey.for_model_file(str(model_path("gpt")), overrides), traced, recorder)
    step("trace-cache entry (compile: beside the search)")
    plan = synthesize(traced, None, cluster, model_file=str(model_path("gpt")), model_kwargs=overrides,
                      backend=preferred_backend())
    step("synthesize")
    with tempfile.TemporaryDirectory() as tmp:
        plan.save(Path(tmp) / "plan.json")
        step("plan.json")
        write_report(plan, tmp)
        step("report.md + chart")
        plan.emit(tmp, constants=traced.constants)
        step("program.py")
    return rows


def warm_phases(layers: int) -> list[tuple[str, float]]:
    """CPU seconds of each step of a warm ``hapc compile`` (graph and strategies from the trace
    cache), in this process, after a cold compile in a subprocess fills a fresh cache. Both
    processes run ``python -m`` from the repository root, so ``sys.path`` (part of the key)
    is the same."""
    cache = Path(tempfile.mkdtemp(prefix="hapc-bench-cache-"))
    with tempfile.TemporaryDirectory() as tmp:
        compile_once(layers, Path(tmp) / "cold", cache)
    clock = [time.process_time()]
    rows: list[tuple[str, float]] = []

    def step(name: str) -> None:
        now = time.process_time()
        rows.append((name, now - clock[0]))
        clock[0] = now

    from costmodel.cluster import load_cluster
    from hapc.api import synthesize
    from synth.lp_highspy import preferred_backend    # the LP backend hapc compile uses
    from hapc.report.summary import write_report
    from hapc.frontend.cache.keys import TraceKey
    from hapc.frontend.cache.store import TraceCache
    step("import hapc (no torch)")
    overrides = {"layers": layers, **SETTINGS}
    cluster = load_cluster(str(HAP8))
    step("load cluster")
    key = TraceKey.for_model_file(str(model_path("gpt")), overrides)
    traced = TraceCache(cache, note=say).lookup(key) if key is not None else None
    if traced is None:
        raise RuntimeError("the cold compile left no usable trace cache entry")
    step("trace cache: key, read, validate sources")
    plan = synthesize(traced, None, cluster, model_file=str(model_path("gpt")), model_kwargs=overrides,
                      backend=preferred_backend())
    step("synthesize" + (" (cached strategies)" if traced.strategies_installed else " (strategies from the rules)"))
    with tempfile.TemporaryDirectory() as tmp:
        plan.save(Path(tmp) / "plan.json")
        step("plan.json")
        write_report(plan, tmp)
        step("report.md + chart")
        plan.emit(tmp, constants=traced.constants)
        step("program.py" + (" (imports torch)" if "torch" in sys.modules else ""))
    shutil.rmtree(cache, ignore_errors=True)
    return rows


# Run in a fresh process by --timeline: hapc compile's own main, with the steps of a cold compile
# stamped (wall seconds since start, process, CPU seconds of that process) as they begin and end.
_TIMELINE_DRIVER = """
import os, sys, time
T0 = time.perf_counter()
def stamp(what):
    print(f"STAMP {time.perf_counter() - T0:.3f} {os.getpid()} {time.process_time():.3f} {what}", file=sys.stderr, flush=True)
import hapc.cli, hapc.cli.compile, hapc.frontend.from_file, hapc.frontend.modelfile, hapc.frontend.torchimport, hapc.frontend.cache.child
def wrap(owner, name):
    inner = getattr(owner, name)
    def stamped(*args, **kwargs):
        stamp("> " + name)
        try:
            return inner(*args, **kwargs)
        finally:
            stamp("< " + name)
    setattr(owner, name, stamped)
for owner, names in [(hapc.cli.compile, ["_import_planning", "_lp_backend", "_write_replan_cache"]),
                     (hapc.frontend.from_file, ["trace_file"]),
                     (hapc.frontend.torchimport, ["import_for_tracing"]), (hapc.frontend.modelfile, ["trace_for_device"]),
                     (hapc.frontend.cache.child.TraceChild, ["_trace_job", "_store_job", "traced", "path"])]:
    for name in names:
        wrap(owner, name)
stamp("start")
rc = hapc.cli.main(sys.argv[1:])
stamp("end")
sys.exit(rc)
"""


def timeline(layers: int) -> list[str]:
    """One cold ``hapc compile`` in a fresh process, its steps in the order they happened in the
    planning process and the child that traces (wall seconds from the start of ``main``; the
    driver's imports come before). The critical path: the child's imports and trace, then the
    parent from the end of its wait for the graph."""
    sets = [x for k, v in {"layers": layers, **SETTINGS}.items() for x in ("--set", f"{k}={v}")]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-c", _TIMELINE_DRIVER, "compile", str(model_path("gpt")),
                               "--cluster", str(HAP8), "-o", str(Path(tmp) / "out"), "-q", *sets],
                              cwd=ROOT, capture_output=True, text=True, check=False,
                              env=dict(os.environ, HAPC_CACHE_DIR=str(Path(tmp) / "cache")))
    stamps = [line.split(maxsplit=4)[1:] for line in proc.stderr.splitlines() if line.startswith("STAMP ")]
    if proc.returncode != 0 or not stamps:
        raise RuntimeError(f"hapc compile failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    start = float(stamps[0][0])
    parent = stamps[0][1]
    return [f"{float(t) - start:7.3f} s  {'parent' if pid == parent else 'child ':6s}  cpu {float(cpu):5.2f} s  {what}"
            for t, pid, cpu, what in stamps]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_time", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold/warm pairs to run")
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--phases", action="store_true", help="CPU seconds per step, in this process")
    parser.add_argument("--warm", action="store_true", help="with --phases: the steps of a warm (cached) compile")
    parser.add_argument("--timeline", action="store_true",
                        help="when each step of one cold compile began and ended, in which process")
    args = parser.parse_args(argv)
    if args.timeline:
        for line in timeline(args.layers):
            say(line)
        return 0
    if args.phases:
        rows = warm_phases(args.layers) if args.warm else phases(args.layers)
        total = sum(s for _, s in rows)
        for name, seconds in rows:
            say(f"{name:58s} {seconds:6.2f} s CPU  {100 * seconds / total:5.1f}%")
        say(f"{'total':58s} {total:6.2f} s CPU")
        return 0
    runs: dict[str, list[tuple[float, float | None, float]]] = {"cold": [], "warm": []}
    emitted, summary = True, ""
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            cache = Path(tmp) / f"cache{i}"              # fresh: the first compile is cold
            for kind in ("cold", "warm"):
                wall, said, emitted_now, summary, cpu = compile_once(args.layers, Path(tmp) / f"{kind}{i}", cache)
                runs[kind].append((wall, said, cpu))
                emitted = emitted and emitted_now
                say(f"hapc compile gpt-{args.layers} ({kind}): {wall:.1f} s wall, {cpu:.1f} s CPU"
                    + (f" ({said:.1f} s reported)" if said is not None else ""))
            same = all((Path(tmp) / f"cold{i}" / f).read_bytes() == (Path(tmp) / f"warm{i}" / f).read_bytes()
                       for f in ("plan.json", "program.py"))
            if not same:
                raise RuntimeError("the warm compile wrote another plan.json or program.py than the cold one")

    def median(kind: str, field: int) -> float | None:
        xs = [r[field] for r in runs[kind] if r[field] is not None]
        return statistics.median(xs) if xs else None

    save_section("compile", {
        "model": f"gpt-{args.layers}", "settings": SETTINGS, "cluster": HAP8.stem, "repeats": args.repeats,
        "wall_seconds": median("cold", 0), "wall_runs": [r[0] for r in runs["cold"]],
        "cpu_seconds": median("cold", 2), "reported_seconds": median("cold", 1),
        "warm_wall_seconds": median("warm", 0), "warm_wall_runs": [r[0] for r in runs["warm"]],
        "warm_cpu_seconds": median("warm", 2), "warm_reported_seconds": median("warm", 1),
        "emitted_program": emitted, "target_seconds": 5.0, "summary_first_line": summary,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
