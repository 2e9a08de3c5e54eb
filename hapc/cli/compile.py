"""``hapc compile``: plan a model file for a cluster, write the plan, its report and the program.

The planning is :func:`hapc.api.synthesize`'s; this command adds what a process that compiles
once and ends can overlap: the cluster file is read and the planning side imported while the
model is traced (in a child forked before torch is imported, where that is possible; see
:mod:`hapc.frontend.from_file`), and a new trace-cache entry is written beside the search.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hapc.cli.common import SET_HELP, check_precision, examples, key_value, output_folder, print_notes, progress, transient
from hapc.errors import UserError


EXAMPLES = (
    'hapc compile configs/models/gpt.py --cluster configs/clusters/small-mixed.yaml -o out --set dropout=0.0',
    'hapc compile model.py --cluster cluster.yaml --stages auto --precision bf16 -o out',
    'hapc compile model.py --cluster configs/clusters/t4x4-a100x1.yaml --precision auto -o out   # fp16 there',
    'torchrun --nproc_per_node=4 out/program.py --device cpu --verify      # then run what it wrote',
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    comp = sub.add_parser("compile", help="plan a model file for a cluster and emit the SPMD program",
                          description="Trace MODEL.py, search for the fastest SPMD program on the cluster, "
                                      "and write OUT/plan.json, OUT/report.md and OUT/program.py.", **examples(*EXAMPLES))
    comp.add_argument("model", metavar="MODEL.py", help="the model file: model() and inputs(), see configs/models/README.md")
    comp.add_argument("--config", default=None, metavar="FILE",
                      help="options from a TOML or YAML file (keys: the long option names; set: a table); "
                           "flags given here override it")
    comp.add_argument("--cluster", default=None, metavar="CLUSTER.yaml",
                      help="the cluster file (YAML: nodes, devices, links), e.g. configs/clusters/small-mixed.yaml")
    comp.add_argument("-o", "--output", default="out", metavar="OUT", help="output folder (default: out)")
    comp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=key_value, help=SET_HELP)
    comp.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                      help="stop the search after this long and keep the best plan found (with its gap)")
    comp.add_argument("--optimizer", default="adamw", help="optimizer whose state memory to plan for")
    comp.add_argument("--precision", default="fp32", metavar="fp32|bf16|fp16|auto",
                      help="fp32; bf16 or fp16: autocast forward with fp32 master weights, priced at that peak "
                           "(fp16 with dynamic loss scaling); auto: bf16 if every device computes it faster than "
                           "fp32, else fp16 if every device does, else fp32")
    comp.add_argument("--no-emit", action="store_true", help="write the plan and report only")
    comp.add_argument("--stages", default=None, metavar="N|auto",
                      help="also search pipeline stages on device groups ('auto'), or force N stages")
    comp.add_argument("--microbatches", type=int, default=None, metavar="M",
                      help="micro-batches per iteration: a pipeline's, or with one stage gradient "
                           "accumulation (default: searched; one stage accumulates only when memory binds)")
    comp.add_argument("--schedule", default=None, choices=("1f1b", "gpipe"),
                      help="pipeline schedule (default: searched; 1f1b unless GPipe fits and is faster)")
    comp.add_argument("--no-trace-cache", action="store_true",
                      help="trace the model even when the trace cache ($HAPC_CACHE_DIR, default "
                           "~/.cache/hapc/traces) holds a valid trace of it, and do not store this one")
    comp.add_argument("-q", "--quiet", action="store_true",
                      help="print only what was written and how to run it (no summary, progress or notes)")
    comp.set_defaults(func=run, validate=validate)


def validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Options from --config, then what argparse cannot require when a config file may give it."""
    if args.config:
        from hapc.cli.config import apply_config

        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        apply_config(args, sub.choices["compile"], args.config)
    if not args.cluster:
        raise UserError("--cluster CLUSTER.yaml is required (on the command line or as cluster in --config)")


def run(args: argparse.Namespace) -> int:
    from hapc.frontend.cache.store import TraceCache
    from hapc.frontend.from_file import trace_file
    from hapc.frontend.modelfile import parse_overrides
    from hapc.process.collector import freeze_at_exit

    freeze_at_exit()
    say = progress(args)
    started = time.perf_counter()
    check_precision(args.precision)
    _stages(args.stages)              # a bad --stages fails before any tracing
    overrides = parse_overrides(args.set)
    from costmodel.cluster import load_cluster
    from hapc.codegen.launch import run_device

    cluster = load_cluster(args.cluster)      # bad cluster files fail before any tracing; its
    device = run_device(cluster)              # device type is the one the model is traced for
    traced_precision = args.precision
    if args.precision in ("fp16", "auto"):
        # Which precision (and whether fp16 suits the devices) depends on the cluster: the trace
        # child derives the strategies of the precision planned.
        from costmodel.precision_choice import resolve_precision

        traced_precision, why = resolve_precision(args.precision, cluster)
        if why:
            say(f"--precision auto: {traced_precision} ({why})")

    def meanwhile() -> None:          # while a child traces; else before the trace
        print_notes(cluster.notes, args)
        _import_planning(emit=not args.no_emit)

    def note(msg: str) -> None:          # why the cache was not used or written: not an error
        if not args.quiet:
            print(f"hapc: note: {msg}", file=sys.stderr)

    cache = None if args.no_trace_cache else TraceCache(note=note)
    with transient(f"tracing {args.model}", quiet=args.quiet):
        from_file = trace_file(args.model, overrides, cache=cache, device=device, command_line=True,
                               precision=traced_precision, meanwhile=meanwhile)
    with from_file:                      # a child writing the cache entry never outlives the command
        return _plan_and_write(args, from_file, cluster, overrides, say, started)


def _plan_and_write(args: argparse.Namespace, from_file, cluster, overrides: dict, say, started: float) -> int:
    from hapc.api import synthesize
    from hapc.report.summary import write_report

    traced = from_file.traced
    if traced.graph.unsupported:
        ops = ", ".join(f"{op} ({where[0]})" for op, where in sorted(traced.graph.unsupported.items()))
        print(f"hapc: warning: no sharding rule, these run replicated: {ops}", file=sys.stderr)
    how = "from the trace cache" if getattr(traced, "from_cache", False) else "traced"
    say(f"{len(traced.graph.nodes)} nodes {how} in {traced.seconds:.1f} s; searching")
    from synth.loads import MemoryInfeasible

    try:
        plan = synthesize(from_file, None, cluster, time_budget=args.time_budget, optimizer=args.optimizer,
                          model_file=str(Path(args.model).resolve()), model_kwargs=overrides, progress=say,
                          precision=args.precision, stages=_stages(args.stages), microbatches=args.microbatches,
                          schedule=args.schedule, backend=_lp_backend())
    except MemoryInfeasible as exc:
        raise UserError(f"{exc}; to try: {_memory_levers(args)}") from None
    wrote = ["plan.json", "report.md"] + ([] if args.no_emit else ["program.py"])
    with output_folder(args.output) as out:
        plan.save(out / "plan.json")
        _write_replan_cache(plan, out)
        write_report(plan, out)
        if not args.no_emit:
            plan.emit(out, constants=traced.constants)
    if not args.quiet:
        print(plan.summary())
    print(f"wrote {', '.join(str(out / w) for w in wrote)} in {time.perf_counter() - started:.1f} s")
    if not args.no_emit:
        from hapc.codegen.launch import launch_lines

        lines = launch_lines(cluster, str(out / "program.py"))
        print("run it: " + lines[0] if len(lines) == 1 else "run it, one line per node (NODE0_ADDRESS: node 0's "
              "address; every node may also be this host):\n  " + "\n  ".join(lines))
    return 0


def _memory_levers(args: argparse.Namespace) -> str:
    """What a compile that found no plan in memory could try next, of what it did not try."""
    levers = []
    if args.stages is None:
        levers.append("pipeline stages over device groups (--stages auto)")
    if args.precision == "fp32":
        levers.append("bf16 activations (--precision bf16)")
    levers += ["a smaller batch (--set batch=N, if the model file takes it)", "a cluster with more memory"]
    return ", ".join(levers)


def _lp_backend() -> str:
    from synth import lp_highspy

    return lp_highspy.preferred_backend()


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


def _stages(value: str | None) -> int | str | None:
    """``--stages auto`` or a positive count (validated by the planner, which names the number)."""
    if value is None or value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise UserError(f"--stages {value}: expected a number of pipeline stages or 'auto'") from None
