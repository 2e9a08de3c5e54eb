"""The ``hapc`` command line: one module per command, each a thin layer over the library
(:mod:`hapc.api`, :mod:`hapc.elastic`, :mod:`profiler`); no planning logic lives here.

Each command module has ``add_parser(sub)``, which declares its flags, and ``run(args)``.
Exit codes: 0 ok, 2 bad input (one line, no traceback), 1 internal error (set
``HAPC_DEBUG=1`` to see the traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from hapc.cli import (
    calibrate,
    check,
    compile,
    explain,
    export_weights,
    ir,
    profile,
    replan,
    rules,
    simulate,
)
from hapc.errors import UserError

# In the order ``hapc --help`` lists them.
COMMANDS = (ir, compile, simulate, explain, check, rules, profile, calibrate, replan, export_weights)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hapc", description="Compile a single-device PyTorch training program into a fast SPMD "
                                 "program for a heterogeneous cluster.")
    from hapc import __version__

    parser.add_argument("--version", action="version", version=f"hapc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if hasattr(args, "validate"):       # usage errors argparse cannot express, options from files
            args.validate(args, parser)
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
