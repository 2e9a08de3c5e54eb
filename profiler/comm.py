"""Collective timings over torch.distributed, in the cost model's own terms.

Each sample is (kind, group size, piece bytes, seconds) where "piece bytes" means exactly
what ``piece_bytes`` means to :func:`costmodel.collectives.collective_seconds`: the whole
tensor for all-reduce and broadcast, each rank's piece for all-gather and reduce-scatter,
what each rank holds before an all-to-all. :mod:`profiler.fit` can then fit the link's
alpha and beta through the very formulas the simulator prices plans with.

The calls are the ones emitted programs make (:mod:`hapc.runtime.collectives`):
``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single``, ``all_reduce``
and ``broadcast``. A collective the backend lacks (older gloo has no reduce-scatter) is
skipped and reported, not faked.

Each timing is the slowest rank's (a max all-reduce of the elapsed times) over a few calls;
the median of the repeats is kept. On CPUs each call comes after about a millisecond of
compute and only the call is timed, because that is how a training step calls them: between
ops, when the backend's threads have gone to sleep; back-to-back calls would measure a hot
pipeline programs never see, and a small collective faster than it runs in training. On GPUs the calls are asynchronous and run back to back.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@dataclass(frozen=True)
class CommSample:
    """One measured collective: ``seconds`` for ``kind`` over ``ranks`` ranks of ``piece_bytes``."""

    link: str            # "intra" (within a node) or "network" (between nodes)
    kind: str
    ranks: int
    piece_bytes: float
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def sizes_bytes(device: torch.device, quick: bool) -> tuple[int, ...]:
    """Message sizes (bytes of the whole tensor) from latency-bound to bandwidth-bound."""
    if device.type == "cuda":
        return (1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 27)
    if quick:
        return (1 << 12, 1 << 16, 1 << 20, 1 << 22)
    return (1 << 12, 1 << 15, 1 << 18, 1 << 21, 1 << 23)


def _call(kind: str, numel: int, p: int, device: torch.device, group, src: int) -> tuple[Callable[[], object], float]:
    """The collective as a no-argument call, and its piece bytes in the cost model's sense."""
    piece = numel // p
    full = torch.ones(piece * p, device=device)
    part = torch.ones(piece, device=device)
    out_full = torch.empty_like(full)
    out_part = torch.empty_like(part)
    if kind == "all_reduce":
        return (lambda: dist.all_reduce(full, group=group)), full.numel() * 4
    if kind == "all_gather":
        return (lambda: dist.all_gather_into_tensor(out_full, part, group=group)), piece * 4
    if kind == "reduce_scatter":
        return (lambda: dist.reduce_scatter_tensor(out_part, full, group=group)), piece * 4
    if kind == "all_to_all":
        return (lambda: dist.all_to_all_single(out_full, full, group=group)), full.numel() * 4
    if kind == "broadcast":
        return (lambda: dist.broadcast(full, src=src, group=group)), full.numel() * 4
    raise ValueError(f"unknown collective {kind!r}")


GAP_SECONDS = 1e-3        # compute between two timed collectives on a CPU (see the module docstring)
_GAP_WORK = torch.ones(64, 64)


def _busy(seconds: float) -> None:
    """Compute for about ``seconds``, as a training step does between two collectives."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(_GAP_WORK, _GAP_WORK)


def measure_collectives(group, group_ranks: Sequence[int], device: torch.device, link: str, *,
                        quick: bool = False, repeats: int = 5,
                        say: Callable[[str], None] = lambda m: None) -> tuple[list[CommSample], dict[str, str]]:
    """Time every kind at every size over ``group`` (``None`` = the whole world).

    Every rank of the group must call this with the same arguments. Returns the samples and,
    per kind that could not run, why.
    """
    p = len(group_ranks)
    src = group_ranks[0]
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    samples: list[CommSample] = []
    skipped: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)     # all_gather_into_tensor's rename in newer torch
        for kind in KINDS:
            say(f"{link} {kind} over {p} ranks")
            for nbytes in sizes_bytes(device, quick):
                fn, piece_bytes = _call(kind, max(p, nbytes // 4 // p * p), p, device, group, src)
                try:
                    fn()
                    sync()
                except (RuntimeError, NotImplementedError, AttributeError) as exc:
                    skipped[kind] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}" if str(exc) else \
                        type(exc).__name__
                    break
                inner = 5 if nbytes <= 1 << 16 else 2
                times = []
                for _ in range(repeats):
                    dist.barrier(group=group)
                    spent = 0.0
                    for _ in range(inner):
                        if device.type == "cpu":
                            _busy(GAP_SECONDS)
                        start = time.perf_counter()
                        fn()
                        sync()
                        spent += time.perf_counter() - start
                    elapsed = torch.tensor([spent / inner], device=device)
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
                    times.append(float(elapsed.item()))
                samples.append(CommSample(link, kind, p, float(piece_bytes), statistics.median(times)))
    return samples, skipped


def measure_overlap(group, device: torch.device, *, nbytes: int = 1 << 23, repeats: int = 3) -> float:
    """The fraction of an asynchronous all-reduce that compute on the same ranks hides.

    Times compute alone (``c``), the all-reduce alone (``m``) and the all-reduce launched
    asynchronously with the same compute running until it is done (``both``): hidden time is
    ``c + m - both``, and the fraction is that over ``min(c, m)`` (1: free overlap, as NCCL
    with its own engines; 0: none, as gloo reducing on the cores that compute). Each time is
    the slowest rank's, the median over ``repeats``. Every rank of ``group`` must call it.
    """
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    size = 2048 if device.type == "cuda" else 256
    a = torch.randn(size, size, device=device)
    buf = torch.ones(nbytes // 4, device=device)

    def compute(calls: int) -> None:
        for _ in range(calls):
            torch.mm(a, a)

    def slowest(fn: Callable[[], None]) -> float:
        dist.barrier(group=group)
        sync()
        start = time.perf_counter()
        fn()
        sync()
        took = torch.tensor([time.perf_counter() - start], device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
        return float(took.item())

    def comm() -> None:
        dist.all_reduce(buf, group=group)

    comm()
    m = statistics.median(slowest(comm) for _ in range(repeats))
    per_call = slowest(lambda: compute(8)) / 8
    calls = max(1, round(m / max(per_call, 1e-9)))          # compute about as long as the all-reduce
    c = statistics.median(slowest(lambda: compute(calls)) for _ in range(repeats))

    def both() -> None:
        work = dist.all_reduce(buf, group=group, async_op=True)
        compute(calls)
        work.wait()

    b = statistics.median(slowest(both) for _ in range(repeats))
    return float(min(1.0, max(0.0, (c + m - b) / min(c, m))))
