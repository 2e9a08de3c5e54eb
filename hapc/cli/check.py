"""``hapc check``: the CI regression gate, a plan against a golden one."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    chk = sub.add_parser("check", help="CI regression: fail when a plan got worse than a golden one",
                         description="Exit 1 when PLAN.json is predicted slower than GOLDEN.json by more "
                                     "than the tolerance, does not fit in memory, or is for another graph.")
    chk.add_argument("plan", metavar="PLAN.json")
    chk.add_argument("--baseline", required=True, metavar="GOLDEN.json")
    chk.add_argument("--tolerance", type=float, default=0.02, help="allowed relative slow-down (default 0.02)")
    chk.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
