"""The ``hapc`` command line.

Exit codes: 0 ok, 2 bad input (one line, no traceback), 1 internal error (set
``HAPC_DEBUG=1`` to see the traceback). Each subcommand lives in a small function here and
calls the library; no pipeline logic lives in the CLI.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from hapc.errors import UserError


def _cmd_ir(args: argparse.Namespace) -> int:
    from hapc.irprint import format_ir
    from hapc.modelfile import load_model_file, parse_overrides
    from hapc.tracer import trace

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
    import time

    from costmodel.cluster import load_cluster
    from hapc.api import synthesize
    from hapc.modelfile import load_model_file, parse_overrides
    from hapc.report import write_report
    from hapc.tracer import trace

    say = _progress(args)
    started = time.perf_counter()
    cluster = load_cluster(args.cluster)          # bad cluster files fail before any work
    stages = _stages_arg(args.stages)
    overrides = parse_overrides(args.set)
    mf = load_model_file(args.model, overrides)
    say(f"tracing {args.model}")
    traced = _trace_model_file(mf, trace)
    if traced.graph.unsupported:
        ops = ", ".join(f"{op} ({where[0]})" for op, where in sorted(traced.graph.unsupported.items()))
        print(f"hapc: warning: no sharding rule, these run replicated: {ops}", file=sys.stderr)
    say(f"{len(traced.graph.nodes)} nodes traced in {traced.seconds:.1f} s; searching")
    plan = synthesize(traced, None, cluster, time_budget=args.time_budget, optimizer=args.optimizer,
                      model_file=str(Path(args.model).resolve()), model_kwargs=overrides, progress=say,
                      stages=stages, microbatches=args.microbatches, schedule=args.schedule)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    plan.save(out / "plan.json")
    write_report(plan, out)
    emitted = ""
    if not args.no_emit and plan.pipeline is None:
        try:
            emitted = str(plan.emit(out, constants=traced.constants))
        except ImportError:
            emitted = ""
    print(plan.summary())
    wrote = ["plan.json", "report.md"] + (["program.py"] if emitted else [])
    print(f"wrote {', '.join(str(out / w) for w in wrote)} in {time.perf_counter() - started:.1f} s")
    if emitted:
        from hapc.launch import launch_lines

        lines = launch_lines(cluster, str(out / "program.py"))
        print("run it: " + lines[0] if len(lines) == 1 else "run it, one line per node (NODE0_ADDRESS: node 0's "
              "address; every node may also be this host):\n  " + "\n  ".join(lines))
    elif plan.pipeline is not None and not args.no_emit:
        print(f"note: program.py not written: this plan has {len(plan.pipeline.stages)} pipeline stages and hapc "
              "cannot emit pipelined programs yet (compile without --stages for a one-stage program)")
    return 0


def _stages_arg(value: str | None) -> int | str | None:
    """``--stages auto`` or a positive count (validated by the planner, which names the number)."""
    if value is None or value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise UserError(f"--stages {value}: expected a number of pipeline stages or 'auto'") from None


def _trace_model_file(mf, trace):
    """Trace on the meta device (no weights, fast) and fall back to real tensors if the model
    cannot be built or traced there."""
    from hapc.errors import UserError

    try:
        model = mf.build_model(device="meta")
        inputs = tuple(t.to("meta") for t in mf.build_inputs())
        return trace(model, inputs)
    except UserError:
        model = mf.build_model()
        return trace(model, mf.build_inputs())


def _cmd_simulate(args: argparse.Namespace) -> int:
    from hapc.plan import Plan

    plan = Plan.load(args.plan)
    sim = plan.simulate(args.cluster)
    if plan.pipeline is not None:
        from hapc.pipeline_report import resimulate_lines

        print("\n".join(resimulate_lines(plan, sim.cluster)))
        return 0
    print(sim.table())
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from hapc.explain import explain
    from hapc.plan import Plan

    print(explain(Plan.load(args.plan), limit=args.limit))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from hapc.plan import Plan

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

    result = profile(args.output, nproc=args.nproc, merge=args.merge, quick=args.quick, affinity=args.affinity,
                     threads=args.threads, device=args.device, op_classes=not args.no_op_classes,
                     say=_progress(args))
    if result is not None:          # None on the ranks other than 0 under torchrun
        print(result.summary())
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from hapc.calibrate import calibrate_cli

    return calibrate_cli(args, say=_progress(args))


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
    comp.add_argument("--no-emit", action="store_true", help="write the plan and report only")
    comp.add_argument("--stages", default=None, metavar="N|auto",
                      help="also search pipeline stages on device groups ('auto'), or force N stages")
    comp.add_argument("--microbatches", type=int, default=None, metavar="M",
                      help="pipeline micro-batches per iteration (default: searched)")
    comp.add_argument("--schedule", default=None, choices=("1f1b", "gpipe"),
                      help="pipeline schedule (default: searched; 1f1b unless GPipe fits and is faster)")
    comp.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
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
    cal.add_argument("--runs", default=None, metavar="RUNS.json",
                     help="add these measurements to earlier ones in RUNS.json and fit on all of them")
    cal.add_argument("--write", action="store_true", help="write the fitted values into the cluster file")
    cal.add_argument("--workdir", default=None, metavar="DIR", help="keep the emitted programs here")
    cal.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per run")
    cal.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    cal.set_defaults(func=_cmd_calibrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
