"""Checkpoints from the command line: ``hapc export-weights DIR model.pt``.

Emitted programs write checkpoints with their copy of :mod:`hapc.runtime.checkpoint` (one
piece of each tensor per rank, laid out by the plan that ran); this turns one into what a
single-device user wants, a plain ``model.state_dict()``, without a process group.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from hapc.errors import UserError
from hapc.runtime.checkpoint import (
    MANIFEST,
    MODEL,
    CheckpointError,
    SafeReader,
    _first_line,
    _PieceLoadPlanner,
    read_manifest,
)


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


def export_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model's whole tensors, keyed as ``model.state_dict()``, from a checkpoint of any plan
    (no process group needed)."""
    directory, manifest = read_manifest(path)
    state = {f"{MODEL}{k}": torch.empty(tuple(v["shape"]), dtype=getattr(torch, v["dtype"]))
             for k, v in manifest["tensors"].items()}
    reader = SafeReader(directory)
    saved = reader.read_metadata().state_dict_metadata
    for key, tensor in state.items():
        held = saved.get(key)
        if not (isinstance(held, TensorStorageMetadata) and held.properties.dtype == tensor.dtype
                and list(held.size) == list(tensor.shape)):
            raise CheckpointError(f"{directory / MANIFEST}: {key.removeprefix(MODEL)} ({tensor.dtype}, "
                                  f"{list(tensor.shape)}) is not what the DCP files hold")
    try:
        with warnings.catch_warnings():        # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=reader,
                     planner=_PieceLoadPlanner({}, str(directory)), no_dist=True)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{directory}: cannot be read ({type(exc).__name__}: {_first_line(exc)})") from None
    return {key: state[f"{MODEL}{held}"] for key, held in manifest["state_dict"].items()}
