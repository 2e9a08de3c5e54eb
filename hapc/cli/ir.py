"""``hapc ir``: trace a model file and print its IR."""

from __future__ import annotations

import argparse

from hapc.cli.common import SET_HELP, examples, key_value


EXAMPLES = (
    'hapc ir configs/models/gpt.py --meta --summary       # one line per op of GPT-2 small',
    'hapc ir configs/models/mlp.py --set layers=2 --limit 20',
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    ir = sub.add_parser("ir", help="trace a model file and print its IR with per-node FLOPs and allowed layouts",
                        description="Trace MODEL.py (model() and inputs()) with torch.export and print every "
                                    "node: op, output shape, forward/backward FLOPs, the sharding strategies "
                                    "its rule allows, and the user's source line.", **examples(*EXAMPLES))
    ir.add_argument("model", metavar="MODEL.py", help="the model file: model() and inputs(), see configs/models/README.md")
    ir.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=key_value, help=SET_HELP)
    ir.add_argument("--meta", action="store_true", help="build the model on the meta device (no weights)")
    ir.add_argument("--no-layouts", action="store_true", help="do not list the allowed layouts")
    ir.add_argument("--limit", type=int, default=None, help="print at most this many nodes")
    ir.add_argument("--summary", action="store_true", help="one line per distinct op instead of one per node")
    ir.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hapc.frontend.modelfile import load_model_file, parse_overrides
    from hapc.frontend.tracer import trace
    from hapc.report.ir_text import format_ir

    mf = load_model_file(args.model, parse_overrides(args.set))
    model = mf.build_model(device="meta" if args.meta else None)
    inputs = mf.build_inputs()
    traced = trace(model, tuple(t.to("meta") for t in inputs) if args.meta else inputs)
    print(format_ir(traced, layouts=not args.no_layouts, limit=args.limit, summary=args.summary))
    return 0
