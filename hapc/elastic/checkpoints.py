"""Checkpoints from the command line: ``hapc export-weights DIR model.pt``.

Emitted programs write checkpoints with their copy of :mod:`hapc.runtime.checkpoint` (one
piece of each tensor per rank, laid out by the plan that ran); this turns one into what a
single-device user wants, a plain ``model.state_dict()``, without a process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hapc.errors import UserError
from hapc.runtime.checkpoint import CheckpointError, export_state_dict, read_manifest


@dataclass(frozen=True)
class Exported:
    checkpoint: Path          # the step directory read
    step: int
    tensors: int
    bytes: int


def export_weights(checkpoint: str | Path, output: str | Path) -> Exported:
    """Write the model's whole weights from ``checkpoint`` (a save root or a step directory)
    to ``output`` with ``torch.save``, keyed as ``model.state_dict()``."""
    try:
        directory, manifest = read_manifest(checkpoint)
        state = export_state_dict(directory)
    except CheckpointError as exc:
        raise UserError(str(exc)) from None
    out = Path(output)
    if out.parent and not out.parent.exists():
        raise UserError("no such directory for the output file", where=str(out))
    torch.save(state, out)
    size = sum(t.numel() * t.element_size() for t in {id(t): t for t in state.values()}.values())
    return Exported(directory, int(manifest["progress"]["step"]), len(state), size)
