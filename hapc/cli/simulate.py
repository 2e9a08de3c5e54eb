"""``hapc simulate``: predict a plan's time and memory, on its cluster or another one."""

from __future__ import annotations

import argparse

from hapc.cli.common import examples


EXAMPLES = (
    'hapc simulate out/plan.json',
    'hapc simulate out/plan.json --cluster configs/clusters/cpu4.yaml',
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("simulate", help="predict a plan's time and memory, optionally on another cluster",
                         description="Re-simulate PLAN.json with the cost model, on its own cluster or on "
                                     "another one with the same number of devices.", **examples(*EXAMPLES))
    sim.add_argument("plan", metavar="PLAN.json", help="a plan.json that hapc compile or replan wrote")
    sim.add_argument("--cluster", default=None, metavar="OTHER.yaml",
                     help="another cluster with as many devices (default: the plan's own)")
    sim.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hapc.plan import Plan

    plan = Plan.load(args.plan)
    sim = plan.simulate(args.cluster)
    if plan.pipeline is not None:
        from hapc.report.pipeline import resimulate_lines

        print("\n".join(resimulate_lines(plan, sim.cluster)))
        return 0
    from hapc.report.model import batch_rows

    print(sim.table(batch_rows(plan)))        # the plan's rows: simulate keeps its shares
    return 0
