"""``hapc simulate``: predict a plan's time and memory, on its cluster or another one."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("simulate", help="predict a plan's time and memory, optionally on another cluster",
                         description="Re-simulate PLAN.json with the cost model, on its own cluster or on "
                                     "another one with the same number of devices.")
    sim.add_argument("plan", metavar="PLAN.json")
    sim.add_argument("--cluster", default=None, metavar="OTHER.yaml")
    sim.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hapc.plan import Plan

    plan = Plan.load(args.plan)
    sim = plan.simulate(args.cluster)
    if plan.pipeline is not None:
        from hapc.report.pipeline import resimulate_lines

        print("\n".join(resimulate_lines(plan, sim.cluster)))
        return 0
    print(sim.table())
    return 0
