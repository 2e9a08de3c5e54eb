"""``hapc rules``: list the ops with sharding rules, or check every rule against the unsharded op."""

from __future__ import annotations

import argparse

from hapc.cli.common import examples
from hapc.errors import UserError


EXAMPLES = (
    'hapc rules                      # the ops with rules',
    'hapc rules --check --op mm      # validate one op family',
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    rules = sub.add_parser("rules", help="list the ops with sharding rules, or check them",
                           description="List the aten ops that have sharding rules, or (--check) run every "
                                       "rule on uneven 3-way shards against the unsharded op.", **examples(*EXAMPLES))
    rules.add_argument("--check", action="store_true", help="validate every rule against ground truth")
    rules.add_argument("--op", action="append", default=[], metavar="NAME",
                       help="with --check: only this op (aten.mm.default, or mm for every overload; repeatable)")
    rules.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    rules.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hapc.rules.__main__ import main as rules_main

    if args.op and not args.check:
        raise UserError("--op selects the rules --check validates: add --check", where="--op")
    if not args.check:
        return rules_main(["list"])
    return rules_main(["check", *args.op, *(["-q"] if args.quiet else [])])
