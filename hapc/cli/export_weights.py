"""``hapc export-weights``: a checkpoint of any plan as one single-device state_dict."""

from __future__ import annotations

import argparse

from hapc.cli.common import examples


EXAMPLES = (
    'hapc export-weights ckpt weights.pt     # then model.load_state_dict(torch.load("weights.pt"))',
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    exw = sub.add_parser("export-weights", help="write a checkpoint's weights as a single-device state_dict",
                         description="Read a checkpoint an emitted program saved (--save DIR), under any plan "
                                     "and world size, and write the model's whole tensors with torch.save, "
                                     "keyed as model.state_dict() (model.load_state_dict(torch.load(OUT))).", **examples(*EXAMPLES))
    exw.add_argument("checkpoint", metavar="DIR", help="the --save folder (its latest step) or one step-N folder")
    exw.add_argument("output", metavar="OUT.pt", help="the state_dict file to write (torch.save)")
    exw.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hapc.elastic.checkpoints import export_weights

    done = export_weights(args.checkpoint, args.output)
    print(f"wrote {args.output}: {done.tensors} tensors, {done.bytes / 1e6:.2f} MB, the weights after step "
          f"{done.step} (from {done.checkpoint})")
    return 0
