"""The second half of every emitted program: what it does when run as a script.

:mod:`hapc.codegen.skeleton` is the first half (the loader, the plan's tables, ``Rank``,
``Trainer`` and ``build``: what a caller that imports the program uses); this half holds
``--verify`` against the model on one device, the launch checks, ``--save``/``--load`` and
``main``. The emitter appends the text after the ``continued`` marker below to the first half,
so the lines above it (this docstring and the imports) only let the file be linted on its own:
the program itself imports these names at its top.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hapc.codegen.skeleton import (
    ALLOW_TF32,
    BUFFERS,
    C,
    M,
    MODEL_FILE,
    NODE_SIZES,
    PARAMS,
    PRECISION,
    TRACED_FOR,
    WORLD,
    R,
    Trainer,
    _call_with,
    _load,
    autocast,
    constants_problem,
    make_optimizer,
    make_trainer,
)

# ==== skeleton, continued ====


# Verification tolerance: a tensor passes when every element is within ATOL + RTOL * (largest
# reference magnitude of that tensor). Sharded sums add in another order than one device does,
# so in float32 errors of a few ulps of the tensor's scale are expected. Under bf16 autocast
# every product rounds to 8 mantissa bits (2**-9 relative) on both sides and the partial sums
# of shards round separately, so a few percent of the scale is the bf16 counterpart; a wrong
# program is off by the scale itself. fp16 rounds to 11 bits (2**-12 relative, 8x finer than
# bf16) and, loss-scaled on both sides alike, underflows no more than the reference: a percent.
VERIFY_RTOL, VERIFY_ATOL = 1e-4, 1e-6
VERIFY_BF16_RTOL, VERIFY_BF16_ATOL = 5e-2, 1e-4
VERIFY_FP16_RTOL, VERIFY_FP16_ATOL = 1e-2, 1e-5


def verify_tolerance() -> tuple[float, float]:
    """(rtol, atol) for this program's precision."""
    return {"bf16": (VERIFY_BF16_RTOL, VERIFY_BF16_ATOL),
            "fp16": (VERIFY_FP16_RTOL, VERIFY_FP16_ATOL)}.get(PRECISION, (VERIFY_RTOL, VERIFY_ATOL))


@contextlib.contextmanager
def _program_dropout_masks(step_seed: int, ran: Sequence[tuple[str, str]], replay: Any):
    """While the single-device reference runs, ``F.dropout`` (what ``nn.Dropout`` calls) drops
    what the program dropped: the k-th call uses the mask of the k-th dropout node the program
    ran (``ran``: Rank.ran of the step seeded ``step_seed``). Without this the two sides draw
    different masks and a model with dropout could never verify. Other random ops are replayed
    by ``replay`` (hapc_random_ops.ReplayDraws), kept out of the dropouts' own draws here."""
    nodes = iter([n for op, n in ran if op == "aten.dropout.default"])
    original = torch.nn.functional.dropout

    def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        with replay.paused():
            return _dropout(x, p, training, inplace)

    def _dropout(x: torch.Tensor, p: float, training: bool, inplace: bool) -> torch.Tensor:
        node = next(nodes, None)
        if node is None or not training or p == 0.0 or p >= 1.0:
            return original(x, p, training, inplace)
        if WORLD == 1:                               # the program ran torch's kernel under this seed
            with R.seeded_rng(node, step_seed, x.device):
                return original(x, p, training, inplace)
        keep = R.dropout_keep(node, step_seed, x.shape, p, device=x.device).to(x.dtype)
        return x * keep / (1.0 - p)

    # Attention dropout likewise: the k-th scaled_dot_product_attention call with dropout_p > 0
    # replays the k-th attention node's mask (several ranks: the shared counter-based mask on
    # attention written out; one rank: torch's kernel under the node's seed).
    attention_nodes = iter([n for op, n in ran if op == "aten.scaled_dot_product_attention.default"])
    original_sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        with replay.paused():
            return _sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def _sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        node = next(attention_nodes, None) if dropout_p > 0.0 else None
        if node is None:
            return original_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if WORLD == 1:
            with R.seeded_rng(node, step_seed, q.device):
                return original_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        keep = R.dropout_keep(node, step_seed, (*q.shape[:-1], k.shape[-2]), dropout_p, device=q.device)
        return R.attention_with_dropout(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, keep)

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
        # The reference draws what the program drew: dropout masks, and every other random op's
        # values (the k-th random op called replays the k-th random node the program ran).
        ran = getattr(trainer, "random_nodes", None) or trainer.rt.ran      # a pipeline's: each node once
        replay = R.ReplayDraws(trainer.seed, ran)
        with _program_dropout_masks(trainer.seed, ran, replay), replay, autocast(trainer.device):
            ref_loss = ref(*[x.to(trainer.device) for x in batch])
        loss_scale = trainer.verdict.scale               # fp16: the loss scale the step used (else 1)
        (ref_loss * loss_scale if loss_scale != 1.0 else ref_loss).backward()
        ref_grads = {t: (p.grad if p.grad is not None else torch.zeros_like(p)) / loss_scale
                     for t, p in ((t, ref.get_parameter(t)) for t in grads)}
        checks = [("loss", loss.reshape(()), ref_loss.detach().reshape(()))]
        for target, g in grads.items():
            checks.append((f"gradient of {target}", g, ref_grads[target]))
        worst, failed = 0.0, None
        rtol, atol = verify_tolerance()
        against = {"bf16": "one device under the same bf16 autocast",
                   "fp16": f"one device under the same fp16 autocast and loss scale {loss_scale:g}"}.get(
                       PRECISION, "one device in float32")
        print(f"verify tolerance: {PRECISION} ({against}), "
              f"atol {atol:g} + rtol {rtol:g} x each tensor's largest magnitude", flush=True)
        if trainer.verdict.skipped:           # the step overflowed: so must the reference
            checks = checks[:1]
            if all(torch.isfinite(g).all() for g in ref_grads.values()):
                failed = "gradients: the program skipped the step (inf/nan), the reference's are finite"
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
        if name not in trainer.sources:          # a pipeline stage holds its layers' only
            continue
        local, info = trainer.sources[name], trainer.rt.piece_info(name)
        offsets, shape = [0] * local.dim(), list(local.shape)
        if info is not None:
            offsets[info.dim], shape[info.dim] = info.offset, info.global_length
        out[target] = K.Held(local, tuple(offsets), tuple(shape))
    return out


def stepped_placements(trainer: Trainer) -> dict[str, Any]:
    """Where the tensors the optimizer steps sit in their parameters, for those that are not the
    rank's whole piece: under ZeRO the owned rows, so the moments are saved as those rows."""
    K = _checkpoints()
    out = {}
    for target, tensor in trainer.stepped.items():
        first = trainer.zero.first_row(trainer.params[target])
        if first is not None:
            whole = tuple(trainer.params[target].shape)
            out[target] = K.Held(tensor, (first,) + (0,) * (len(whole) - 1), whole)
    return out


def save_checkpoint(directory: str, trainer: Trainer, optimizer: torch.optim.Optimizer,
                    data_position: int) -> Path:
    """Save parameters, buffers, optimizer state, step and data position (every rank calls it)."""
    K = _checkpoints()
    scaler = trainer.scaler.state_dict() if trainer.scaler.enabled else {"scale": 0.0, "growth_tracker": 0}
    return K.save(directory, checkpoint_tensors(trainer), trainer.module, optimizer, trainer.stepped,
                  K.Progress(trainer.steps_done, data_position, scaler["scale"], scaler["growth_tracker"]),
                  model_file=MODEL_FILE, model_kwargs=trainer.kwargs, world=WORLD, others=held_elsewhere(trainer),
                  stepped=stepped_placements(trainer))


def held_elsewhere(trainer: Trainer) -> frozenset[str]:
    """Attributes other ranks hold and this one does not: other pipeline stages' layers (none in
    a one-stage program, where every rank holds every parameter, whole or in part)."""
    stages = globals().get("STAGES")         # a pipelined program's tables
    if stages is None:
        return frozenset()
    names = {n for st in stages for n in (*st["params"], *st["buffers"])}
    return frozenset(target for name, target in (*PARAMS.items(), *BUFFERS.items())
                     if name in names and name not in trainer.sources)


def prune_checkpoints(root: str, keep: int) -> None:
    """Remove all but the newest ``keep`` step directories under ``root``; never the one
    ``latest`` names (rank 0, after a complete save)."""
    latest = Path(root) / "latest"
    current = latest.read_text().strip() if latest.is_file() else None
    steps = sorted(p for p in Path(root).glob("step-*") if p.is_dir())
    for old in steps[:-keep]:
        if old.name != current:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(directory: str, trainer: Trainer, optimizer: torch.optim.Optimizer) -> int:
    """Load a checkpoint saved by any plan of this model; returns the data position."""
    K = _checkpoints()
    progress = K.load(directory, checkpoint_tensors(trainer), trainer.module, optimizer, trainer.stepped,
                      held_elsewhere(trainer), stepped_placements(trainer))
    trainer.steps_done = progress.step        # dropout masks and step numbers continue
    trainer.scaler.load_state_dict({"scale": progress.loss_scale, "growth_tracker": progress.scale_growth_tracker})
    return progress.data_position


def report_peak_memory(rank: int, device: torch.device, meter: Any = None) -> None:
    """On GPUs, rank 0 prints every rank's torch.cuda.max_memory_allocated (bytes, in rank
    order), to hold against the plan's predicted peak: a memory model that under-predicts
    turns a plan that "fits" into an out-of-memory crash. On CPU with --measure-memory, each
    rank's peak tensor bytes as ``meter`` (hapc_memory.LiveBytes) counted them."""
    if device.type != "cuda" and meter is None:
        return
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else meter.peak
    mine = torch.tensor([float(peak)], device=device)
    every = [torch.zeros_like(mine) for _ in range(WORLD)]
    dist.all_gather(every, mine)
    if rank == 0:
        print("peak memory bytes per rank: " + " ".join(str(int(x.item())) for x in every), flush=True)


class StepWatchdog:
    """Ends this rank, with one line, when a step has run for 1.5x ``seconds``: the backstop
    for a wait the process group's timeout (``seconds``, which fires first inside a collective)
    does not cover, such as a device that hangs. Disarmed around work whose length does not
    scale with a step (loading, --verify's one-device reference, saving); the process group's
    timeout covers a collective that waits inside those."""

    def __init__(self, seconds: float, rank: int) -> None:
        self.seconds, self.rank = 1.5 * seconds, rank
        self.last, self.armed, self.step = time.monotonic(), False, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hapc-step-watchdog", daemon=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def beat(self, step: int | None = None, *, armed: bool = True) -> None:
        self.last, self.armed = time.monotonic(), armed
        if step is not None:
            self.step = step

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(5.0, self.seconds / 4)):
            if self.armed and time.monotonic() - self.last > self.seconds:
                print(f"rank {self.rank}: step {self.step + 1} made no progress for {self.seconds:g} s (1.5x --timeout): "
                      "a peer rank stopped answering; ending this rank", file=sys.stderr, flush=True)
                os._exit(1)


def _peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because a peer left or stopped answering
    (gloo's and NCCL's wordings: "Connection reset by peer", "Timed out waiting ...ms for recv",
    "Application timeout caused pair closure", DistBackendError)."""
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, RuntimeError) and any(k in text for k in (
        "distbackenderror", "connection reset", "connection closed", "broken pipe", "timed out", "timeout",
        "pair closure", "nccl", "gloo", "peer"))


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
    parser.add_argument("--keep", type=int, default=0, metavar="N",
                        help="with --save: keep only the newest N steps (default: all)")
    parser.add_argument("--load", metavar="DIR", default=None,
                        help="resume from a checkpoint (DIR/latest or a step directory), saved by any plan")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help="end every rank when a step or a collective waits this long for a peer (default 300)")
    parser.add_argument("--timings", action="store_true",
                        help="print each rank's compute, communication and idle seconds per step")
    parser.add_argument("--measure-memory", action="store_true",
                        help="CPU: count each rank's peak tensor bytes (slower); rank 0 prints them per rank, "
                             "as it always does on GPUs")
    parser.add_argument("--tf32", choices=("on", "off"), default="on" if ALLOW_TF32 else "off",
                        help="float32 products on TF32 units (CUDA; default from the plan's cluster file: "
                             f"{'on' if ALLOW_TF32 else 'off'})")
    args = parser.parse_args(argv)
    if args.keep < 0 or (args.keep and not args.save):
        parser.error(f"--keep {args.keep}: expected a positive number of steps to keep, with --save DIR")
    if args.timeout <= 0:
        parser.error(f"--timeout {args.timeout:g}: expected a positive number of seconds")
    if args.load and args.verify:
        parser.error("--verify compares with the initial weights; it cannot follow --load")

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
    problem = constants_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
        # The plan priced float32 products at the TF32 peak exactly when ALLOW_TF32; --verify's
        # reference runs in this process, so it computes with the same setting.
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
        dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=args.timeout))
    else:
        device = torch.device("cpu")
        C.keep_freed_memory()     # large CPU tensors reuse freed memory instead of faulting pages in
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    watchdog = StepWatchdog(args.timeout, dist.get_rank())
    if dist.get_rank() == 0:
        print(f"timeout {args.timeout:g} s: a rank that waits longer for a peer ends the job (--timeout)",
              flush=True)
        if device.type != TRACED_FOR:
            print(f"note: this plan's model was traced for {TRACED_FOR}, and runs on {device.type}: model code "
                  f"that branches on the device keeps its {TRACED_FOR} branch here (--verify compares with "
                  f"the model on {device.type})", flush=True)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    try:
        trainer = make_trainer(device)
        optimizer = make_optimizer(list(trainer.stepped.values()))
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
        meter = None
        if args.measure_memory and device.type == "cpu":     # this rank's pieces, then what the steps make
            meter = _load("hapc_memory", "hapc_memory.py").LiveBytes()
            meter.add(trainer.sources.values())
        measured = meter if meter is not None else contextlib.nullcontext()
        clock = _load("hapc_timings", "hapc_timings.py").StepClock() if args.timings else None
        if clock is not None:
            clock.install()
        watchdog.start()
        for i in range(first, first + args.steps):
            watchdog.beat(i)
            synchronize()
            if clock is not None:
                clock.start()
            start = time.perf_counter()
            with measured:
                loss = trainer.step(batch)
            synchronize()
            seconds = time.perf_counter() - start
            if args.verify and i == first:
                watchdog.beat(armed=False)            # the one-device reference: not a step's length
                ok = verify(trainer, loss, batch)
                watchdog.beat(i)
            synchronize()
            start = time.perf_counter()
            verdict = trainer.verdict               # fp16: agreed by every rank (hapc_loss_scale.py)
            with measured:
                if not verdict.skipped:
                    optimizer.step()
                    trainer.share_updates()         # ZeRO: every rank's updated rows to all
                optimizer.zero_grad(set_to_none=True)
            synchronize()
            seconds += time.perf_counter() - start
            times.append(seconds)
            if trainer.rank == 0:
                if verdict.skipped:
                    print(verdict.message(i + 1), flush=True)
                print(f"step {i + 1} loss {loss.item():.6f} time {seconds:.6f}", flush=True)
            if clock is not None:
                for line in _load("hapc_timings", "hapc_timings.py").report(i + 1, *clock.stop(), device):
                    print(line, flush=True)
            if args.save and (i + 1 == first + args.steps or (args.save_every and (i + 1) % args.save_every == 0)):
                watchdog.beat(armed=False)            # a save's length is the disk's
                try:
                    saved = save_checkpoint(args.save, trainer, optimizer, data_position=i + 1)
                except Exception as exc:              # a full disk, a folder it cannot write
                    if _peer_failure(exc):
                        raise
                    if trainer.rank == 0:
                        latest = Path(args.save) / "latest"
                        kept = latest.read_text().strip() if latest.is_file() else "none"
                        print(f"program.py: --save {args.save}: the checkpoint of step {i + 1} could not be written "
                              f"({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}); "
                              f"the latest complete one is still {kept}", file=sys.stderr, flush=True)
                    return 1
                if trainer.rank == 0:
                    print(f"saved {saved}", flush=True)
                    if args.keep:
                        prune_checkpoints(args.save, args.keep)
        watchdog.beat(armed=False)
        if clock is not None:
            clock.uninstall()                     # main() may run inside a longer-lived process
        if trainer.rank == 0 and len(times) > 1:
            print(f"median step time {statistics.median(times[1:]):.6f} s over steps "
                  f"{first + 2}..{first + len(times)}", flush=True)
        report_peak_memory(trainer.rank, device, meter)
        if WORLD > 1:
            # No rank tears its connections down while a peer may still be finishing the last
            # step's collectives: gloo aborts a process whose socket closes under a pending op.
            dist.barrier()
        return 0 if ok else 1
    except RuntimeError as exc:
        if not _peer_failure(exc):
            raise
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        print(f"rank {dist.get_rank()}: step {watchdog.step + 1}: a collective failed: a peer rank stopped answering "
              f"or left ({first_line})", file=sys.stderr, flush=True)
        return 1
    finally:
        watchdog.stop()
        dist.destroy_process_group()


if __name__ == "__main__":
    status = main()
    # No interpreter finalisation: gloo's worker may still be freeing the last barrier's work,
    # which takes the GIL; during finalisation that thread is force-exited and C++ aborts the
    # rank (SIGABRT in ~1 of 18 runs, after training). main() closed its files; flush the rest.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
