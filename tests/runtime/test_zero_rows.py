"""ZeRO in the runtime (hapc/runtime/zero.py) on real gloo ranks (slow).

Owned rows (ZeRO-1/2): after every step each replica equals what one process computes with
AdamW on the whole parameters and the summed gradients, for uneven rows, bucket boundaries
inside the parameter list, one backward with hooks and two accumulated backwards; whole
gradients gather back for --verify. Gathered weights (ZeRO-3): with the saved-tensor hooks a
gathered weight is freed after forward and gathered again in backward, in fp32 and under bf16
autocast, with the same gradients to the bit.

Run directly under torchrun, this file is the worker (see ``_worker``)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch

if __name__ != "__main__":
    from tests.runs import torchrun

pytestmark = pytest.mark.slow

SHAPES = [(7, 5), (9,), (11, 3), (4, 2, 3)]
ROWS = {3: [[3, 2, 2], [2, 4, 3], [5, 3, 3], [1, 1, 2]]}


def _loss(params: list[torch.Tensor], rank: int, micro: int) -> torch.Tensor:
    """A different loss on each rank and micro-batch: the summed gradient is the reference's."""
    return sum(((p * (rank + 1 + micro)).sin() * (i + 1)).sum() for i, p in enumerate(params))


def _worker() -> int:
    import torch.distributed as dist

    from hapc.runtime import collectives as C
    from hapc.runtime import zero as Z

    dist.init_process_group("gloo")
    comm = C.Comm()
    rank, world = comm.rank, comm.world
    failures: list[str] = []
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    for overlap, micro in ((True, 1), (False, 2)):
        params = [w.clone().requires_grad_() for w in start]
        ref = [w.clone().requires_grad_() for w in start]
        shards = Z.StateShards(comm, params[::-1], ROWS[world][::-1], overlap=overlap, bucket_bytes=8 * 40)
        assert len(shards.buckets) > 1
        opt = torch.optim.AdamW([shards.stepped(p) for p in params], lr=0.1)
        ref_opt = torch.optim.AdamW(ref, lr=0.1)
        for step in range(3):
            for m in range(micro):
                _loss(params, rank, m + step).backward()
            shards.finish()
            for r in range(world):
                for m in range(micro):
                    _loss(ref, r, m + step).backward()
            whole = [C.gather(comm, shards.owned_grad(p), 0, n) for p, n in zip(params, ROWS[world])]
            for i, (got, want) in enumerate(zip(whole, ref)):
                if not torch.allclose(got, want.grad):
                    failures.append(f"overlap={overlap} step {step}: gradient {i}")
            if any(p.grad is not None for p in params):
                failures.append(f"overlap={overlap}: a whole gradient outlived its bucket")
            opt.step()
            shards.share_updates()
            ref_opt.step()
            opt.zero_grad(set_to_none=True)
            ref_opt.zero_grad(set_to_none=True)
            for i, (got, want) in enumerate(zip(params, ref)):
                if not torch.allclose(got.detach(), want.detach()):
                    failures.append(f"overlap={overlap} step {step}: parameter {i} after the update")
        states = [opt.state[shards.stepped(p)]["exp_avg"].shape[0] for p in params]
        if states != [n[rank] for n in ROWS[world]]:
            failures.append(f"optimizer state rows {states}, owned {[n[rank] for n in ROWS[world]]}")
    failures += _gathered_weights(comm, C, Z)
    print(f"rank {rank}: {'zero ok' if not failures else failures[:6]}", flush=True)
    dist.destroy_process_group()
    return 1 if failures else 0


def _gathered_weights(comm, C, Z) -> list[str]:
    """A layer's weight gathered from row pieces, under the hooks and without: backward gathers
    it again (autograd kept the recipe, not the weight) and the gradients are the same bits;
    under bf16 autocast also when the pieces are cast before the gather (half the bytes)."""
    failures = []
    gen = torch.Generator().manual_seed(1)
    lengths = [3, 1, 2][:comm.world]
    whole = torch.randn(sum(lengths), 5, generator=gen)
    x = torch.randn(4, 5, generator=gen)
    offset = sum(lengths[:comm.rank])
    for cast in (False, True):
        grads, gathered_again = [], []
        for hooked, dtype in ((False, torch.float32), (True, torch.float32)) + (((True, torch.bfloat16),) if cast else ()):
            piece = whole[offset:offset + lengths[comm.rank]].clone().requires_grad_()
            inputs = x.clone().requires_grad_()          # so the layer's backward needs its weight
            keep = Z.GatheredWeights()

            def gather(p, dtype=dtype):
                return C.gather(comm, p.to(dtype), 0, lengths)

            def again(piece=piece, gather=gather):
                gathered_again.append(1)
                return gather(piece.detach())

            if not hooked:
                keep.hooks = contextlib.nullcontext            # autograd keeps the weight
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cast), keep.hooks():
                w = Z.gather_weight(piece, gather, lambda g: C.scatter_sum(comm, g, 0, lengths))
                w = keep.register(w, again)
                y = torch.nn.functional.linear(inputs, w).float().square().sum()
            y.backward()
            keep.clear()
            grads.append((piece.grad, inputs.grad))
        if len(gathered_again) != len(grads) - 1:
            failures.append(f"cast={cast}: gathered again {len(gathered_again)} times, {len(grads) - 1} wanted")
        if not all(torch.equal(a, b) for run in grads[1:] for a, b in zip(grads[0], run)):
            failures.append(f"cast={cast}: other gradients when gathered again (or in bf16)")
        if any(run[0].dtype != torch.float32 for run in grads):
            failures.append(f"cast={cast}: a piece's gradient is not float32")
    return failures


def test_owned_rows_train_like_one_process_on_three_ranks():
    proc = torchrun(Path(__file__).resolve(), 3)
    assert proc.returncode == 0 and proc.stdout.count("zero ok") == 3, proc.stdout[-3000:] + proc.stderr[-3000:]


if __name__ == "__main__":
    sys.exit(_worker())
