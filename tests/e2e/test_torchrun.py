"""Real multi-process runs (slow): emitted programs and the runtime collectives on gloo ranks.

* Every example model at SMALL size: the synthesized plan for the small mixed cluster, emitted
  and run with ``torchrun --nproc_per_node=4 program.py --device cpu --verify``.
* N = 3 and N = 2 on clusters built here with uneven device speeds: a tensor-parallel GPT plan
  whose collectives take turns at the grouped, all-to-all and padded variants, and a ZeRO-3
  ViT plan (parameters stored sharded, gathered before use).
* The collectives themselves, forward and backward, for every variant and dimension with
  uneven and zero-length pieces, on 4 ranks as 2 "nodes" of 2 (so hierarchical forms run).

Run directly under torchrun, this file is the collectives worker (see ``_worker``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch


if __name__ != "__main__":    # the worker (this file under torchrun) needs none of it
    from tests.runs import MODELS, SMALL_MIXED, emit_model, failure_excerpt, plan_for, torchrun, verify_line
else:
    MODELS = []

pytestmark = pytest.mark.slow


def _cpu_cluster(tflops: list[float]) -> dict:
    return {"name": f"cpu{len(tflops)}-uneven", "nodes": [{
        "devices": [{"name": f"cpu{i}", "tflops": t, "memory_GB": 8, "hbm_GBps": 20, "count": 1}
                    for i, t in enumerate(tflops)],
        "intra_link": "loopback"}]}


def _assert_verified(proc) -> float:
    line = verify_line(proc)
    assert line.startswith("verify: ok") and proc.returncode == 0, \
        f"{line} (rc={proc.returncode})\n{failure_excerpt(proc)}"
    print(line)                 # shown with -s: the figures quoted in reports
    return float(line.split("max_abs_err=")[1])


@pytest.mark.parametrize("name", MODELS)
def test_synthesized_plan_verifies_on_four_ranks(name, tmp_path):
    from costmodel.cluster import load_cluster

    cluster = load_cluster(SMALL_MIXED)
    path = emit_model(name, plan_for(name, "synth", cluster), tmp_path, cluster)
    assert _assert_verified(torchrun(path, 4, "--verify", "--steps", "2")) < 1e-4


def test_tensor_parallel_gpt_with_every_collective_variant_on_three_ranks(tmp_path):
    from costmodel.cluster import load_cluster
    from costmodel.transfers import forward_move
    from hapc.ir.program import Redistribute

    cluster = load_cluster(_cpu_cluster([0.3, 0.2, 0.1]))
    program = plan_for("gpt", "megatron-tp", cluster)
    program.shares = (0.5, 0.3, 0.2)     # uneven pieces (Megatron's own shares are even)
    program.invalidate()
    variants = ["grouped", "all_to_all", "padded"]
    moves = [i for i, s in enumerate(program.steps) if isinstance(s, Redistribute)
             and forward_move(program, s) is not None and forward_move(program, s).kind != "local"]
    assert len(moves) >= 3
    for k, i in enumerate(moves):
        program.steps[i] = dataclasses.replace(program.steps[i], method=variants[k % len(variants)])
    path = emit_model("gpt", program, tmp_path)
    text = path.read_text()
    assert "(grouped); backward" in text and "(all_to_all); backward" in text and "(padded); backward" in text
    assert _assert_verified(torchrun(path, 3, "--verify", "--steps", "2")) < 1e-4


def test_zero3_vit_on_two_ranks(tmp_path):
    from costmodel.cluster import load_cluster

    cluster = load_cluster(_cpu_cluster([0.3, 0.1]))
    program = plan_for("vit", "zero3", cluster)
    program.shares = (0.7, 0.3)
    program.invalidate()
    path = emit_model("vit", program, tmp_path)
    assert "rt.all_gather(p_" in path.read_text()
    assert _assert_verified(torchrun(path, 2, "--verify", "--steps", "2")) < 1e-4

    # The same program imported into a user's own loop (the docstring's example) trains as
    # one device does: three AdamW steps, losses equal to float32 precision.
    loop = tmp_path / "my_loop.py"
    loop.write_text(USER_LOOP)
    proc = torchrun(loop, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [float(ln.split()[1]) for ln in proc.stdout.splitlines() if ln.startswith("loss ")]
    from tests.runs import traced_small

    _, model_path, small = traced_small("vit")
    from conftest import load_model_file

    module = load_model_file(model_path)
    torch.manual_seed(0)
    model = module.model(**small)
    batch = module.inputs(**small)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    want = []
    for _ in range(3):
        loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        want.append(loss.item())
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, want)) < 1e-4, (got, want)


USER_LOOP = """
import importlib.util, sys, torch, torch.distributed as dist
spec = importlib.util.spec_from_file_location("program", "program.py")
program = importlib.util.module_from_spec(spec); spec.loader.exec_module(program)
sys.path.insert(0, "."); import vit
dist.init_process_group("gloo")
params, step = program.build("cpu")
opt = torch.optim.AdamW(params.values(), lr=1e-3)
for batch in [vit.inputs(**program.MODEL_KWARGS)] * 3:
    loss = step(batch)
    opt.step(); opt.zero_grad()
    if dist.get_rank() == 0:
        print("loss", loss.item(), flush=True)
dist.destroy_process_group()
"""


def test_collectives_forward_and_backward():
    """4 ranks as 2 nodes of 2, so the hierarchical forms run on real subgroups (the 3-rank
    tensor-parallel run above covers an odd world size)."""
    proc = torchrun(Path(__file__).resolve(), 4, env={"HAPC_RANKS_PER_NODE": "2"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("collectives ok") == 4, proc.stdout


# ---- the worker --------------------------------------------------------------------------------

def _lengths(total: int, world: int) -> list[list[int]]:
    """Uneven piece lengths of ``total``: by shares 5:3:2:..., and with rank 1 holding none."""
    from hapc.ir.shards import largest_remainder

    shares = [5, 3, 2, 2, 1][:world]
    zero = [total - (world - 2)] + [0] + [1] * (world - 2)
    return [largest_remainder(total, shares), zero]


def _offsets(lengths):
    return [sum(lengths[:r]) for r in range(len(lengths))]


def _worker() -> int:
    """Every collective against its definition, forward and backward, in float64."""
    import torch.distributed as dist

    from hapc.runtime import collectives as C

    dist.init_process_group("gloo")
    comm = C.Comm(hierarchical=True)
    rank, p = comm.rank, comm.world
    gen = torch.Generator().manual_seed(0)
    shape = (7, 5, 6)
    X = torch.randn(shape, generator=gen, dtype=torch.float64)           # the same on every rank
    parts = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(p)]   # P pieces
    grads = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(p)]   # per rank
    failures: list[str] = []

    def check(what: str, got, want) -> None:
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-12, atol=1e-12):
            failures.append(what)

    methods = ["padded", "all_to_all", "grouped", "hierarchical"]
    for method in methods:
        for d in range(3):
            for lengths in _lengths(shape[d], p):
                o, n = _offsets(lengths)[rank], lengths[rank]
                tag = f"{method} dim {d} {lengths}"
                x = X.narrow(d, o, n).clone().requires_grad_()
                y = C.all_gather(comm, x, d, lengths, method)
                check(f"all_gather {tag}", y, X)
                y.backward(grads[rank])                     # a Replicate value's grad is Partial
                check(f"all_gather backward {tag}", x.grad, sum(grads).narrow(d, o, n))

                x = parts[rank].clone().requires_grad_()
                y = C.reduce_scatter(comm, x, d, lengths, method)
                check(f"reduce_scatter {tag}", y, sum(parts).narrow(d, o, n))
                pieces = [grads[0].narrow(d, oo, nn) for oo, nn in zip(_offsets(lengths), lengths)]
                y.backward(pieces[rank])
                check(f"reduce_scatter backward {tag}", x.grad, grads[0])
        x = parts[rank].clone().requires_grad_()
        y = C.all_reduce(comm, x, method)
        check(f"all_reduce {method}", y, sum(parts))
        y.backward(grads[rank])
        check(f"all_reduce backward {method}", x.grad, sum(grads))

    for src in range(3):
        for dst in range(3):
            if src == dst:
                continue
            for ls, ld in zip(_lengths(shape[src], p), reversed(_lengths(shape[dst], p))):
                tag = f"{src}->{dst} {ls} {ld}"
                x = X.narrow(src, _offsets(ls)[rank], ls[rank]).clone().requires_grad_()
                y = C.all_to_all(comm, x, src, ls, dst, ld)
                check(f"all_to_all {tag}", y, X.narrow(dst, _offsets(ld)[rank], ld[rank]))
                y.backward(grads[0].narrow(dst, _offsets(ld)[rank], ld[rank]))
                check(f"all_to_all backward {tag}", x.grad, grads[0].narrow(src, _offsets(ls)[rank], ls[rank]))

    lengths = _lengths(7, p)[0]
    o, n = _offsets(lengths)[rank], lengths[rank]
    x = X.clone().requires_grad_()                          # R -> S: a slice, Partial gradient
    y = C.shard_slice(comm, x, 0, lengths)
    check("slice", y, X.narrow(0, o, n))
    y.backward(grads[0].narrow(0, o, n))
    total = x.grad.clone()
    dist.all_reduce(total)
    check("slice backward", total, grads[0])
    x = X.narrow(0, o, n).clone().requires_grad_()          # S -> P: zero padding
    y = C.shard_to_partial(comm, x, 0, lengths)
    total = y.detach().clone()
    dist.all_reduce(total)
    check("pad to partial", total, X)
    y.backward(grads[0])
    check("pad to partial backward", x.grad, grads[0].narrow(0, o, n))
    x = X.clone().requires_grad_()                          # R -> P
    y = C.replicate_to_partial(comm, x)
    total = y.detach().clone()
    dist.all_reduce(total)
    check("replicate to partial", total, X)

    mask = X > 0                                            # booleans and integers travel too
    check("bool all_gather", C.gather(comm, mask.narrow(0, o, n), 0, lengths).double(), mask.double())
    ids = torch.arange(42).view(7, 6)
    got = C.all_to_all(comm, ids.narrow(0, o, n), 0, lengths, 1, _lengths(6, p)[0])
    want = ids.narrow(1, _offsets(_lengths(6, p)[0])[rank], _lengths(6, p)[0][rank])
    check("int64 all_to_all", got.double(), want.double())

    class Request:
        def __init__(self, kind, tensor):
            self.kind, self.tensor = kind, tensor

    def local_op(t):
        s = yield Request("sum", t * 2)
        m = yield Request("max", t.detach() + rank)
        return s, m

    t = parts[rank].clone().requires_grad_()
    kept: list[torch.Tensor] = []
    s, m = C.drive(comm, local_op(t), kept)
    check("drive sum", s.detach(), 2 * sum(parts))
    check("drive max", m, torch.stack([q + r for r, q in enumerate(parts)]).amax(0))
    out = s if rank == 0 else m             # only rank 0 uses the differentiable answer...
    C.tie(out.sum(), kept).backward()       # ...yet every rank joins its backward all-reduce
    check("drive backward", t.grad, torch.full(shape, 2.0, dtype=torch.float64))

    ws = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in [(300, 7), (5,), (1000,)]]
    sync = C.GradSync(comm, ws[::-1], bucket_bytes=8 * 1200, first_bucket_bytes=8 * 100)
    assert len(sync.buckets) == 3
    for step in range(2):
        scale = float(rank + 1 + step)
        sum(w.sum() * scale for w in ws).backward()
        sync.finish()
        want = float(sum(r + 1 + step for r in range(p)))
        for w in ws:
            check(f"grad sync step {step}", w.grad, torch.full_like(w, want))
            w.grad = None

    if failures:
        print(f"rank {rank}: {len(failures)} failures: {failures[:8]}", flush=True)
    else:
        print(f"rank {rank}: collectives ok", flush=True)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(_worker())
