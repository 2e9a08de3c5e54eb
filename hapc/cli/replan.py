"""``hapc replan``: a plan for a changed cluster (a device lost, added or slower) from an old
plan, without tracing again (plan.json holds the graph). The planning is
:func:`hapc.elastic.replan.replan`'s; this command reads the change and writes the files."""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

from hapc.cli.common import examples, output_folder, print_notes, progress
from hapc.errors import UserError


EXAMPLES = (
    'hapc replan out/plan.json --drop 3 -o out3            # rank 3 is gone',
    'hapc replan out/plan.json --slow 2=1.5 -o out2        # rank 2 runs 1.5x slower',
    'hapc replan out/plan.json --cluster new.yaml -o new',
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("replan", help="a plan for a changed cluster (a device lost, added or slower), "
                                        "from an old plan without tracing again",
                         description="Re-balance the old plan's program for the new cluster with the share LP "
                                     "(searching again when it lost more than the devices did; no tracing: "
                                     "plan.json holds the graph), and write OUT/plan.json, "
                                     "OUT/report.md and OUT/program.py (which --load's the old program's "
                                     "checkpoints). Give the new cluster as a file or as changes to the old one.", **examples(*EXAMPLES))
    rep.add_argument("plan", metavar="PLAN.json", help="a plan.json that hapc compile or replan wrote")
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
    rep.add_argument("-q", "--quiet", action="store_true", help="no summary, progress lines or notes")
    rep.set_defaults(func=run, validate=validate)


def validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Usage errors argparse cannot express: exactly one way of giving the change."""
    if not (args.cluster or args.drop or args.slow or args.measured):
        parser.error("replan: give the change: --cluster NEW.yaml, --drop RANK, --slow RANK=FACTOR or --measured RUN.log")
    if args.cluster and (args.drop or args.slow or args.measured):
        parser.error("replan: --cluster gives the whole new cluster; do not combine it with --drop/--slow/--measured")


def run(args: argparse.Namespace) -> int:
    from hapc.process.collector import freeze_at_exit, gc_paused

    freeze_at_exit()
    with gc_paused():       # the whole command: see hapc.elastic.replan.replan
        return _replan(args)


def _replan(args: argparse.Namespace) -> int:
    from costmodel.cluster import load_cluster
    from costmodel.cluster_edit import slowed, surviving_ranks, without_devices
    from hapc.elastic.replan import replan
    from hapc.plan import Plan, replan_cache
    from hapc.report.summary import write_report

    started = time.perf_counter()
    say = progress(args)
    before = replan_cache.file_identity(Path(args.plan))
    old = Plan.load(args.plan)
    cache = replan_cache.install_old(Path(args.plan), old.graph, say, before)
    survivors = list(range(old.cluster.world))
    if args.cluster:
        cluster = load_cluster(args.cluster)
        print_notes(cluster.notes, args)
        survivors = survivors if cluster.world == old.cluster.world else None
    else:
        cluster = old.cluster
        if args.measured:
            from hapc.elastic.straggler import measured_cluster

            cluster = measured_cluster(args.measured, cluster, list(old.sim.compute_seconds), say=say)
        if args.slow:
            cluster = slowed(cluster, dict(_rank_factor(s) for s in args.slow))
        if args.drop:
            dropped = [_rank(x, "--drop") for part in args.drop for x in part.split(",")]
            cluster = without_devices(cluster, dropped)
            survivors = surviving_ranks(old.cluster.world, dropped)
    effort = "quick" if args.quick else "search" if args.search else "full" if args.full else "auto"
    done = replan(old, cluster, survivors=survivors, effort=effort, progress=say,
                  while_searching=functools.partial(_prepare_writing, old.graph, emit=not args.no_emit))
    wrote = ["plan.json", "report.md"] + ([] if args.no_emit else ["program.py"])
    with output_folder(args.output) as out:
        done.plan.save(out / "plan.json")
        replan_cache.carry(cache, done.plan.graph, done.effort != "quick", out)   # quick: derived none
        write_report(done.plan, out)
        if not args.no_emit:
            done.plan.emit(out)
    if not args.quiet:
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
