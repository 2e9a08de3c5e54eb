"""Checkpoints that load under another plan and another world size.

A plan splits each parameter (and its optimizer moments) into per-rank pieces whose lengths
follow the devices' shares, so two plans of one model cut the same tensor in different places.
The checkpoint therefore stores every tensor as what it is globally — a module attribute of
the single-device model — with each rank's piece described as a chunk at a known offset of
that global tensor, in the ``torch.distributed.checkpoint`` (DCP) format. Loading asks DCP for
this rank's piece under the *new* plan; DCP reads the overlapping parts of the saved chunks
(the resharding), whatever plan and world size wrote them.

DCP's planners know whole tensors, ``DTensor`` (even pieces) and ``ShardedTensor``; hapc's pieces
are uneven, so :class:`_PieceSavePlanner` and :class:`_PieceLoadPlanner` describe them as
``ChunkStorageMetadata`` offsets. The files are standard DCP (``dcp.load`` reads them).

What a checkpoint holds (keys in the DCP state dict):

* ``model/<attr>``: parameters and buffers by module attribute (what ``model.state_dict()``
  calls them), pieces or replicated;
* ``optim/<attr>/<key>``: the optimizer's per-parameter state (AdamW ``exp_avg``, ``exp_avg_sq``
  cut like the parameter, or as the rows a rank owns under ZeRO; ``step`` replicated), ``optim/param_groups``;
* ``progress``: the step, the data position and an fp16 program's loss scale, to resume there.

Beside the DCP files, ``hapc-checkpoint.json`` (written last: its presence marks a complete
save) names the model, lists every tensor's global shape and dtype, and holds each file's size
and CRC-32, so a partial, corrupted or other-model checkpoint is refused with one line naming
the file, never loaded in part. DCP's ``.metadata`` is a pickle: :class:`SafeReader` reads it
with an allow-list, so a crafted one cannot run code. ``save`` writes ``DIR/step-NNNNNNNN/``,
then points ``DIR/latest`` at it: a crash during a save leaves the previous checkpoint usable.
Depends on torch only: code generation copies it beside emitted programs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import shutil
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_local_load_plan,
    create_default_local_save_plan,
)
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

FORMAT = "hapc-checkpoint/1"
MANIFEST = "hapc-checkpoint.json"
LATEST = "latest"
MODEL, OPTIM, PROGRESS, PARAM_GROUPS = "model/", "optim/", "progress", "optim/param_groups"
CRC_BLOCK_BYTES = 1 << 22


class CheckpointError(Exception):
    """A checkpoint that cannot be used as asked: the message is one line naming the file."""


@dataclasses.dataclass(frozen=True)
class Held:
    """A tensor this rank holds: its local ``tensor``, the block of the global tensor
    (``global_shape``) at ``offsets``; a replicated one has zero offsets and its own shape."""

    tensor: torch.Tensor
    offsets: tuple[int, ...]
    global_shape: tuple[int, ...]

    @property
    def is_piece(self) -> bool:
        return tuple(self.tensor.shape) != self.global_shape

    def like(self, tensor: torch.Tensor) -> Held:
        """The same placement for another tensor of this shape (an optimizer moment)."""
        return Held(tensor, self.offsets, self.global_shape)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where training stands: steps taken, batches consumed, fp16's loss scale state (0.0: none)."""

    step: int
    data_position: int
    loss_scale: float = 0.0
    scale_growth_tracker: int = 0


# ---- DCP planners for uneven pieces ----------------------------------------------------------

class _PieceSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, except that a piece is written as a chunk of its global
    tensor (its offsets and the global size recorded), not as a whole tensor of its own."""

    def __init__(self, pieces: Mapping[str, Held]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.pieces = pieces

    def create_local_plan(self) -> SavePlan:
        plan = create_default_local_save_plan(self.state_dict, self.is_coordinator)
        items = [self._chunk_item(w.index.fqn, self.pieces[w.index.fqn]) if w.index.fqn in self.pieces else w
                 for w in plan.items]
        self.plan = dataclasses.replace(plan, items=items)
        return self.plan

    @staticmethod
    def _chunk_item(fqn: str, held: Held) -> WriteItem:
        offsets = torch.Size(held.offsets)
        return WriteItem(index=MetadataIndex(fqn, offsets), type=WriteItemType.SHARD,
                         tensor_data=TensorWriteData(
                             chunk=ChunkStorageMetadata(offsets=offsets, sizes=held.tensor.size()),
                             properties=TensorProperties.create_from_tensor(held.tensor),
                             size=torch.Size(held.global_shape)))

    def lookup_object(self, index: MetadataIndex) -> Any:
        if index.fqn in self.pieces:
            return self.pieces[index.fqn].tensor
        return super().lookup_object(index)


class _PieceLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that a piece asks for its block of the global tensor
    (DCP finds the saved chunks that overlap it), and a tensor the checkpoint covers only in
    part is an error rather than a silently partial load."""

    def __init__(self, pieces: Mapping[str, Held], where: str) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.pieces, self.where = pieces, where

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        saved = self.metadata.state_dict_metadata
        requests = []
        for fqn, obj in self.state_dict.items():
            md = saved.get(fqn)
            if md is None:
                raise CheckpointError(f"{self.where}: holds no {fqn!r}")
            if not isinstance(obj, torch.Tensor):
                requests += create_default_local_load_plan({fqn: obj}, self.metadata, True).items
                continue
            held = self.pieces.get(fqn) or Held(obj, (0,) * obj.dim(), tuple(obj.shape))
            if not isinstance(md, TensorStorageMetadata) or tuple(md.size) != held.global_shape:
                got = tuple(md.size) if isinstance(md, TensorStorageMetadata) else "bytes"
                raise CheckpointError(f"{self.where}: {fqn!r} has shape {got}, this program's is "
                                      f"{held.global_shape}")
            chunk = ChunkStorageMetadata(offsets=torch.Size(held.offsets), sizes=held.tensor.size())
            reads = create_read_items_for_chunk_list(fqn, md, [chunk])
            covered = sum(math.prod(r.lengths) for r in reads)
            if covered != held.tensor.numel():
                raise CheckpointError(f"{self.where}: the saved pieces of {fqn!r} cover {covered} of the "
                                      f"{held.tensor.numel()} elements this rank needs")
            requests += reads
        return LoadPlan(requests)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        if index.fqn in self.pieces:
            return self.pieces[index.fqn].tensor
        return super().lookup_tensor(index)


# ---- what a program holds --------------------------------------------------------------------

def state_dict_aliases(module: torch.nn.Module) -> dict[str, str]:
    """``model.state_dict()`` key -> the first attribute name of the same tensor (tied weights,
    such as an LM head sharing the token embedding, have one tensor under two keys)."""
    first: dict[int, str] = {}
    for name, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        first.setdefault(id(t), name)
    return {key: first.get(id(t), key) for key, t in module.state_dict(keep_vars=True).items()}


def model_tensors(held: Mapping[str, Held], module: torch.nn.Module,
                  others: frozenset[str] = frozenset()) -> dict[str, Held]:
    """Every tensor of the model state this rank saves, by attribute: the program's (``held``),
    plus any entry of ``module.state_dict()`` no rank holds (kept at its initial value, so that
    the checkpoint holds the whole model); ``others``: what other ranks hold (a pipeline's other
    stages), theirs to save."""
    out = dict(held)
    state = module.state_dict()
    for canonical, keys in _tied_groups(module).items():
        if not keys & (set(out) | others):
            t = state[min(keys)].detach()
            out[canonical] = Held(t, (0,) * t.dim(), tuple(t.shape))
    return out


def _tied_groups(module: torch.nn.Module) -> dict[str, set[str]]:
    """First attribute name of each tensor in ``model.state_dict()`` -> every name it has."""
    groups: dict[str, set[str]] = {}
    for key, canonical in state_dict_aliases(module).items():
        groups.setdefault(canonical, {canonical}).add(key)
    return groups


def _export_names(tensors: Mapping[str, Held], module: torch.nn.Module) -> dict[str, str]:
    """``state_dict`` key -> the ``model/`` entry that holds it (one of its tied names)."""
    saved_keys = set(state_dict_aliases(module))
    out = {}
    for canonical, keys in _tied_groups(module).items():
        stored = next((k for k in sorted(keys) if k in tensors), canonical)
        out.update({k: stored for k in keys & saved_keys})
    return dict(sorted(out.items()))


def _optimizer_entries(optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor],
                       held: Mapping[str, Held]) -> dict[str, Any]:
    """DCP entries for the optimizer: per-parameter state placed like its parameter, the
    parameter groups (hyper-parameters, with parameters named by attribute)."""
    name_of = {id(p): name for name, p in params.items()}
    out: dict[str, Any] = {}
    groups: list[dict[str, Any]] = []
    for group in optimizer.param_groups if params else ():       # a rank no stage uses steps nothing
        names = [name_of[id(p)] for p in group["params"]]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": names})
        for p, name in zip(group["params"], names):
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor) and value.shape == p.shape and value.dim() > 0:
                    out[f"{OPTIM}{name}/{key}"] = held[name].like(value)
                else:
                    out[f"{OPTIM}{name}/{key}"] = value
    out[PARAM_GROUPS] = groups
    return out


def _split(entries: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Held]]:
    """(DCP state dict, its pieces): a Held becomes its tensor in the state dict."""
    state, pieces = {}, {}
    for key, value in entries.items():
        if isinstance(value, Held):
            state[key] = value.tensor
            if value.is_piece:
                pieces[key] = value
        else:
            state[key] = value
    return state, pieces


def _listed(tensors: Mapping[str, Held], module: torch.nn.Module, others: frozenset[str]) -> dict[str, Any]:
    """The manifest's ``tensors``: every attribute any rank saves, global shape and dtype."""
    state = module.state_dict()          # every rank builds the module whole: others' shapes too
    shapes = {**{k: state[k] for k in others},
              **{k: torch.empty(h.global_shape, dtype=h.tensor.dtype, device="meta") for k, h in tensors.items()}}
    return {k: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for k, t in sorted(shapes.items())}


def _merged_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The optimizer's groups with every rank's parameters, alike on all (DCP keeps any one's)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, groups)
    merged = [dict(g, params=[]) for g in next((g for g in everyone if g), [])]
    for theirs in everyone:
        for into, group in zip(merged, theirs):
            into["params"] += [n for n in group["params"] if n not in into["params"]]
    return merged


# ---- save ------------------------------------------------------------------------------------

def save(root: str | os.PathLike, held: Mapping[str, Held], module: torch.nn.Module,
         optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor], progress: Progress,
         *, model_file: str, model_kwargs: Mapping[str, Any], world: int, others: frozenset[str] = frozenset(),
         stepped: Mapping[str, Held] | None = None) -> Path:
    """Save this rank's part of a checkpoint (every rank calls it) to ``root/step-NNNNNNNN``; returns it.
    ``held``: parameters and buffers by attribute; ``params``: attribute -> what the optimizer steps,
    placed by ``stepped`` if not the piece (ZeRO's rows); ``others``: only other ranks' (stages')."""
    directory = Path(root) / f"step-{progress.step:08d}"
    tensors = model_tensors(held, module, others)
    entries: dict[str, Any] = {f"{MODEL}{k}": h for k, h in tensors.items()}
    entries.update(_optimizer_entries(optimizer, params, {**tensors, **(stepped or {})}))
    if others:      # each stage's optimizer steps its own parameters: the groups list everyone's
        entries[PARAM_GROUPS] = _merged_groups(entries[PARAM_GROUPS])
    entries[PROGRESS] = dataclasses.asdict(progress)
    state, pieces = _split(entries)
    rank = _rank()
    if rank == 0 and directory.exists():
        shutil.rmtree(directory)     # rewriting a step (maybe from another world size): start clean
    _barrier()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(directory), planner=_PieceSavePlanner(pieces))
    _barrier()
    if rank == 0:
        manifest = {
            "format": FORMAT,
            "model_file": model_file,
            "model_kwargs": dict(model_kwargs),
            "world": world,
            "progress": dataclasses.asdict(progress),
            "tensors": _listed(tensors, module, others),
            "state_dict": _export_names({**_listed(tensors, module, others)}, module),
            "files": {p.name: {"bytes": p.stat().st_size, "crc32": _crc32(p)}
                      for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST},
        }
        _write_atomic(directory / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n")
        _write_atomic(Path(root) / LATEST, directory.name + "\n")
    _barrier()
    return directory


# ---- load ------------------------------------------------------------------------------------

def resolve(path: str | os.PathLike) -> Path:
    """The checkpoint directory ``path`` names: itself, or the one its ``latest`` points at."""
    path = Path(path)
    if (path / MANIFEST).exists():
        return path
    if (path / LATEST).is_file():
        try:
            target = path / (path / LATEST).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path / LATEST}: unreadable ({type(exc).__name__}): it should name a "
                                  "step directory") from None
        if not (target / MANIFEST).exists():
            raise CheckpointError(f"{target / MANIFEST}: missing (named by {path / LATEST}): the save did not finish")
        return target
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if (path / ".metadata").exists():
        raise CheckpointError(f"{path / MANIFEST}: missing: an unfinished save, or not a hapc checkpoint")
    raise CheckpointError(f"{path}: not a checkpoint (no {MANIFEST} and no {LATEST} file)")


def read_manifest(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """(checkpoint directory, its manifest), every file checked against its size and CRC-32."""
    directory = resolve(path)
    file = directory / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{file}: unreadable ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{file}: not a hapc checkpoint manifest (format should be {FORMAT!r})")
    _check_manifest(manifest, file)
    on_disk = {p.name for p in directory.iterdir() if p.is_file() and p.name != MANIFEST}
    unlisted = sorted(on_disk - set(manifest["files"]))
    if unlisted:
        raise CheckpointError(f"{file}: does not list {unlisted[0]} ({len(unlisted)} files unlisted): "
                              "every file of the checkpoint must be checked")
    for name, want in sorted(manifest["files"].items()):
        p = directory / name
        if not p.is_file():
            raise CheckpointError(f"{p}: missing: the checkpoint is incomplete")
        size = p.stat().st_size
        if size != want["bytes"]:
            raise CheckpointError(f"{p}: {size} bytes, the save wrote {want['bytes']}: truncated or partial")
        if _crc32(p) != want["crc32"]:
            raise CheckpointError(f"{p}: checksum mismatch: the file is corrupted")
    return directory, manifest


def _check_manifest(manifest: Mapping[str, Any], file: Path) -> None:
    """The manifest's structure, before any of it is used: a wrong one is refused, not half read."""
    def wrong(field: str, wanted: str) -> CheckpointError:
        return CheckpointError(f"{file}: {field}: expected {wanted}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise wrong("files", "an object naming every file of the checkpoint")
    for name, want in files.items():
        if not isinstance(want, dict) or not all(type(want.get(k)) is int for k in ("bytes", "crc32")) \
                or "/" in name or "\\" in name or name in ("", ".", ".."):
            raise wrong(f"files.{name}", "a file of the directory with integer bytes and crc32")
    tensors = manifest.get("tensors")
    if not isinstance(tensors, dict):
        raise wrong("tensors", "an object of tensor shapes and dtypes")
    for key, info in tensors.items():
        if (not isinstance(info, dict) or not isinstance(info.get("shape"), list)
                or not all(isinstance(n, int) and n >= 0 for n in info["shape"])
                or not isinstance(getattr(torch, str(info.get("dtype")), None), torch.dtype)):
            raise wrong(f"tensors.{key}", "an object with a shape (a list of sizes) and a torch dtype")
    if not isinstance(manifest.get("state_dict"), dict) or not all(
            isinstance(v, str) and v in tensors for v in manifest["state_dict"].values()):
        raise wrong("state_dict", "an object mapping state_dict keys to tensors of the manifest")


def check_model(manifest: Mapping[str, Any], listed: Mapping[str, Any], where: Path) -> None:
    """Refuse a checkpoint of another model: the same attributes (``listed``) and global shapes."""
    saved = manifest.get("tensors", {})
    mine = {k: list(v["shape"]) for k, v in listed.items()}
    missing = sorted(set(mine) - set(saved))
    extra = sorted(set(saved) - set(mine))
    if missing or extra:
        what = f"has no {missing[0]!r}" if missing else f"has {extra[0]!r}, which this model lacks"
        raise CheckpointError(f"{where}: a checkpoint of another model ({manifest.get('model_file')}): it {what} "
                              f"({len(missing)} missing, {len(extra)} extra)")
    for key in sorted(mine):
        if saved[key]["shape"] != mine[key]:
            raise CheckpointError(f"{where}: a checkpoint of another model ({manifest.get('model_file')}): "
                                  f"{key!r} is {tuple(saved[key]['shape'])} there, {tuple(mine[key])} here")


def load(path: str | os.PathLike, held: Mapping[str, Held], module: torch.nn.Module, optimizer: torch.optim.Optimizer,
         params: Mapping[str, torch.Tensor], others: frozenset[str] = frozenset(),
         stepped: Mapping[str, Held] | None = None) -> Progress:
    """Load a checkpoint saved under any plan and world size into this rank's pieces (every
    rank calls it): parameters and buffers in place, the optimizer's state through
    ``load_state_dict``. Returns where training stood. Raises :class:`CheckpointError` (the
    same on every rank) before anything is changed when the checkpoint is unusable."""
    tensors = model_tensors(held, module, others)
    error, directory = None, None
    if _rank() == 0:
        try:
            directory, manifest = read_manifest(path)
            check_model(manifest, _listed(tensors, module, others), directory / MANIFEST)
        except CheckpointError as exc:
            error = str(exc)
    error, directory = _from_rank0((error, directory))
    if error is not None:
        raise CheckpointError(error)
    reader = SafeReader(directory)
    metadata = reader.read_metadata()
    # Loaded into fresh tensors first, copied in only once everything has been read.
    entries: dict[str, Any] = {f"{MODEL}{k}": h.like(torch.empty_like(h.tensor)) for k, h in tensors.items()}
    entries.update(_optimizer_slots(metadata.state_dict_metadata, {**tensors, **(stepped or {})}, directory, others))
    entries[PROGRESS] = None
    state, pieces = _split(entries)
    try:
        dcp.load(state, storage_reader=reader, planner=_PieceLoadPlanner(pieces, str(directory)))
    except CheckpointError:
        raise
    except Exception as exc:       # DCP wraps per-rank failures; keep it to one line
        raise CheckpointError(f"{directory}: cannot be read ({type(exc).__name__}: {_first_line(exc)})") from None
    optimizer_state = _optimizer_state(optimizer, params, state, directory, bool(others)) if params else None
    with torch.no_grad():
        for key, h in tensors.items():
            if key in held:
                held[key].tensor.copy_(state[f"{MODEL}{key}"])
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    p = state[PROGRESS]
    return Progress(int(p["step"]), int(p["data_position"]), float(p.get("loss_scale", 0.0)),
                    int(p.get("scale_growth_tracker", 0)))


def _optimizer_slots(saved: Mapping[str, Any], tensors: Mapping[str, Held], where: Path,
                     others: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Places for the saved optimizer entries (like their parameter when of its global shape; none
    for parameters only other ranks hold)."""
    out: dict[str, Any] = {}
    for key, md in saved.items():
        if not key.startswith(OPTIM):
            continue
        if key == PARAM_GROUPS:
            out[key] = None
            continue
        name = key[len(OPTIM):].rsplit("/", 1)[0]
        if name in others and name not in tensors:
            continue
        if name not in tensors:
            raise CheckpointError(f"{where}: optimizer state for {name!r}, which this model lacks")
        if isinstance(md, BytesStorageMetadata):
            out[key] = None
        elif tuple(md.size) == tensors[name].global_shape and len(md.size) > 0:
            h = tensors[name]
            out[key] = h.like(torch.empty(h.tensor.shape, dtype=md.properties.dtype, device=h.tensor.device))
        else:
            out[key] = Held(torch.empty(tuple(md.size), dtype=md.properties.dtype), (0,) * len(md.size),
                            tuple(md.size))
    return out


def _optimizer_state(optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor],
                     state: Mapping[str, Any], where: Path, part: bool = False) -> dict[str, Any]:
    """The loaded entries as ``optimizer.state_dict()`` of this program's optimizer, checked to
    be for the same optimizer and parameters (``part``: this rank's optimizer steps some of the
    saved groups' parameters, a pipeline stage's)."""
    name_of = {id(p): name for name, p in params.items()}
    index: dict[str, int] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            index[name_of[id(p)]] = len(index)
    current = optimizer.state_dict()
    saved_groups = state.get(PARAM_GROUPS) or []
    if len(saved_groups) != len(current["param_groups"]):
        raise CheckpointError(f"{where}: {len(saved_groups)} optimizer parameter groups, this program has "
                              f"{len(current['param_groups'])}")
    groups = []
    for saved, now in zip(saved_groups, current["param_groups"]):
        mine = sorted(name_of[id(p)] for p in _group_params(optimizer, now))
        if (not set(mine) <= set(saved["params"])) if part else sorted(saved["params"]) != mine:
            raise CheckpointError(f"{where}: the optimizer's parameter groups hold other parameters")
        if set(saved) != set(now):
            raise CheckpointError(f"{where}: saved by another optimizer (settings {sorted(set(saved) - {'params'})}, "
                                  f"this one has {sorted(set(now) - {'params'})})")
        groups.append({**saved, "params": now["params"]})     # this optimizer's order; state goes by name
    per_param: dict[int, dict[str, Any]] = {}
    for key, value in state.items():
        if key.startswith(OPTIM) and key != PARAM_GROUPS:
            name, entry = key[len(OPTIM):].rsplit("/", 1)
            if name in index:
                per_param.setdefault(index[name], {})[entry] = value
    return {"state": per_param, "param_groups": groups}


def _group_params(optimizer: torch.optim.Optimizer, group_state: Mapping[str, Any]) -> list[torch.Tensor]:
    """The parameters of a group of ``optimizer.state_dict()`` (which lists indices)."""
    flat = [p for g in optimizer.param_groups for p in g["params"]]
    return [flat[i] for i in group_state["params"]]


# ---- reading DCP's metadata without running code -------------------------------------------

class SafeReader(dcp.FileSystemReader):
    """DCP's file reader, except that ``.metadata`` (a pickle) is read by :func:`read_metadata`,
    which admits DCP's metadata classes only: a crafted file cannot run code on ``--load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if hasattr(self, "_get_metadata_path"):
            path = Path(str(self._get_metadata_path(kwargs.get("rank"))))
        else:
            path = Path(str(self.path)) / ".metadata"
        metadata = read_metadata(path)
        if getattr(metadata, "storage_meta", None) is None and hasattr(dcp_metadata, "StorageMeta"):
            metadata.storage_meta = dcp_metadata.StorageMeta()
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = getattr(self, "load_id", None)
        return metadata


def read_metadata(path: Path) -> Metadata:
    """A DCP ``.metadata`` file, unpickled with an allow-list of exact names: DCP's metadata
    classes, ``torch.Size``, dtypes, paths and plain containers. Anything else (a function, a
    dotted name) is refused with :class:`CheckpointError`, never called."""
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: {_first_line(exc)})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path}: not DCP metadata ({type(metadata).__name__})")
    return metadata


_PLAIN = {("builtins", n) for n in ("set", "frozenset", "list", "tuple", "dict", "slice", "complex", "bytearray")} | \
    {("collections", "OrderedDict"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
     ("torch.distributed.checkpoint.filesystem", "_StorageInfo")} | \
    {("pathlib", n) for n in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if "." not in name:
            if (module, name) in _PLAIN:
                return super().find_class(module, name)
            found = getattr(torch, name, None) if module == "torch" else None
            if isinstance(found, torch.dtype):
                return found
            found = getattr(dcp_metadata, name, None) if module == dcp_metadata.__name__ else None
            if isinstance(found, type) and found.__module__ == module:
                return found
        raise pickle.UnpicklingError(f"names {module}.{name}, which DCP metadata does not hold")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# ---- helpers ---------------------------------------------------------------------------------

def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(CRC_BLOCK_BYTES):
            crc = zlib.crc32(block, crc)
    return crc


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _from_rank0(value: Any) -> Any:
    box = [value]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]
