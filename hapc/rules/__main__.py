"""``python -m hapc.rules check [OP ...]``: validate rules; ``python -m hapc.rules list``: list them."""

from __future__ import annotations

import argparse
import sys

from hapc.rules.check import check_all
from hapc.rules.registry import rules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hapc.rules", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    chk = sub.add_parser("check", help="run every rule on uneven 3-way shards against the unsharded op")
    chk.add_argument("ops", nargs="*", help="only these aten ops (default: all)")
    sub.add_parser("list", help="list the ops that have rules")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        for op in rules():
            print(op)
        print(f"{len(rules())} aten ops have rules")
        return 0
    report = check_all(args.ops or None)
    for finding in report.wrong:
        print(finding)
    for op in report.no_samples:
        print(f"NO SAMPLES {op}")
    print(f"{report.rules} ops with rules, {report.samples} samples, {report.strategies} strategies checked: "
          f"{len(report.wrong)} wrong, {len(report.no_samples)} without samples")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
