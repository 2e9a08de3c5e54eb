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


def forward(rt: Rank, v: dict[str, torch.Tensor]) -> torch.Tensor:
    raise NotImplementedError
# ==== generated: tables and forward (end) ====

M = _load("hapc_user_model", MODEL_FILE)                  # the user's model file


class Rank:
    """What one rank knows: its index, the collectives, and the tables looked up by rank.

    Every rank runs the same ``forward``; whatever differs between ranks (piece lengths and
    offsets, which rank keeps a replicated loss) is read from the tables here.
    """

    def __init__(self, comm: Any, device: torch.device, seed: int = SEED) -> None:
        self.comm = comm
        self.rank = comm.rank
        self.device = device
        self.seed = seed
        self.tied: list[torch.Tensor] = []      # differentiable collective results of this step

    # -- this rank's piece of a sharded value
    def piece_info(self, name: str):
        """ShardInfo of this rank's piece of ``name``, or None when it is not sharded."""
        if name not in SHARDS:
            return None
        dim, lengths = SHARDS[name]
        return L.ShardInfo(dim, sum(lengths[:self.rank]), lengths[self.rank], sum(lengths))

    def piece(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's piece of a source value given whole (parameters, inputs)."""
        info = self.piece_info(name)
        return full if info is None else full.narrow(info.dim, info.offset, info.length)

    def frac(self, name: str) -> float:
        """Local over global length of ``name``'s sharded dimension (for exact uneven means)."""
        info = self.piece_info(name)
        return 1.0 if info is None or info.global_length == 0 else info.length / info.global_length

    def ctx(self, node: str):
        """The RankCtx a local op of ``node`` gets on this rank."""
        op, ins, outs, shapes = LOCAL_CALLS[node]
        return L.RankCtx(self.rank, WORLD, node, op, tuple(self.piece_info(n) for n in ins),
                         tuple(self.piece_info(n) for n in outs), shapes, self.seed)

    def drive(self, result: Any) -> Any:
        """Run a local op that asks for collectives (see hapc_collectives.drive)."""
        return C.drive(self.comm, result, self.tied)

    # -- layout changes (see hapc_collectives.py for each one's backward)
    def slice(self, x: torch.Tensor, out: str) -> torch.Tensor:
        dim, lengths = SHARDS[out]
        return C.shard_slice(self.comm, x, dim, lengths)

    def all_gather(self, x: torch.Tensor, src: str, method: str = "auto") -> torch.Tensor:
        dim, lengths = SHARDS[src]
        return C.all_gather(self.comm, x, dim, lengths, method)

    def reduce_scatter(self, x: torch.Tensor, out: str, method: str = "auto") -> torch.Tensor:
        dim, lengths = SHARDS[out]
        return C.reduce_scatter(self.comm, x, dim, lengths, method)

    def linear_sfb(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, src: str) -> torch.Tensor:
        """Linear whose weight gradient is rebuilt from gathered factors (no all-reduce)."""
        dim, lengths = SHARDS[src]
        return C.linear_sfb(self.comm, x, weight, bias, dim, lengths)

    def all_reduce(self, x: torch.Tensor, method: str = "auto") -> torch.Tensor:
        return C.all_reduce(self.comm, x, method)

    def all_to_all(self, x: torch.Tensor, src: str, out: str, method: str = "auto") -> torch.Tensor:
        (src_dim, src_lengths), (dst_dim, dst_lengths) = SHARDS[src], SHARDS[out]
        return C.all_to_all(self.comm, x, src_dim, src_lengths, dst_dim, dst_lengths, method)

    def pad_partial(self, x: torch.Tensor, src: str) -> torch.Tensor:
        dim, lengths = SHARDS[src]
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
        self.comm = C.Comm(hierarchical=HIERARCHICAL)
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
        self.rt.seed, self.rt.tied = self.seed + self.steps_done, []
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


def make_optimizer(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The model file's ``optimizer(params)`` if it has one, else the plan's default."""
    if callable(getattr(M, "optimizer", None)):
        return M.optimizer(params)
    if OPTIMIZER == "adam":
        return C.fused_optimizer(torch.optim.Adam, params, lr=1e-3)
    if OPTIMIZER == "sgd":
        return C.fused_optimizer(torch.optim.SGD, params, lr=1e-2)
    return C.fused_optimizer(torch.optim.AdamW, params, lr=1e-3)


# Verification tolerance (float32 on both sides): a tensor passes when every element is within
# ATOL + RTOL * (largest reference magnitude of that tensor). Sharded sums add in another order
# than one device does, so errors of a few float32 ulps of the tensor's scale are expected.
VERIFY_RTOL, VERIFY_ATOL = 1e-4, 1e-6


@contextlib.contextmanager
def _program_dropout_masks(step_seed: int):
    """While the single-device reference runs, ``F.dropout`` (what ``nn.Dropout`` calls) drops
    what the program dropped: the k-th call uses the mask of the k-th dropout node, in graph
    order, as the program drew it in the step seeded ``step_seed``. Without this the two sides
    draw different masks and a model with dropout could never verify."""
    nodes = iter([n for n, call in LOCAL_CALLS.items() if call[0] == "aten.dropout.default"])
    original = torch.nn.functional.dropout

    def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        node = next(nodes, None)
        if node is None or not training or p == 0.0:
            return original(x, p, training, inplace)
        keep = L.dropout_keep(node, step_seed, x.shape, p).to(device=x.device, dtype=x.dtype)
        return x * keep / (1.0 - p)

    torch.nn.functional.dropout = dropout
    try:
        yield
    finally:
        torch.nn.functional.dropout = original


def verify(trainer: Trainer, loss: torch.Tensor, batch: Sequence[torch.Tensor]) -> bool:
    """Compare the first step's loss and gradients with the user's module on one device."""
    grads = trainer.full_grads()                         # collective: every rank takes part
    verdict = torch.zeros(2, dtype=torch.float64, device=trainer.device)   # NCCL wants it on the GPU
    if trainer.rank == 0:
        ref = trainer.module.to(trainer.device)
        ref.zero_grad(set_to_none=True)
        with _program_dropout_masks(trainer.seed):
            ref_loss = ref(*[x.to(trainer.device) for x in batch])
        ref_loss.backward()
        checks = [("loss", loss.reshape(()), ref_loss.detach().reshape(()))]
        for target, g in grads.items():
            p = ref.get_parameter(target)
            checks.append((f"gradient of {target}", g, p.grad if p.grad is not None else torch.zeros_like(p)))
        worst, failed = 0.0, None
        for what, got, want in checks:
            err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
            scale = want.abs().max().item() if want.numel() else 0.0
            worst = max(worst, err)
            if failed is None and not err <= VERIFY_ATOL + VERIFY_RTOL * scale:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps to run (default 3)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (gloo) or cuda (NCCL, one GPU per local rank)")
    parser.add_argument("--verify", action="store_true",
                        help="compare the first step's loss and gradients with one device")
    args = parser.parse_args(argv)

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
        torch.backends.cuda.matmul.allow_tf32 = False     # float32 as one device computes it
        torch.backends.cudnn.allow_tf32 = False
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        C.keep_freed_memory()     # large CPU tensors reuse freed memory instead of faulting pages in
        dist.init_process_group("gloo")

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    try:
        trainer = Trainer(device)
        optimizer = make_optimizer(list(trainer.params.values()))
        batch = tuple(_call_with(M.inputs, trainer.kwargs))
        ok, times = True, []
        for i in range(args.steps):
            synchronize()
            start = time.perf_counter()
            loss = trainer.step(batch)
            synchronize()
            seconds = time.perf_counter() - start
            if args.verify and i == 0:
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
        if trainer.rank == 0 and len(times) > 1:
            print(f"median step time {statistics.median(times[1:]):.6f} s over steps 2..{len(times)}", flush=True)
        return 0 if ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
