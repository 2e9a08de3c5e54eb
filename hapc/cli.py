"""The ``hapc`` command line.

Exit codes: 0 ok, 2 bad input (one line, no traceback), 1 internal error (set
``HAPC_DEBUG=1`` to see the traceback). Each subcommand lives in a small function here and
calls the library; no pipeline logic lives in the CLI.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from hapc.errors import UserError


def _cmd_ir(args: argparse.Namespace) -> int:
    from hapc.irprint import format_ir
    from hapc.modelfile import load_model_file, parse_overrides
    from hapc.tracer import trace

    mf = load_model_file(args.model, parse_overrides(args.set))
    model = mf.build_model(device="meta" if args.meta else None)
    inputs = mf.build_inputs()
    traced = trace(model, inputs)
    print(format_ir(traced, layouts=not args.no_layouts, limit=args.limit))
    return 0


def _cmd_rules(args: argparse.Namespace) -> int:
    from hapc.rules.__main__ import main as rules_main

    return rules_main(["check"] if args.check else ["list"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hapc", description="Compile a single-device PyTorch training program into a fast SPMD "
                                 "program for a heterogeneous cluster.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ir = sub.add_parser("ir", help="trace a model file and print its IR with per-node FLOPs and allowed layouts",
                        description="Trace MODEL.py (model() and inputs()) with torch.export and print every "
                                    "node: op, output shape, forward/backward FLOPs, the sharding strategies "
                                    "its rule allows, and the user's source line.")
    ir.add_argument("model", metavar="MODEL.py")
    ir.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a keyword argument of model()/inputs(), e.g. --set layers=2")
    ir.add_argument("--meta", action="store_true", help="build the model on the meta device (no weights)")
    ir.add_argument("--no-layouts", action="store_true", help="do not list the allowed layouts")
    ir.add_argument("--limit", type=int, default=None, help="print at most this many nodes")
    ir.set_defaults(func=_cmd_ir)

    rules = sub.add_parser("rules", help="list the ops with sharding rules, or check them",
                           description="List the aten ops that have sharding rules, or (--check) run every "
                                       "rule on uneven 3-way shards against the unsharded op.")
    rules.add_argument("--check", action="store_true", help="validate every rule against ground truth")
    rules.set_defaults(func=_cmd_rules)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"hapc: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hapc: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # our bug, not the user's
        if os.environ.get("HAPC_DEBUG"):
            traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"hapc: internal error: {type(exc).__name__}: {first} (HAPC_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
