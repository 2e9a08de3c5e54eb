"""The ``hapc`` command line.

Exit codes: 0 ok, 2 bad input (one line, no traceback), 1 internal error (set
``HAPC_DEBUG=1`` to see the traceback). Each subcommand lives in a small function here and
calls the library; no pipeline logic lives in the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from hapc.errors import UserError


def _cmd_ir(args: argparse.Namespace) -> int:
    from hapc.report.ir_text import format_ir
    from hapc.frontend.modelfile import load_model_file, parse_overrides
    from hapc.frontend.tracer import trace

    mf = load_model_file(args.model, parse_overrides(args.set))
    model = mf.build_model(device="meta" if args.meta else None)
    inputs = mf.build_inputs()
    traced = trace(model, inputs)
    print(format_ir(traced, layouts=not args.no_layouts, limit=args.limit))
    return 0


def _progress(args: argparse.Namespace):
    if getattr(args, "quiet", False):
        return lambda msg: None
    return lambda msg: print(f"  {msg}", file=sys.stderr, flush=True)


def _cmd_compile(args: argparse.Namespace) -> int:
    _no_collection_at_exit()
    with contextlib.ExitStack() as cleanup:      # a child tracing the model never outlives the command
        return _compile(args, cleanup)


def _compile(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> int:
    import time

    from hapc.frontend.modelfile import parse_overrides

    say = _progress(args)
    started = time.perf_counter()
    _check_precision(args.precision)
    stages = _stages_arg(args.stages)
    overrides = parse_overrides(args.set)
    loaded = []

    def meanwhile() -> None:          # while a child traces; else before the trace
        from costmodel.cluster import load_cluster

        loaded.append(load_cluster(args.cluster))     # bad cluster files fail before any tracing
        _import_planning(emit=not args.no_emit)

    traced, cached = _traced_model(args, overrides, meanwhile, cleanup)
    cluster = loaded[0]
    from hapc.api import synthesize
    from hapc.report.summary import write_report

    if traced.graph.unsupported:
        ops = ", ".join(f"{op} ({where[0]})" for op, where in sorted(traced.graph.unsupported.items()))
        print(f"hapc: warning: no sharding rule, these run replicated: {ops}", file=sys.stderr)
    how = "from the trace cache" if getattr(traced, "from_cache", False) else "traced"
    say(f"{len(traced.graph.nodes)} nodes {how} in {traced.seconds:.1f} s; searching")
    plan = synthesize(traced, None, cluster, time_budget=args.time_budget, optimizer=args.optimizer,
                      model_file=str(Path(args.model).resolve()), model_kwargs=overrides, progress=say,
                      precision=args.precision, stages=stages, microbatches=args.microbatches,
                      schedule=args.schedule, backend=_lp_backend())
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    plan.save(out / "plan.json")
    _write_replan_cache(plan, out)
    if cached is not None:
        cached(plan, out)
    write_report(plan, out)
    emitted = ""
    if not args.no_emit:
        try:
            emitted = str(plan.emit(out, constants=traced.constants))
        except ImportError:
            emitted = ""
    print(plan.summary())
    wrote = ["plan.json", "report.md"] + (["program.py"] if emitted else [])
    print(f"wrote {', '.join(str(out / w) for w in wrote)} in {time.perf_counter() - started:.1f} s")
    if emitted:
        from hapc.codegen.launch import launch_lines

        lines = launch_lines(cluster, str(out / "program.py"))
        print("run it: " + lines[0] if len(lines) == 1 else "run it, one line per node (NODE0_ADDRESS: node 0's "
              "address; every node may also be this host):\n  " + "\n  ".join(lines))
    return 0


def _lp_backend() -> str:
    """The share LP on HiGHS through ``highspy`` when it is installed: the same shares as through
    scipy (synth.ratios polishes and rounds every backend's answer alike) without importing
    scipy.optimize, which costs more than the rest of a cached compile's start-up (0.65-0.88 s
    CPU against 0.02-0.03 s for highspy, loaded 2-core machine)."""
    from synth import lp_highspy

    return "highspy" if lp_highspy.available() else "highs"


def _traced_model(args: argparse.Namespace, overrides: dict, meanwhile: Callable[[], None],
                  cleanup: contextlib.ExitStack):
    """The model's graph: from the trace cache when a sound entry exists (no torch.export, see
    hapc.frontend.cache.store), else traced (in a child forked before torch is imported, where that is
    possible: hapc.frontend.cache.child), and then stored. Also returns what to call once the plan is
    written (keeping its node strategies with the entry), or None. ``meanwhile()`` (work that needs
    no graph) runs while the child traces, else before the trace."""
    from hapc.frontend.cache.cached_trace import trace_model_file
    from hapc.frontend.modelfile import trace_for_compile
    from hapc.frontend.cache.store import TraceCache

    quiet = getattr(args, "quiet", False)

    def note(msg: str) -> None:          # why the cache was not used or written: not an error
        if not quiet:
            print(f"hapc: note: {msg}", file=sys.stderr)

    cache = None if args.no_trace_cache else TraceCache(note=note)
    with _transient(f"tracing {args.model}", quiet=quiet):
        traced, entry = trace_model_file(args.model, overrides, lambda: trace_for_compile(args.model, overrides),
                                         cache=cache, beside=True, child_precision=args.precision,
                                         meanwhile=meanwhile)
    if hasattr(entry, "close"):
        cleanup.push(_entry_finisher(entry))
    if entry is None:
        return traced, None
    precision = args.precision

    def keep_strategies(plan, out: Path) -> None:
        path = entry if isinstance(entry, Path) else entry.path()     # a new entry: written beside the search
        if path is not None and plan.pipeline is None and not getattr(traced, "strategies_installed", False):
            cache.store_strategies(path, precision, plan.graph)

    return traced, keep_strategies


def _entry_finisher(entry):
    """How a new cache entry's writer (a child) ends with the command: after an error, it may
    finish (a tenth of a second: the next compile, with the mistake fixed, finds the trace);
    after Ctrl-C it is stopped."""
    def finish(exc_type, exc, tb) -> None:
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        try:
            if not interrupted:
                entry.path()
        finally:
            entry.close(interrupted=interrupted)

    return finish


def _import_planning(emit: bool) -> None:
    """What planning (and, with ``emit``, writing the program) imports, loaded while a child
    traces the model."""
    import hapc.api  # noqa: F401
    import hapc.report.summary  # noqa: F401
    import synth.synthesize  # noqa: F401

    _lp_backend()
    if emit:
        import hapc.codegen  # noqa: F401
        import hapc.codegen.launch  # noqa: F401


def _write_replan_cache(plan, out: Path) -> None:
    """The strategies ``hapc replan`` needs beside plan.json (see synth.reuse); pipelined plans,
    which replan does not handle, get none."""
    from synth import reuse

    path = out / reuse.FILE_NAME
    path.unlink(missing_ok=True)        # never another plan's cache
    if plan.pipeline is None:
        reuse.write(plan.graph, path, plan_file=out / "plan.json")


def _stages_arg(value: str | None) -> int | str | None:
    """``--stages auto`` or a positive count (validated by the planner, which names the number)."""
    if value is None or value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise UserError(f"--stages {value}: expected a number of pipeline stages or 'auto'") from None


@contextlib.contextmanager
def _transient(msg: str, *, quiet: bool):
    """A progress line on a terminal that is erased when the work ends, so that a failure
    (a model torch.export cannot trace) leaves exactly its one error line."""
    show = not quiet and sys.stderr.isatty()
    if show:
        print(f"  {msg}", end="\r", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        if show:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def _check_precision(name: str) -> None:
    """Bad --precision fails before any work, in one line."""
    from hapc.ir.precision import check_precision

    try:
        check_precision(name)
    except ValueError as exc:
        raise UserError(str(exc), where="--precision") from None


def _cmd_simulate(args: argparse.Namespace) -> int:
    from hapc.plan.plan import Plan

    plan = Plan.load(args.plan)
    sim = plan.simulate(args.cluster)
    if plan.pipeline is not None:
        from hapc.report.pipeline import resimulate_lines

        print("\n".join(resimulate_lines(plan, sim.cluster)))
        return 0
    print(sim.table())
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from hapc.report.explain import explain
    from hapc.plan.plan import Plan

    print(explain(Plan.load(args.plan), limit=args.limit))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from hapc.plan.plan import Plan

    plan = Plan.load(args.plan)
    golden = Plan.load(args.baseline)
    if plan.graph.hash() != golden.graph.hash():
        print(f"hapc check: the plans are for different graphs ({plan.graph.hash()} vs {golden.graph.hash()})")
        return 1
    if not plan.fits:
        print("hapc check: FAILED: the plan does not fit in memory")
        return 1
    limit = golden.cost * (1 + args.tolerance)
    verdict = "ok" if plan.cost <= limit else "FAILED"
    print(f"hapc check: {verdict}: {plan.cost * 1e3:.4f} ms/iter vs golden {golden.cost * 1e3:.4f} ms "
          f"({(plan.cost / golden.cost - 1) * 100:+.2f}%, tolerance {args.tolerance * 100:.1f}%)")
    return 0 if verdict == "ok" else 1


def _cmd_profile(args: argparse.Namespace) -> int:
    from profiler.profile import profile

    if args.model:
        _check_precision(args.precision)
    if args.ops_only:
        if not args.model:
            raise UserError("--ops-only times a model's ops: give --model MODEL.py", where="--ops-only")
        return _profile_model_ops(args)
    result = profile(args.output, nproc=args.nproc, merge=args.merge, quick=args.quick, affinity=args.affinity,
                     threads=args.threads, device=args.device, op_classes=not args.no_op_classes,
                     say=_progress(args))
    if result is not None:          # None on the ranks other than 0 under torchrun
        print(result.summary())
        if args.model:
            return _profile_model_ops(args)
    return 0


def _profile_model_ops(args: argparse.Namespace) -> int:
    """Time the model's distinct op signatures on one device of this machine and store them
    beside the cluster file (see profiler.ops and costmodel.optable)."""
    import time

    import torch

    from costmodel.cluster_file import read_cluster_file
    from hapc.ir.precision import autocast_graph
    from hapc.frontend.modelfile import load_model_file, parse_overrides, trace_meta_first
    from hapc.frontend.tracer import trace
    from profiler.ops import profile_ops
    from profiler.profile import _device_type

    say = _progress(args)
    started = time.perf_counter()
    cluster = read_cluster_file(args.output)
    device_type = _device_type(args.device)
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cpu":
        torch.set_num_threads(args.threads)     # as the profiled ranks (and emitted programs) run
    mf = load_model_file(args.model, parse_overrides(args.set))
    say(f"tracing {args.model}")
    graph = autocast_graph(trace_meta_first(mf, trace).graph, args.precision)
    failed: list[str] = []
    table = profile_ops(graph, args.output, cluster.devices[0].type, device,
                        autocast=torch.bfloat16 if args.precision == "bf16" else None,
                        allow_tf32=cluster.allow_tf32, failures=failed, say=say)
    if failed:
        print(f"hapc: warning: these ops did not run on {device_type} in {args.precision} (no kernel for it "
              f"here?) and are priced by the roofline: {', '.join(sorted(failed))}", file=sys.stderr)
    from costmodel.optable import measured_share, table_path

    measured, total = measured_share(graph, table)
    print(f"per-op times: {measured} of {total} op nodes of {Path(args.model).name} measured on "
          f"{table.device_name} ({len(table.entries)} signatures in the table) in "
          f"{time.perf_counter() - started:.1f} s; wrote {table_path(args.output)}")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from profiler.calibrate import calibrate_cli

    return calibrate_cli(args, say=_progress(args))


def _cmd_replan(args: argparse.Namespace) -> int:
    from hapc.process.gcpause import gc_paused

    _no_collection_at_exit()
    with gc_paused():       # the whole command: see hapc.elastic.replan.replan
        return _replan_command(args)


def _no_collection_at_exit() -> None:
    """Freeze the heap as the interpreter exits, before its last collection: that pass over
    everything a compile or replan made (the graph, programs, simulations) would find no
    garbage in it, and took 17 ms of a replan's 0.25 s (GPT-48 --drop 7; 21 ms for the whole
    teardown) and ~40 ms of a warm compile's 0.5 s. Nothing changes until exit, so an
    in-process caller is unaffected; both commands write their files with ``with`` blocks,
    so no unflushed file waits for a finaliser the freeze would skip."""
    import atexit
    import gc

    atexit.unregister(gc.freeze)        # registered once, however many replans a process runs
    atexit.register(gc.freeze)


def _replan_command(args: argparse.Namespace) -> int:
    from costmodel.cluster import load_cluster
    from costmodel.cluster_edit import slowed, surviving_ranks, without_devices
    from hapc.plan import replan_cache
    from hapc.plan.plan import Plan
    from hapc.elastic.replan import replan
    from hapc.report.summary import write_report

    import functools
    import time

    started = time.perf_counter()
    say = _progress(args)
    before = replan_cache.file_identity(Path(args.plan))
    old = Plan.load(args.plan)
    cache = replan_cache.install_old(Path(args.plan), old.graph, say, before)
    survivors = list(range(old.cluster.world))
    if args.cluster:
        cluster = load_cluster(args.cluster)
        survivors = survivors if cluster.world == old.cluster.world else None
    else:
        cluster = old.cluster
        if args.measured:
            from hapc.elastic.straggler import measured_cluster

            cluster = measured_cluster(args.measured, cluster, list(old.sim.compute_seconds), say=_progress(args))
        if args.slow:
            cluster = slowed(cluster, dict(_rank_factor(s) for s in args.slow))
        if args.drop:
            dropped = [_rank(x, "--drop") for part in args.drop for x in part.split(",")]
            cluster = without_devices(cluster, dropped)
            survivors = surviving_ranks(old.cluster.world, dropped)
    effort = "quick" if args.quick else "search" if args.search else "full" if args.full else "auto"
    done = replan(old, cluster, survivors=survivors, effort=effort, progress=_progress(args),
                  while_searching=functools.partial(_prepare_writing, old.graph, emit=not args.no_emit))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    done.plan.save(out / "plan.json")
    replan_cache.carry(cache, done.plan.graph, done.effort != "quick", out)   # quick: derived none
    write_report(done.plan, out)
    wrote = ["plan.json", "report.md"]
    if not args.no_emit:
        done.plan.emit(out)
        wrote.append("program.py")
    print(done.plan.summary())
    how = "the old program re-balanced" if done.kept_program else \
        (f"a new program ({'over ' if done.carried_cost_is_floor else ''}"
         f"{done.carried_cost_seconds * 1e3:.3f} ms/iter for the old one on the new cluster)")
    print(f"replanned {old.cluster.world} -> {cluster.world} devices in {time.perf_counter() - started:.2f} s "
          f"(planning {done.seconds:.2f} s: {done.searches} searches, {done.simulations} simulations): {how}; "
          f"{done.plan.cost * 1e3:.3f} ms/iter (was {done.old_cost_seconds * 1e3:.3f} ms on the old cluster)")
    print(f"wrote {', '.join(str(out / w) for w in wrote)}")
    if not args.no_emit:
        print(f"resume: torchrun --nproc_per_node={cluster.world} {out / 'program.py'} --load CHECKPOINT_DIR")
    return 0


def _prepare_writing(graph, emit: bool) -> None:
    """What writing the new plan (of the old plan's ``graph``) starts with, for replan to do
    while its child searches: hashing the graph for plan.json, importing the program emitter."""
    from hapc.plan.plan import prepare_save

    prepare_save(graph)
    if emit:
        import hapc.codegen  # noqa: F401


def _rank(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{flag} {text}: expected a rank number") from None


def _rank_factor(text: str) -> tuple[int, float]:
    rank, sep, factor = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(rank), float(factor)
    except ValueError:
        raise UserError(f"--slow {text}: expected RANK=FACTOR, e.g. 3=2 (rank 3 at half speed)") from None


def _cmd_export_weights(args: argparse.Namespace) -> int:
    from hapc.elastic.checkpoints import export_weights

    done = export_weights(args.checkpoint, args.output)
    print(f"wrote {args.output}: {done.tensors} tensors, {done.bytes / 1e6:.2f} MB, the weights after step "
          f"{done.step} (from {done.checkpoint})")
    return 0


def _cmd_rules(args: argparse.Namespace) -> int:
    from hapc.rules.__main__ import main as rules_main

    return rules_main(["check"] if args.check else ["list"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hapc", description="Compile a single-device PyTorch training program into a fast SPMD "
                                 "program for a heterogeneous cluster.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ir = sub.add_parser("ir", help="trace a model file and print its IR with per-node FLOPs and allowed layouts",
                        description="Trace MODEL.py (model() and inputs()) with torch.export and print every "
                                    "node: op, output shape, forward/backward FLOPs, the sharding strategies "
                                    "its rule allows, and the user's source line.")
    ir.add_argument("model", metavar="MODEL.py")
    ir.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a keyword argument of model()/inputs(), e.g. --set layers=2")
    ir.add_argument("--meta", action="store_true", help="build the model on the meta device (no weights)")
    ir.add_argument("--no-layouts", action="store_true", help="do not list the allowed layouts")
    ir.add_argument("--limit", type=int, default=None, help="print at most this many nodes")
    ir.set_defaults(func=_cmd_ir)

    comp = sub.add_parser("compile", help="plan a model file for a cluster and emit the SPMD program",
                          description="Trace MODEL.py, search for the fastest SPMD program on the cluster, "
                                      "and write OUT/plan.json, OUT/report.md and OUT/program.py.")
    comp.add_argument("model", metavar="MODEL.py")
    comp.add_argument("--cluster", required=True, metavar="CLUSTER.yaml")
    comp.add_argument("-o", "--output", default="out", metavar="OUT", help="output folder (default: out)")
    comp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a keyword argument of model()/inputs(), e.g. --set layers=2")
    comp.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                      help="stop the search after this long and keep the best plan found (with its gap)")
    comp.add_argument("--optimizer", default="adamw", help="optimizer whose state memory to plan for")
    comp.add_argument("--precision", default="fp32", metavar="fp32|bf16",
                      help="fp32, or bf16: autocast forward with fp32 master weights, priced at the bf16 peak")
    comp.add_argument("--no-emit", action="store_true", help="write the plan and report only")
    comp.add_argument("--stages", default=None, metavar="N|auto",
                      help="also search pipeline stages on device groups ('auto'), or force N stages")
    comp.add_argument("--microbatches", type=int, default=None, metavar="M",
                      help="pipeline micro-batches per iteration (default: searched)")
    comp.add_argument("--schedule", default=None, choices=("1f1b", "gpipe"),
                      help="pipeline schedule (default: searched; 1f1b unless GPipe fits and is faster)")
    comp.add_argument("--no-trace-cache", action="store_true",
                      help="trace the model even when the trace cache ($HAPC_CACHE_DIR, default "
                           "~/.cache/hapc/traces) holds a valid trace of it, and do not store this one")
    comp.add_argument("-q", "--quiet", action="store_true", help="no progress lines or trace-cache notes")
    comp.set_defaults(func=_cmd_compile)

    sim = sub.add_parser("simulate", help="predict a plan's time and memory, optionally on another cluster",
                         description="Re-simulate PLAN.json with the cost model, on its own cluster or on "
                                     "another one with the same number of devices.")
    sim.add_argument("plan", metavar="PLAN.json")
    sim.add_argument("--cluster", default=None, metavar="OTHER.yaml")
    sim.set_defaults(func=_cmd_simulate)

    exp = sub.add_parser("explain", help="show each step of a plan, its layouts and what it costs",
                         description="For every node: the strategy chosen, the collectives around it, "
                                     "the time they take, and the user's source line.")
    exp.add_argument("plan", metavar="PLAN.json")
    exp.add_argument("--limit", type=int, default=None, help="show at most this many steps")
    exp.set_defaults(func=_cmd_explain)

    chk = sub.add_parser("check", help="CI regression: fail when a plan got worse than a golden one",
                         description="Exit 1 when PLAN.json is predicted slower than GOLDEN.json by more "
                                     "than the tolerance, does not fit in memory, or is for another graph.")
    chk.add_argument("plan", metavar="PLAN.json")
    chk.add_argument("--baseline", required=True, metavar="GOLDEN.json")
    chk.add_argument("--tolerance", type=float, default=0.02, help="allowed relative slow-down (default 0.02)")
    chk.set_defaults(func=_cmd_check)

    rules = sub.add_parser("rules", help="list the ops with sharding rules, or check them",
                           description="List the aten ops that have sharding rules, or (--check) run every "
                                       "rule on uneven 3-way shards against the unsharded op.")
    rules.add_argument("--check", action="store_true", help="validate every rule against ground truth")
    rules.set_defaults(func=_cmd_rules)

    prof = sub.add_parser("profile", help="measure this machine's devices and links and write a cluster file",
                          description="Start N ranks (or run under torchrun), measure matmul FLOPS per dtype, "
                                      "memory bandwidth, op overhead and op-class efficiencies on every device "
                                      "at once, time the collectives, fit each link's latency and bandwidth, "
                                      "and write a cluster file the cost model loads.")
    prof.add_argument("-o", "--output", required=True, metavar="CLUSTER.yaml")
    prof.add_argument("--nproc", type=int, default=None,
                      help="ranks to start (default: one per GPU, or one per CPU core)")
    prof.add_argument("--merge", default=None, metavar="EXISTING.yaml",
                      help="keep this file's topology, names and counts; replace its numbers")
    prof.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    prof.add_argument("--affinity", default=None, metavar="CORES",
                      help="pin rank i to the i-th core set, e.g. 0,1,1 (ranks 1 and 2 share core 1)")
    prof.add_argument("--threads", type=int, default=1, help="threads per rank (default 1)")
    prof.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    prof.add_argument("--no-op-classes", action="store_true", help="skip the per-op-class efficiencies")
    prof.add_argument("--model", default=None, metavar="MODEL.py",
                      help="also time every distinct op of this model (forward and backward, shard sizes) on "
                           "one device; stored beside the cluster file (CLUSTER.ops.json), used by the cost model")
    prof.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model config override")
    prof.add_argument("--precision", default="fp32", metavar="fp32|bf16", help="time the model's ops as this "
                      "precision runs them (bf16: under autocast)")
    prof.add_argument("--ops-only", action="store_true",
                      help="with --model: keep the existing cluster file, only time the model's ops")
    prof.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    prof.set_defaults(func=_cmd_profile)

    cal = sub.add_parser("calibrate", help="run several plans of a model, compare measured and predicted "
                                           "step times, fit the cost model",
                         description="Emit and run the baselines and the synthesized plan of MODEL.py on this "
                                     "machine, compare measured with predicted step times (rank correlation, "
                                     "median error), fit efficiency, launch and link scales, and report "
                                     "before/after; --write puts the fitted values into the cluster file.")
    cal.add_argument("model", metavar="MODEL.py")
    cal.add_argument("--cluster", required=True, metavar="CLUSTER.yaml")
    cal.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a keyword argument of model()/inputs(), e.g. --set layers=2")
    cal.add_argument("--plans", default="dp-even,dp-flops,megatron-tp,zero3,hapc",
                     help="comma-separated plans to run (baselines and 'hapc', the synthesized one); "
                          "'none' refits the --runs file without running")
    cal.add_argument("--steps", type=int, default=6, help="training steps per run (the first is not timed)")
    cal.add_argument("--repeats", type=int, default=1,
                     help="alternating rounds of all plans; each plan's time is the median over rounds")
    cal.add_argument("--affinity", default=None, metavar="CORES",
                     help="pin ranks as profiled (default: the cluster file's hapc-affinity line)")
    cal.add_argument("--fit", default="compute,memory,launch,comm,latency",
                     help="what to fit: compute, memory, launch, comm, latency, or op classes (matmul, ...)")
    cal.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                     help="where the programs run (auto: GPUs when the cluster's devices are GPUs and this "
                          "machine has one per rank of a node, else CPU ranks)")
    cal.add_argument("--size", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                     help="run the plans for this model config too (repeatable; merged over --set): several "
                          "sizes give a one-GPU cluster, where every plan is one program, enough runs to fit")
    cal.add_argument("--runs", default=None, metavar="RUNS.json",
                     help="add these measurements to earlier ones in RUNS.json and fit on all of them")
    cal.add_argument("--write", action="store_true", help="write the fitted values into the cluster file")
    cal.add_argument("--workdir", default=None, metavar="DIR", help="keep the emitted programs here")
    cal.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per run")
    cal.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    cal.set_defaults(func=_cmd_calibrate)

    rep = sub.add_parser("replan", help="a plan for a changed cluster (a device lost, added or slower), "
                                        "from an old plan without tracing again",
                         description="Re-balance the old plan's program for the new cluster with the share LP "
                                     "(searching again when it lost more than the devices did; no tracing: "
                                     "plan.json holds the graph), and write OUT/plan.json, "
                                     "OUT/report.md and OUT/program.py (which --load's the old program's "
                                     "checkpoints). Give the new cluster as a file or as changes to the old one.")
    rep.add_argument("plan", metavar="PLAN.json")
    change = rep.add_argument_group("the change (--cluster, or any of the others)")
    change.add_argument("--cluster", default=None, metavar="NEW.yaml", help="the new cluster file")
    change.add_argument("--drop", action="append", default=[], metavar="RANK",
                        help="remove the device of this rank (repeat or comma-separate for several)")
    change.add_argument("--slow", action="append", default=[], metavar="RANK=FACTOR",
                        help="this rank's device is FACTOR times slower than its spec (repeatable)")
    change.add_argument("--measured", default=None, metavar="RUN.log",
                        help="the log of PLAN.json's program run with --timings: device speeds from its per-rank times")
    rep.add_argument("-o", "--output", required=True, metavar="OUT", help="output folder")
    effort = rep.add_mutually_exclusive_group()
    effort.add_argument("--quick", action="store_true",
                        help="only re-balance the old program's shares (no search): the fastest replan")
    effort.add_argument("--search", action="store_true",
                        help="always run one search round on the new cluster (by default only when the old "
                             "program, re-balanced, lost more than the devices did)")
    effort.add_argument("--full", action="store_true",
                        help="search as hapc compile does (every round, the baselines), on the stored graph")
    rep.add_argument("--no-emit", action="store_true", help="write the plan and report only")
    rep.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    rep.set_defaults(func=_cmd_replan)

    exw = sub.add_parser("export-weights", help="write a checkpoint's weights as a single-device state_dict",
                         description="Read a checkpoint an emitted program saved (--save DIR), under any plan "
                                     "and world size, and write the model's whole tensors with torch.save, "
                                     "keyed as model.state_dict() (model.load_state_dict(torch.load(OUT))).")
    exw.add_argument("checkpoint", metavar="DIR", help="the --save folder (its latest step) or one step-N folder")
    exw.add_argument("output", metavar="OUT.pt")
    exw.set_defaults(func=_cmd_export_weights)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "replan" and not (args.cluster or args.drop or args.slow or args.measured):
        parser.error("replan: give the change: --cluster NEW.yaml, --drop RANK, --slow RANK=FACTOR or --measured RUN.log")
    if args.command == "replan" and args.cluster and (args.drop or args.slow or args.measured):
        parser.error("replan: --cluster gives the whole new cluster; do not combine it with --drop/--slow/--measured")
    try:
        return args.func(args)
    except UserError as exc:
        print(f"hapc: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hapc: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # our bug, not the user's
        if os.environ.get("HAPC_DEBUG"):
            traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"hapc: internal error: {type(exc).__name__}: {first} (HAPC_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1

