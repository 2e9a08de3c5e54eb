"""The fixed part of every emitted program (the emitter replaces this docstring and the
block of tables between the ``generated`` markers with the plan's own).

It is kept as a real module so that it is linted and read like any other code; the emitted
program is this file with the plan's tables and ``forward`` pasted in, so it needs torch, the
copied model file and the two copied runtime files beside it — never hapc.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import math  # noqa: F401  (generated code writes math.inf / math.nan)
import os
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent


def _load(name: str, file: str):
    """Import a file that sits beside this program, by path (no package, no sys.path games);
    the module name carries this directory's, so two programs can live in one process."""
    name = f"{name}_{zlib.crc32(str(HERE).encode()):08x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {HERE / file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


L = _load("hapc_local_ops", "hapc_local_ops.py")          # per-rank pieces of some ops
C = _load("hapc_collectives", "hapc_collectives.py")      # uneven collectives, autograd duals
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
INPUTS: tuple[str, ...] = ()
SHARDS: dict[str, tuple[int, tuple[int, ...]]] = {}
LOCAL_CALLS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], tuple[tuple[int, ...], ...]]] = {}
GRAD_SYNC_ORDER: tuple[str, ...] = ()
NODE_SIZES: tuple[int, ...] = (1,)
PRECISION = "fp32"
ALLOW_TF32 = False


def forward(rt: Rank, v: dict[str, torch.Tensor]) -> torch.Tensor:
    raise NotImplementedError
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
        # A pipeline stage brings its own tables (hapc_pipeline.py); one-stage programs use the globals.
        self.shards = SHARDS if shards is None else shards
        self.local_calls = LOCAL_CALLS if local_calls is None else local_calls

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
        return L.RankCtx(self.rank, world, name, op, tuple(self.piece_info(n) for n in ins),
                         tuple(self.piece_info(n) for n in outs), shapes, self.seed, world > 1)

    def drive(self, result: Any) -> Any:
        """Run a local op that asks for collectives (see hapc_collectives.drive)."""
        return C.drive(self.comm, result, self.tied)

    # -- layout changes (see hapc_collectives.py for each one's backward)
    def slice(self, x: torch.Tensor, out: str) -> torch.Tensor:
        dim, lengths = self.shards[out]
        return C.shard_slice(self.comm, x, dim, lengths)

    def all_gather(self, x: torch.Tensor, src: str, method: str = "auto") -> torch.Tensor:
        dim, lengths = self.shards[src]
        return C.all_gather(self.comm, x, dim, lengths, method)

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
        self.sync = C.GradSync(self.comm, [self.sources[n] for n in GRAD_SYNC_ORDER], overlap=overlap_grad_sync)

    def step(self, batch: Sequence[torch.Tensor], *, local: bool = False) -> torch.Tensor:
        """Forward, backward and gradient synchronisation for one batch; returns the global loss.

        ``batch`` is the global batch (the same on every rank; each takes its piece), or with
        ``local=True`` this rank's pieces already. Gradients land in ``.grad`` of the local
        leaves, complete for this rank's pieces: step your optimizer, then zero them.
        """
        batch = tuple(batch)
        if len(batch) != len(INPUTS):
            raise ValueError(f"the model takes {len(INPUTS)} inputs, got {len(batch)}")
        v = dict(self.sources)
        for name, x in zip(INPUTS, batch):
            v[name] = (x if local else self.rt.piece(name, x)).to(self.device)
        self.rt.seed, self.rt.tied, self.rt.ran = self.seed + self.steps_done, [], []
        with autocast(self.device):
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
            (loss if LOSS_PARTIAL or self.rank == 0 else loss * 0).backward()
            self.sync.finish()
        if summing is not None:
            summing.wait()
        return total

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's whole gradient (sharded ones gathered), on every rank."""
        out = {}
        for name, target in PARAMS.items():
            leaf = self.sources[name]
            g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            if name in SHARDS:
                dim, lengths = SHARDS[name]
                g = C.gather(self.comm, g, dim, lengths)
            out[target] = g
        return out


def _constants(module: torch.nn.Module, kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Tensors the trace lifted out of the model (created inside forward, or plain tensor
    attributes): from constants.pt when the plan saved them, else from the module's attributes,
    else from torch.export of the model itself, which names them as the trace did."""
    found = torch.load(HERE / "constants.pt") if (HERE / "constants.pt").exists() else {}
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


def build(device: str | torch.device = "cpu", **options: Any):
    """This rank's parameters and a step function, inside an initialised process group.

    Returns ``(params, step)``: ``params`` maps module attribute names to this rank's local
    leaf tensors (give them to any elementwise optimizer: AdamW, Adam, SGD ...), and
    ``step(batch, local=False)`` runs forward, backward and the gradient all-reduce and returns
    the global loss. Options: ``model_kwargs``, ``seed``, ``overlap_grad_sync``.
    """
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
    """The forward's numerics: bf16 autocast for a bf16 plan (on CPU as on CUDA), else float32."""
    if PRECISION == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# Verification tolerance: a tensor passes when every element is within ATOL + RTOL * (largest
# reference magnitude of that tensor). Sharded sums add in another order than one device does,
# so in float32 errors of a few ulps of the tensor's scale are expected. Under bf16 autocast
# every product rounds to 8 mantissa bits (2**-9 relative) on both sides and the partial sums
# of shards round separately, so a few percent of the scale is the bf16 counterpart; a wrong
# program is off by the scale itself.
VERIFY_RTOL, VERIFY_ATOL = 1e-4, 1e-6
VERIFY_BF16_RTOL, VERIFY_BF16_ATOL = 5e-2, 1e-4


def verify_tolerance() -> tuple[float, float]:
    """(rtol, atol) for this program's precision."""
    return (VERIFY_BF16_RTOL, VERIFY_BF16_ATOL) if PRECISION == "bf16" else (VERIFY_RTOL, VERIFY_ATOL)


@contextlib.contextmanager
def _program_dropout_masks(step_seed: int, ran: Sequence[tuple[str, str]]):
    """While the single-device reference runs, ``F.dropout`` (what ``nn.Dropout`` calls) drops
    what the program dropped: the k-th call uses the mask of the k-th dropout node the program
    ran (``ran``: Rank.ran of the step seeded ``step_seed``). Without this the two sides draw
    different masks and a model with dropout could never verify."""
    nodes = iter([n for op, n in ran if op == "aten.dropout.default"])
    original = torch.nn.functional.dropout

    def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        node = next(nodes, None)
        if node is None or not training or p == 0.0 or p >= 1.0:
            return original(x, p, training, inplace)
        if WORLD == 1:                               # the program ran torch's kernel under this seed
            with L.seeded_rng(node, step_seed, x.device):
                return original(x, p, training, inplace)
        keep = L.dropout_keep(node, step_seed, x.shape, p, device=x.device).to(x.dtype)
        return x * keep / (1.0 - p)

    # Attention dropout likewise: the k-th scaled_dot_product_attention call with dropout_p > 0
    # replays the k-th attention node's mask (several ranks: the shared counter-based mask on
    # attention written out; one rank: torch's kernel under the node's seed).
    attention_nodes = iter([n for op, n in ran if op == "aten.scaled_dot_product_attention.default"])
    original_sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        node = next(attention_nodes, None) if dropout_p > 0.0 else None
        if node is None:
            return original_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if WORLD == 1:
            with L.seeded_rng(node, step_seed, q.device):
                return original_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        keep = L.dropout_keep(node, step_seed, (*q.shape[:-1], k.shape[-2]), dropout_p, device=q.device)
        return L.attention_with_dropout(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, keep)

    torch.nn.functional.dropout = dropout
    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        torch.nn.functional.dropout = original
        torch.nn.functional.scaled_dot_product_attention = original_sdpa


def verify(trainer: Trainer, loss: torch.Tensor, batch: Sequence[torch.Tensor]) -> bool:
    """Compare the first step's loss and gradients with the user's module on one device."""
    grads = trainer.full_grads()                         # collective: every rank takes part
    verdict = torch.zeros(2, dtype=torch.float64, device=trainer.device)   # NCCL wants it on the GPU
    if trainer.rank == 0:
        ref = trainer.module.to(trainer.device)
        ref.zero_grad(set_to_none=True)
        with _program_dropout_masks(trainer.seed, trainer.rt.ran), autocast(trainer.device):
            ref_loss = ref(*[x.to(trainer.device) for x in batch])
        ref_loss.backward()
        checks = [("loss", loss.reshape(()), ref_loss.detach().reshape(()))]
        for target, g in grads.items():
            p = ref.get_parameter(target)
            checks.append((f"gradient of {target}", g, p.grad if p.grad is not None else torch.zeros_like(p)))
        worst, failed = 0.0, None
        rtol, atol = verify_tolerance()
        against = "one device under the same bf16 autocast" if PRECISION == "bf16" else "one device in float32"
        print(f"verify tolerance: {PRECISION} ({against}), "
              f"atol {atol:g} + rtol {rtol:g} x each tensor's largest magnitude", flush=True)
        for what, got, want in checks:
            err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
            scale = want.abs().max().item() if want.numel() else 0.0
            worst = max(worst, err)
            if failed is None and not err <= atol + rtol * scale:
                failed = what
        verdict[0], verdict[1] = float(failed is None), worst
        if failed is None:
            print(f"verify: ok max_abs_err={worst:.3e}", flush=True)
        else:
            print(f"verify: FAILED {failed} max_abs_err={worst:.3e}", flush=True)
    if WORLD > 1:
        dist.broadcast(verdict, src=0)
    return bool(verdict[0].item())


# ---- launching across nodes (issue 12) ----------------------------------------------------------

def launch_lines(program: str = sys.argv[0]) -> list[str]:
    """The torchrun lines for this plan's cluster: one per node, in the cluster file's order
    (torchrun numbers ranks node by node, so each rank lands on the device the plan gave it)."""
    if len(NODE_SIZES) == 1:
        return [f"torchrun --nproc_per_node={WORLD} {program}"]
    return [f"torchrun --nnodes={len(NODE_SIZES)} --node_rank={i} --nproc_per_node={k} "
            f"--master_addr=NODE0_ADDRESS --master_port=29500 {program}   # on node {i}"
            for i, k in enumerate(NODE_SIZES)]


def node_mismatch(env: dict[str, str] | None = None) -> str | None:
    """Under a multi-node torchrun launch, a one-line reason when this rank is not on the node
    the plan put it on (another node count, or another number of ranks on this node); None if
    it is. One launcher running every rank (the cluster emulated on one host) is accepted."""
    env = dict(os.environ if env is None else env)
    nodes = int(env.get("GROUP_WORLD_SIZE", "1"))
    if nodes <= 1:
        return None
    if nodes != len(NODE_SIZES):
        return (f"launched on {nodes} nodes but the plan's cluster has {len(NODE_SIZES)} "
                f"(ranks per node {list(NODE_SIZES)}): {launch_lines()[0]} ...")
    rank, node, local = int(env["RANK"]), int(env.get("GROUP_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", "0"))
    first = 0
    for want, size in enumerate(NODE_SIZES):
        if rank < first + size:
            break
        first += size
    if node != want or local != NODE_SIZES[node]:
        return (f"rank {rank} runs on node {node} with {local} ranks there, but the plan puts it on node {want} "
                f"with {NODE_SIZES[want]}: launch node i with --node_rank=i --nproc_per_node=<its device count>")
    return None


# ---- checkpoints (hapc_checkpoint.py): save under this plan, load under any -----------------

def _checkpoints():
    """hapc_checkpoint.py, loaded on first use (it imports torch.distributed.checkpoint)."""
    return _load("hapc_checkpoint", "hapc_checkpoint.py")


def checkpoint_tensors(trainer: Trainer) -> dict[str, Any]:
    """Every parameter and buffer this rank holds, by module attribute, with where its piece
    sits in the whole tensor (SHARDS), so a checkpoint can be loaded under another plan."""
    K = _checkpoints()
    out = {}
    for name, target in (*PARAMS.items(), *BUFFERS.items()):
        local, info = trainer.sources[name], trainer.rt.piece_info(name)
        offsets, shape = [0] * local.dim(), list(local.shape)
        if info is not None:
            offsets[info.dim], shape[info.dim] = info.offset, info.global_length
        out[target] = K.Held(local, tuple(offsets), tuple(shape))
    return out


def save_checkpoint(directory: str, trainer: Trainer, optimizer: torch.optim.Optimizer,
                    data_position: int) -> Path:
    """Save parameters, buffers, optimizer state, step and data position (every rank calls it)."""
    K = _checkpoints()
    return K.save(directory, checkpoint_tensors(trainer), trainer.module, optimizer, trainer.params,
                  K.Progress(trainer.steps_done, data_position), model_file=MODEL_FILE,
                  model_kwargs=trainer.kwargs, world=WORLD)


def load_checkpoint(directory: str, trainer: Trainer, optimizer: torch.optim.Optimizer) -> int:
    """Load a checkpoint saved by any plan of this model; returns the data position."""
    K = _checkpoints()
    progress = K.load(directory, checkpoint_tensors(trainer), trainer.module, optimizer, trainer.params)
    trainer.steps_done = progress.step        # dropout masks and step numbers continue
    return progress.data_position


def report_peak_memory(rank: int, device: torch.device) -> None:
    """On GPUs, rank 0 prints every rank's torch.cuda.max_memory_allocated (bytes, in rank
    order), to hold against the plan's predicted peak: a memory model that under-predicts
    turns a plan that "fits" into an out-of-memory crash."""
    if device.type != "cuda":
        return
    mine = torch.tensor([float(torch.cuda.max_memory_allocated(device))], device=device)
    every = [torch.zeros_like(mine) for _ in range(WORLD)]
    dist.all_gather(every, mine)
    if rank == 0:
        print("peak memory bytes per rank: " + " ".join(str(int(x.item())) for x in every), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps to run (default 3)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (gloo) or cuda (NCCL, one GPU per local rank)")
    parser.add_argument("--verify", action="store_true",
                        help="compare the first step's loss and gradients with one device")
    parser.add_argument("--save", metavar="DIR", default=None,
                        help="save a checkpoint to DIR/step-N at the end (and every --save-every steps)")
    parser.add_argument("--save-every", type=int, default=0, metavar="N", help="also save every N steps")
    parser.add_argument("--load", metavar="DIR", default=None,
                        help="resume from a checkpoint (DIR/latest or a step directory), saved by any plan")
    parser.add_argument("--timings", action="store_true",
                        help="print each rank's compute, communication and idle seconds per step")
    parser.add_argument("--tf32", choices=("on", "off"), default="on" if ALLOW_TF32 else "off",
                        help="float32 products on TF32 units (CUDA; default from the plan's cluster file: "
                             f"{'on' if ALLOW_TF32 else 'off'})")
    args = parser.parse_args(argv)
    if args.load and args.verify:
        parser.error("--verify compares with the initial weights; it cannot follow --load")
    if "STAGES" in globals() and (args.save or args.load):
        parser.error("--save/--load: checkpoints of pipelined programs are not supported yet")
    if args.verify and globals().get("PIPELINE_DROPOUT"):
        parser.error("--verify: this pipelined program's model uses dropout, whose masks per micro-batch the "
                     "one-device reference cannot replay; verify with dropout 0")

    if "WORLD_SIZE" not in os.environ and WORLD == 1:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29517"))
    world = os.environ.get("WORLD_SIZE")
    if world is None or int(world) != WORLD:
        print(f"this program runs on {WORLD} ranks: {' ; '.join(launch_lines())} "
              f"(WORLD_SIZE is {world or 'not set'})", file=sys.stderr)
        return 2
    problem = node_mismatch()
    if problem is not None:
        print(f"this program's launch does not match its plan: {problem}", file=sys.stderr)
        return 2
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
        # The plan priced float32 products at the TF32 peak exactly when ALLOW_TF32; --verify's
        # reference runs in this process, so it computes with the same setting.
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        C.keep_freed_memory()     # large CPU tensors reuse freed memory instead of faulting pages in
        dist.init_process_group("gloo")

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    try:
        trainer = make_trainer(device)
        optimizer = make_optimizer(list(trainer.params.values()))
        batch = tuple(_call_with(M.inputs, trainer.kwargs))
        ok, times = True, []
        first = 0
        if args.load:
            try:
                first = load_checkpoint(args.load, trainer, optimizer)
            except _checkpoints().CheckpointError as exc:
                if trainer.rank == 0:
                    print(f"program.py: --load: {exc}", file=sys.stderr, flush=True)
                return 2
            if trainer.rank == 0:
                print(f"resumed from {args.load} at step {first}", flush=True)
        clock = _load("hapc_timings", "hapc_timings.py").StepClock() if args.timings else None
        if clock is not None:
            clock.install()
        for i in range(first, first + args.steps):
            synchronize()
            if clock is not None:
                clock.start()
            start = time.perf_counter()
            loss = trainer.step(batch)
            synchronize()
            seconds = time.perf_counter() - start
            if args.verify and i == first:
                ok = verify(trainer, loss, batch)
            synchronize()
            start = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            synchronize()
            seconds += time.perf_counter() - start
            times.append(seconds)
            if trainer.rank == 0:
                print(f"step {i + 1} loss {loss.item():.6f} time {seconds:.6f}", flush=True)
            if clock is not None:
                for line in _load("hapc_timings", "hapc_timings.py").report(i + 1, *clock.stop(), device):
                    print(line, flush=True)
            if args.save and (i + 1 == first + args.steps or (args.save_every and (i + 1) % args.save_every == 0)):
                saved = save_checkpoint(args.save, trainer, optimizer, data_position=i + 1)
                if trainer.rank == 0:
                    print(f"saved {saved}", flush=True)
        if clock is not None:
            clock.uninstall()                     # main() may run inside a longer-lived process
        if trainer.rank == 0 and len(times) > 1:
            print(f"median step time {statistics.median(times[1:]):.6f} s over steps "
                  f"{first + 2}..{first + len(times)}", flush=True)
        report_peak_memory(trainer.rank, device)
        if WORLD > 1:
            # No rank tears its connections down while a peer may still be finishing the last
            # step's collectives: gloo aborts a process whose socket closes under a pending op.
            dist.barrier()
        return 0 if ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    status = main()
    # No interpreter finalisation: gloo's worker may still be freeing the last barrier's work,
    # which takes the GIL; during finalisation that thread is force-exited and C++ aborts the
    # rank (SIGABRT in ~1 of 18 runs, after training). main() closed its files; flush the rest.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
