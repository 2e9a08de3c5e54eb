"""The fixed part of every emitted program, first half (the emitter replaces this docstring and
the block of tables between the ``generated`` markers with the plan's own).

It is kept as a real module so that it is linted and read like any other code; the emitted
program is this file with the plan's tables and ``forward`` pasted in, followed by the second
half (:mod:`hapc.codegen.skeleton_main`: verification, launch checks, checkpoints, ``main``),
so it needs torch, the copied model file and the copied runtime files beside it — never hapc.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.util
import inspect
import io
import math  # noqa: F401  (generated code writes math.inf / math.nan)
import os
import shutil
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.checkpoint

HERE = Path(__file__).resolve().parent


def _load(name: str, file: str):
    """Import a file that sits beside this program, by path (no package, no sys.path games);
    the module name carries this directory's, so two programs can live in one process."""
    name = f"{name}_{zlib.crc32(str(HERE).encode()):08x}"
    if name in sys.modules:
        return sys.modules[name]
    if not (HERE / file).is_file():
        missing = f"program.py: {file} is missing beside it in {HERE} (copy the whole folder hapc wrote)"
        if __name__ == "__main__":          # run as a script: one line and exit 2, no traceback
            print(missing, file=sys.stderr)
            raise SystemExit(2)
        raise ImportError(missing)
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {HERE / file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


L = _load("hapc_local_ops", "hapc_local_ops.py")          # per-rank pieces of some ops
R = _load("hapc_random_ops", "hapc_random_ops.py")        # random draws any rank can make for its piece
C = _load("hapc_collectives", "hapc_collectives.py")      # uneven collectives, autograd duals
S = _load("hapc_loss_scale", "hapc_loss_scale.py")        # fp16's dynamic loss scaling, agreed by all ranks
Z = _load("hapc_zero", "hapc_zero.py")                    # ZeRO: optimizer state in owned rows
aten = torch.ops.aten

# ==== generated: tables and forward (begin) ====
MODEL_FILE = "model.py"
MODEL_KWARGS: dict[str, Any] = {}
SEED = 0
OPTIMIZER = "adamw"
WORLD = 1
SHARES: tuple[float, ...] = (1.0,)
HIERARCHICAL = False
LOSS, LOSS_PARTIAL = "loss", False
PARAMS: dict[str, str] = {}
BUFFERS: dict[str, str] = {}
CONSTANTS: dict[str, str] = {}
CONSTANTS_SHA256: str | None = None
INPUTS: tuple[str, ...] = ()
SHARDS: dict[str, tuple[int, tuple[int, ...]]] = {}
LOCAL_CALLS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], tuple[tuple[int, ...], ...]]] = {}
GRAD_SYNC_ORDER: tuple[str, ...] = ()
STATE_ROWS: dict[str, tuple[int, ...]] = {}
LOW_GATHERS: dict[str, str] = {}
NODE_SIZES: tuple[int, ...] = (1,)
TRACED_FOR = "cpu"
PRECISION = "fp32"
ALLOW_TF32 = False
LOSS_SCALING: dict[str, float] | None = None


def forward(rt: Rank, v: dict[str, torch.Tensor]) -> torch.Tensor:
    raise NotImplementedError


_SECOND_HALF_IMPORTS = (argparse, datetime, os, shutil, statistics, threading, time)     # what skeleton_main.py's text uses
# ==== generated: tables and forward (end) ====

M = _load("hapc_user_model", MODEL_FILE)                  # the user's model file


class Rank:
    """What one rank knows: its index, the collectives, and the tables looked up by rank.

    Every rank runs the same ``forward``; whatever differs between ranks (piece lengths and
    offsets, which rank keeps a replicated loss) is read from the tables here.
    """

    def __init__(self, comm: Any, device: torch.device, seed: int = SEED, *,
                 shards: dict[str, tuple[int, tuple[int, ...]]] | None = None,
                 local_calls: dict[str, tuple] | None = None) -> None:
        self.comm = comm
        self.rank = comm.rank                   # this rank's index in its group (a pipeline stage's)
        self.device = device
        self.seed = seed
        self.tied: list[torch.Tensor] = []      # differentiable collective results of this step
        self.ran: list[tuple[str, str]] = []    # (aten op, node) of each local op this step, in order
        # A pipeline stage's micro-batch (index, count, {random node: its output's batch dim}): its
        # random ops draw their rows of the whole batch's draw (hapc_random_ops.micro_batch_view).
        self.micro: tuple[int, int, dict[str, int]] | None = None
        # A pipeline stage brings its own tables (hapc_pipeline.py); one-stage programs use the globals.
        self.shards = SHARDS if shards is None else shards
        self.local_calls = LOCAL_CALLS if local_calls is None else local_calls
        self.gathered = Z.GatheredWeights()      # ZeRO-3: weights gathered for use, not kept

    # -- this rank's piece of a sharded value
    def piece_info(self, name: str):
        """ShardInfo of this rank's piece of ``name``, or None when it is not sharded."""
        if name not in self.shards:
            return None
        dim, lengths = self.shards[name]
        return L.ShardInfo(dim, sum(lengths[:self.rank]), lengths[self.rank], sum(lengths))

    def piece(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's piece of a source value given whole (parameters, inputs)."""
        info = self.piece_info(name)
        return full if info is None else full.narrow(info.dim, info.offset, info.length)

    def rescale(self, value: Any, name: str) -> Any:
        """A local mean over ``name``'s sharded dimension as its exact summand of the global one."""
        info = self.piece_info(name)
        return value if info is None else L.rescale_to_global(value, info.length, info.global_length)

    def ctx(self, node: str, name: str | None = None):
        """The RankCtx a local op of ``node`` gets on this rank. In a block function ``node`` is
        the block's first call's node and ``name`` this call's: random draws are keyed by it."""
        op, ins, outs, shapes = self.local_calls[node]
        name = node if name is None else name
        self.ran.append((op, name))
        world = self.comm.world
        ins_info, outs_info = tuple(self.piece_info(n) for n in ins), tuple(self.piece_info(n) for n in outs)
        if self.micro is not None and op in R.DRAWING_OPS:      # exact pieces: the reference replays them
            index, count, batch_dims = self.micro
            dim = batch_dims.get(name)
            if dim is not None and outs_info:
                micro_shape = shapes[0]
                whole, piece = R.micro_batch_view(micro_shape, outs_info[0], dim, index, count, L.ShardInfo)
                shapes, outs_info = (whole, *shapes[1:]), (piece, *outs_info[1:])
                if ins_info:    # attention dropout cuts its mask as its queries, whose leading dims these are
                    ins_info = (R.micro_batch_view(micro_shape, ins_info[0], dim, index, count, L.ShardInfo)[1],
                                *ins_info[1:])
            return L.RankCtx(self.rank, world, name, op, ins_info, outs_info, shapes, self.seed, True)
        return L.RankCtx(self.rank, world, name, op, ins_info, outs_info, shapes, self.seed, world > 1)

    def recompute(self, block: Callable, *args: Any) -> Any:
        """``block(*args)`` keeping only its arguments for backward, which runs it again first
        (activation recomputation, ``torch.utils.checkpoint`` non-reentrant, under this
        forward's autocast). The rerun draws this forward's random numbers (its step seed and
        micro-batch, which a pipeline has moved on from by then), adds nothing to the step's
        records, and runs to its end on every rank (no early stop), so its collectives line up."""
        seed, micro = self.seed, self.micro
        first = True

        def run(*inputs: Any) -> Any:
            nonlocal first
            if first:
                first = False
                return block(*inputs)
            now, ran, tied = (self.seed, self.micro), len(self.ran), len(self.tied)
            self.seed, self.micro = seed, micro
            try:
                return block(*inputs)
            finally:
                self.seed, self.micro = now
                del self.ran[ran:], self.tied[tied:]

        with torch.utils.checkpoint.set_checkpoint_early_stop(False):
            return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False)

    def drive(self, result: Any) -> Any:
        """Run a local op that asks for collectives (see hapc_collectives.drive)."""
        return C.drive(self.comm, result, self.tied)

    # -- layout changes (see hapc_collectives.py for each one's backward)
    def slice(self, x: torch.Tensor, out: str) -> torch.Tensor:
        dim, lengths = self.shards[out]
        return C.shard_slice(self.comm, x, dim, lengths)

    def all_gather(self, x: torch.Tensor, src: str, method: str = "auto") -> torch.Tensor:
        dim, lengths = self.shards[src]
        if src not in PARAMS:
            return C.all_gather(self.comm, x, dim, lengths, method)
        # A weight stored sharded: gathered in the precision its readers compute in (LOW_GATHERS),
        # and gathered again in backward instead of kept (hapc_zero.py).
        how = C.method_of(method)
        dtype = getattr(torch, LOW_GATHERS[src]) if src in LOW_GATHERS else x.dtype

        def gather(piece: torch.Tensor) -> torch.Tensor:
            return C.gather(self.comm, piece.to(dtype), dim, lengths, how)

        out = Z.gather_weight(x, gather, lambda grad: C.scatter_sum(self.comm, grad, dim, lengths, how))
        return self.gathered.register(out, lambda: gather(x.detach()))

    def reduce_scatter(self, x: torch.Tensor, out: str, method: str = "auto") -> torch.Tensor:
        dim, lengths = self.shards[out]
        return C.reduce_scatter(self.comm, x, dim, lengths, method)

    def linear_sfb(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, src: str) -> torch.Tensor:
        """Linear whose weight gradient is rebuilt from gathered factors (no all-reduce)."""
        dim, lengths = self.shards[src]
        return C.linear_sfb(self.comm, x, weight, bias, dim, lengths)

    def all_reduce(self, x: torch.Tensor, method: str = "auto") -> torch.Tensor:
        return C.all_reduce(self.comm, x, method)

    def all_to_all(self, x: torch.Tensor, src: str, out: str, method: str = "auto") -> torch.Tensor:
        (src_dim, src_lengths), (dst_dim, dst_lengths) = self.shards[src], self.shards[out]
        return C.all_to_all(self.comm, x, src_dim, src_lengths, dst_dim, dst_lengths, method)

    def pad_partial(self, x: torch.Tensor, src: str) -> torch.Tensor:
        dim, lengths = self.shards[src]
        return C.shard_to_partial(self.comm, x, dim, lengths)

    def keep_on_rank0(self, x: torch.Tensor) -> torch.Tensor:
        return C.replicate_to_partial(self.comm, x)

    def write_back(self, buffer: torch.Tensor, value: torch.Tensor) -> None:
        """An op the model ran in place on a buffer: keep its new value for the next step."""
        buffer.data.copy_(value.detach())


def _call_with(fn: Callable, kwargs: dict[str, Any]) -> Any:
    """Call a model-file function with the keyword arguments it accepts."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: x for k, x in kwargs.items() if k in params})


class Trainer:
    """This rank's shard of the model and one training step; see :func:`build`."""

    def __init__(self, device: str | torch.device = "cpu", *, model_kwargs: dict[str, Any] | None = None,
                 seed: int = SEED, overlap_grad_sync: bool = True) -> None:
        if not dist.is_initialized():
            raise RuntimeError("initialise the process group first (dist.init_process_group)")
        if dist.get_world_size() != WORLD:
            raise RuntimeError(f"this program is for {WORLD} ranks, the process group has "
                               f"{dist.get_world_size()}")
        self.device = torch.device(device)
        self.kwargs = dict(MODEL_KWARGS if model_kwargs is None else model_kwargs)
        self.comm = C.Comm(hierarchical=HIERARCHICAL, node_sizes=NODE_SIZES)
        self.rank = self.comm.rank
        self.rt = Rank(self.comm, self.device, seed)
        self.seed, self.steps_done = seed, 0
        # Same seed on every rank: the same initial weights everywhere; each keeps its piece.
        torch.manual_seed(seed)
        self.module = _call_with(M.model, self.kwargs)
        self.params: dict[str, torch.Tensor] = {}         # module attribute -> local leaf
        self.sources: dict[str, torch.Tensor] = {}        # program value -> local tensor
        for name, target in PARAMS.items():
            param = self.module.get_parameter(target)
            leaf = self.rt.piece(name, param.detach()).to(self.device).clone().requires_grad_(param.requires_grad)
            self.params[target] = self.sources[name] = leaf
        for name, target in BUFFERS.items():
            self.sources[name] = self.rt.piece(name, self.module.get_buffer(target).detach()).to(self.device).clone()
        constants = _constants(self.module, self.kwargs) if CONSTANTS else {}
        for name, target in CONSTANTS.items():
            self.sources[name] = self.rt.piece(name, constants[target].detach()).to(self.device).clone()
        self.sync = C.GradSync(self.comm, [self.sources[n] for n in GRAD_SYNC_ORDER if n not in STATE_ROWS],
                               overlap=overlap_grad_sync)
        # ZeRO (STATE_ROWS): these gradients are reduce-scattered to the rows each rank owns.
        self.zero = Z.StateShards(self.comm, [self.sources[n] for n in GRAD_SYNC_ORDER if n in STATE_ROWS],
                                  [STATE_ROWS[n] for n in GRAD_SYNC_ORDER if n in STATE_ROWS],
                                  overlap=overlap_grad_sync)
        # What the optimizer steps, by module attribute: the leaf, or under ZeRO its owned rows.
        self.stepped = {target: self.zero.stepped(leaf) for target, leaf in self.params.items()}
        self.scaler = make_loss_scaler(self.device)
        self.verdict = self.scaler.before_first_step()       # the last step's: skipped or not, its loss scale

    def step(self, batch: Sequence[torch.Tensor], *, local: bool = False) -> torch.Tensor:
        """Forward, backward and gradient synchronisation for one batch; returns the global loss.

        ``batch`` is the global batch (the same on every rank; each takes its piece), or with
        ``local=True`` this rank's pieces already. Gradients land in ``.grad`` of the tensors in
        ``self.stepped``, complete for this rank's pieces: step your optimizer on those, call
        :meth:`share_updates`, then zero them. Under fp16
        the loss is scaled for backward and the gradients unscaled after their all-reduce; a
        step whose gradients overflowed on any rank leaves them None on every rank
        (``self.verdict.skipped``), so an optimizer step changes nothing.
        """
        batch = tuple(batch)
        if len(batch) != len(INPUTS):
            raise ValueError(f"the model takes {len(INPUTS)} inputs, got {len(batch)}")
        v = dict(self.sources)
        for name, x in zip(INPUTS, batch):
            v[name] = (x if local else self.rt.piece(name, x)).to(self.device)
        self.rt.seed, self.rt.tied, self.rt.ran = self.seed + self.steps_done, [], []
        with autocast(self.device), self.rt.gathered.hooks():
            loss = C.tie(forward(self.rt, v).reshape(()), self.rt.tied)
        self.rt.tied = []
        self.steps_done += 1
        # The global value of a Partial loss is summed while backward runs (issued first, so
        # every rank queues its collectives in the same order), not after it.
        total = loss.detach().clone()
        summing = dist.all_reduce(total, async_op=True) if LOSS_PARTIAL and WORLD > 1 else None
        if loss.requires_grad:
            # A Partial loss is summed over ranks: each back-propagates its piece. A replicated
            # loss is counted once: rank 0's copy (the others back-propagate zeros, which still
            # runs every collective of the backward on every rank).
            (self.scaler.scale_loss(loss) if LOSS_PARTIAL or self.rank == 0 else loss * 0).backward()
            self.sync.finish()
            self.zero.finish()
        self.rt.gathered.clear()
        if summing is not None:
            summing.wait()
        self.verdict = self.scaler.finish(list(self.stepped.values()))    # unscale the synced gradients
        return total

    def share_updates(self) -> None:
        """After the optimizer step: under ZeRO, every rank's updated rows to every rank."""
        self.zero.share_updates()

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's whole gradient (sharded ones gathered), on every rank."""
        out = {}
        for name, target in PARAMS.items():
            leaf = self.sources[name]
            g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            if name in STATE_ROWS:
                g = C.gather(self.comm, self.zero.owned_grad(leaf), 0, STATE_ROWS[name])
            elif name in SHARDS:
                dim, lengths = SHARDS[name]
                g = C.gather(self.comm, g, dim, lengths)
            out[target] = g
        return out


def _constants(module: torch.nn.Module, kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Tensors the trace lifted out of the model (created inside forward, or plain tensor
    attributes): from constants.pt when the plan saved them, else from the module's attributes,
    else from torch.export of the model itself, which names them as the trace did."""
    problem = constants_problem()
    if problem is not None:
        raise RuntimeError(problem)
    found = {}
    if CONSTANTS_SHA256 is not None:        # a constants.pt this program was not written with is not read
        found = torch.load(io.BytesIO((HERE / "constants.pt").read_bytes()), weights_only=True)
    missing = [t for t in CONSTANTS.values() if t not in found]
    for target in list(missing):
        obj: Any = module
        for part in target.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.Tensor):
            found[target] = obj
            missing.remove(target)
    if missing:
        inputs = tuple(_call_with(M.inputs, kwargs))
        exported = torch.export.export(module, inputs, strict=False).constants
        found.update({t: exported[t] for t in missing if t in exported})
    if any(t not in found for t in CONSTANTS.values()):
        raise RuntimeError(f"cannot find the traced constants {sorted(set(CONSTANTS.values()) - set(found))}")
    return found


def constants_problem() -> str | None:
    """Why constants.pt cannot be used (missing, or not the bytes this program was written with:
    one flipped bit in a constant trains another model), in one line; None when it can."""
    if CONSTANTS_SHA256 is None:
        return None
    path = HERE / "constants.pt"
    if not path.is_file():
        return f"program.py: {path} is missing (copy the whole folder hapc wrote)"
    if hashlib.sha256(path.read_bytes()).hexdigest() != CONSTANTS_SHA256:
        return f"program.py: {path} is not the file this program was written with (checksum mismatch): emit again"
    return None


def build(device: str | torch.device = "cpu", **options: Any):
    """This rank's parameters and a step function, inside an initialised process group.

    Returns ``(params, step)``: ``params`` maps module attribute names to the tensors this rank
    updates (give them to any elementwise optimizer: AdamW, Adam, SGD ...), and
    ``step(batch, local=False)`` runs forward, backward and the gradient synchronisation and
    returns the global loss. Options: ``model_kwargs``, ``seed``, ``overlap_grad_sync``. A plan
    with ZeRO (``STATE_ROWS``) is refused: its updates need :meth:`Trainer.share_updates` after
    each optimizer step, so use :class:`Trainer` itself.
    """
    if STATE_ROWS:
        raise RuntimeError("this plan shards optimizer state (ZeRO): use Trainer(device), step the "
                           "optimizer on trainer.stepped and call trainer.share_updates() after it")
    trainer = Trainer(device, **options)
    return trainer.params, trainer.step


# ---- pipelined plans (issue 12): the tables hold STAGES, hapc_pipeline.py runs the schedule ----

def make_trainer(device: torch.device) -> Any:
    """This rank's trainer: for a pipelined plan (the tables define ``STAGES``) the pipeline
    schedule of hapc_pipeline.py over this rank's stage, else :class:`Trainer`."""
    if "STAGES" not in globals():
        return Trainer(device)

    class Program:
        """This program's tables, classes and runtime modules, as attributes."""

    program = Program()
    program.__dict__.update(globals())
    return _load("hapc_pipeline", "hapc_pipeline.py").PipelineTrainer(program, device)


def make_optimizer(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The model file's ``optimizer(params)`` if it has one, else the plan's default."""
    if not params:      # a rank no pipeline stage uses: nothing to update
        return torch.optim.SGD([torch.zeros(0, requires_grad=True)], lr=0.0)
    if callable(getattr(M, "optimizer", None)):
        return M.optimizer(params)
    if OPTIMIZER == "adam":
        return C.fused_optimizer(torch.optim.Adam, params, lr=1e-3)
    if OPTIMIZER == "sgd":
        return C.fused_optimizer(torch.optim.SGD, params, lr=1e-2)
    return C.fused_optimizer(torch.optim.AdamW, params, lr=1e-3)


def autocast(device: torch.device):
    """The forward's numerics: bf16 or fp16 autocast for such a plan (on CPU as on CUDA), else float32."""
    if PRECISION in ("bf16", "fp16"):
        return torch.autocast(device.type, dtype=torch.bfloat16 if PRECISION == "bf16" else torch.float16)
    return contextlib.nullcontext()


def make_loss_scaler(device: torch.device) -> Any:
    """fp16's dynamic loss scaling (LOSS_SCALING: GradScaler's settings); a scaler that does
    nothing for fp32 and bf16 plans."""
    return S.LossScaler(LOSS_SCALING is not None, device=device, **(LOSS_SCALING or {}))
