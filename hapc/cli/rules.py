"""``hapc rules``: list the ops with sharding rules, or check every rule against the unsharded op."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    rules = sub.add_parser("rules", help="list the ops with sharding rules, or check them",
                           description="List the aten ops that have sharding rules, or (--check) run every "
                                       "rule on uneven 3-way shards against the unsharded op.")
    rules.add_argument("--check", action="store_true", help="validate every rule against ground truth")
    rules.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hapc.rules.__main__ import main as rules_main

    return rules_main(["check"] if args.check else ["list"])
