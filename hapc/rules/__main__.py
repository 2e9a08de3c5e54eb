"""``python -m hapc.rules check [OP ...]``: validate rules; ``python -m hapc.rules list``: list them."""

from __future__ import annotations

import argparse
import sys

from hapc.rules.check import check_all, matching_ops
from hapc.rules.registry import rules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hapc.rules", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    chk = sub.add_parser("check", help="run every rule on uneven 3-way shards against the unsharded op")
    chk.add_argument("ops", nargs="*", help="only these ops: aten.mm.default, or mm for every overload (default: all)")
    chk.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    sub.add_parser("list", help="list the ops that have rules")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        for op in rules():
            print(op)
        print(f"{len(rules())} aten ops have rules")
        return 0
    try:
        ops = matching_ops(args.ops) if args.ops else None
    except ValueError as exc:
        print(f"hapc rules: {exc}", file=sys.stderr)
        return 2
    report = check_all(ops, progress=None if args.quiet else _progress())
    for finding in report.wrong:
        print(finding)
    for op in report.no_samples:
        print(f"NO SAMPLES {op}")
    print(f"{report.rules} ops with rules, {report.samples} samples, {report.strategies} strategies checked: "
          f"{len(report.wrong)} wrong, {len(report.no_samples)} without samples")
    return 0 if report.ok else 1


def _progress():
    """Progress on stderr: one line rewritten per rule on a terminal, else a line every 25 rules
    (and the first at once), so a long check is never silent."""
    tty = sys.stderr.isatty()

    def show(done: int, total: int, op: str) -> None:
        if tty:
            print(f"\r\033[K  checking rule {done + 1}/{total}: {op}", end="", file=sys.stderr, flush=True)
            if done + 1 == total:
                print("\r\033[K", end="", file=sys.stderr, flush=True)
        elif done % 25 == 0:
            print(f"  checking rule {done + 1}/{total}: {op}", file=sys.stderr, flush=True)

    return show


if __name__ == "__main__":
    sys.exit(main())
