"""``hapc check``: the CI regression gate, a plan against a golden one."""

from __future__ import annotations

import argparse
from pathlib import Path

from hapc.cli.common import examples


EXAMPLES = (
    'hapc check out/plan.json --baseline tests/golden/gpt-small-mixed.json --tolerance 0.05',
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    chk = sub.add_parser("check", help="CI regression: fail when a plan got worse than a golden one",
                         description="Exit 1 when PLAN.json is predicted slower than GOLDEN.json by more "
                                     "than the tolerance, does not fit in memory, or is for another graph.", **examples(*EXAMPLES))
    chk.add_argument("plan", metavar="PLAN.json", help="a plan.json that hapc compile or replan wrote")
    chk.add_argument("--baseline", required=True, metavar="GOLDEN.json", help="the golden plan to compare with")
    chk.add_argument("--tolerance", type=float, default=0.02, help="allowed relative slow-down (default 0.02)")
    chk.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hapc.plan import Plan

    plan = Plan.load(args.plan)
    golden = Plan.load(args.baseline)
    if plan.graph.hash() != golden.graph.hash():
        print(f"hapc check: the plans are for different graphs ({plan.graph.hash()} vs {golden.graph.hash()})"
              f"{_why_different(plan, golden)}")
        return 1
    if not plan.fits:
        print("hapc check: FAILED: the plan does not fit in memory")
        return 1
    limit = golden.cost * (1 + args.tolerance)
    verdict = "ok" if plan.cost <= limit else "FAILED"
    print(f"hapc check: {verdict}: {plan.cost * 1e3:.4f} ms/iter vs golden {golden.cost * 1e3:.4f} ms "
          f"({(plan.cost / golden.cost - 1) * 100:+.2f}%, tolerance {args.tolerance * 100:.1f}%)")
    return 0 if verdict == "ok" else 1


def _why_different(plan, golden) -> str:
    """The settings that differ between two plans' models (``--set`` values, the model file,
    precision), as the reason their graphs differ: ": dropout is 0.1 here, 0.0 in the golden"."""
    mine, theirs = plan.model.get("kwargs", {}), golden.model.get("kwargs", {})
    diffs = [f"{k} is {_shown(mine, k)} here, {_shown(theirs, k)} in the golden"
             for k in sorted(set(mine) | set(theirs)) if mine.get(k, _UNSET) != theirs.get(k, _UNSET)]
    file, golden_file = plan.model.get("file"), golden.model.get("file")
    if file and golden_file and Path(file).name != Path(golden_file).name:
        diffs.insert(0, f"the model file is {Path(file).name} here, {Path(golden_file).name} in the golden")
    if plan.precision.name != golden.precision.name:
        diffs.append(f"precision is {plan.precision.name} here, {golden.precision.name} in the golden")
    return (": " + "; ".join(diffs)) if diffs else ""


_UNSET = object()


def _shown(kwargs: dict, key: str) -> str:
    return repr(kwargs[key]) if key in kwargs else "the model file's default"
