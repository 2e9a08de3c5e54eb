"""``hapc ir``: trace a model file and print its IR."""

from __future__ import annotations

import argparse

from hapc.cli.common import SET_HELP, key_value


def add_parser(sub: argparse._SubParsersAction) -> None:
    ir = sub.add_parser("ir", help="trace a model file and print its IR with per-node FLOPs and allowed layouts",
                        description="Trace MODEL.py (model() and inputs()) with torch.export and print every "
                                    "node: op, output shape, forward/backward FLOPs, the sharding strategies "
                                    "its rule allows, and the user's source line.")
    ir.add_argument("model", metavar="MODEL.py")
    ir.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=key_value, help=SET_HELP)
    ir.add_argument("--meta", action="store_true", help="build the model on the meta device (no weights)")
    ir.add_argument("--no-layouts", action="store_true", help="do not list the allowed layouts")
    ir.add_argument("--limit", type=int, default=None, help="print at most this many nodes")
    ir.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hapc.frontend.modelfile import load_model_file, parse_overrides
    from hapc.frontend.tracer import trace
    from hapc.report.ir_text import format_ir

    mf = load_model_file(args.model, parse_overrides(args.set))
    model = mf.build_model(device="meta" if args.meta else None)
    traced = trace(model, mf.build_inputs())
    print(format_ir(traced, layouts=not args.no_layouts, limit=args.limit))
    return 0
