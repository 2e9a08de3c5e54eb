"""``hapc explain``: each step of a plan, its layouts and what it costs."""

from __future__ import annotations

import argparse

from hapc.cli.common import examples


EXAMPLES = (
    'hapc explain out/plan.json --limit 40',
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    exp = sub.add_parser("explain", help="show each step of a plan, its layouts and what it costs",
                         description="For every node: the strategy chosen, the collectives around it, "
                                     "the time they take, and the user's source line.", **examples(*EXAMPLES))
    exp.add_argument("plan", metavar="PLAN.json", help="a plan.json that hapc compile or replan wrote")
    exp.add_argument("--limit", type=int, default=None, help="show at most this many steps")
    exp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hapc.plan import Plan
    from hapc.report.explain import explain

    print(explain(Plan.load(args.plan), limit=args.limit))
    return 0
