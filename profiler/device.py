"""What one device does per second: matmul throughput per dtype, memory bandwidth, op overhead.

These are the numbers a cluster file carries for a custom device (``tflops`` per dtype,
``hbm_GBps``, ``memory_GB``) and the cluster-wide ``launch_latency_us``, measured the way
the cost model uses them (:mod:`costmodel.compute`):

* **peak FLOPS per dtype**: the best throughput of square matmuls over a few sizes, the
  "peak" that op-class efficiencies are fractions of. A dtype the device cannot multiply
  (an error) is left out, and the cluster file then falls back to the fp32 peak; a dtype it
  multiplies slowly (bf16 on a CPU without bf16 instructions) is written as slow as it is.
* **memory bandwidth**: a large copy, counting the bytes read and written, which is what
  :func:`costmodel.compute.roofline_seconds` divides a node's bytes by;
* **launch latency**: a chain of tiny differentiable ops, forward and backward, per op and
  per direction: the cost model charges one launch per forward and one per backward kernel,
  so the fixed cost that training pays per op (dispatch, autograd bookkeeping) is measured
  in the same unit.

Sizes grow until one call takes long enough to be measured well, and stop early for slow
dtypes, so the whole measurement takes a few seconds on a CPU core.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from profiler.timing import relative_spread, window_samples, window_seconds

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}


@dataclass
class DeviceNumbers:
    """Measured capabilities of one device (one rank), in base units."""

    name: str
    peak_flops: dict[str, float]          # dtype -> flop/s (fp32 always; tf32/bf16/fp16 where measured)
    memory_bytes: int
    hbm_bandwidth_Bps: float
    launch_seconds: float
    skipped: dict[str, str] = field(default_factory=dict)   # dtype -> why it was not measured
    # Half the range of the fp32 peak over the timing windows, relative: devices whose peaks
    # differ by less than their spreads are one kind of device (see profiler.clusterfile).
    flops_spread: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> DeviceNumbers:
        return DeviceNumbers(**d)


@dataclass(frozen=True)
class BenchSizes:
    """How big and how long: ``quick`` trades accuracy for seconds."""

    matmul_sizes: tuple[int, ...]
    copy_bytes: int
    window_seconds: float          # one timing window (see profiler.timing.window_seconds)
    repeats: int

    @staticmethod
    def for_mode(device: torch.device, quick: bool) -> BenchSizes:
        if device.type == "cuda":
            return BenchSizes((1024, 2048, 4096, 8192), 1 << 30, 0.05, 5)
        if quick:
            return BenchSizes((128, 256, 512), 1 << 25, 0.1, 3)
        return BenchSizes((128, 256, 512, 1024), 1 << 26, 0.2, 3)


def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).replace("NVIDIA ", "").replace(" ", "-")
    return "cpu"


def device_memory_bytes(device: torch.device, ranks_on_host: int) -> int:
    """A GPU's own memory, or this host's RAM split evenly between its CPU ranks."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = 16 * 10**9
    return int(total // max(1, ranks_on_host))


def dtypes_to_measure(device: torch.device) -> tuple[list[str], dict[str, str]]:
    """The dtypes worth a matmul benchmark on this device, and why others are skipped."""
    skipped: dict[str, str] = {}
    dtypes = ["fp32"]
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        if major >= 8:
            dtypes.append("tf32")
        else:
            skipped["tf32"] = "no TF32 units before Ampere"
        if torch.cuda.is_bf16_supported():
            dtypes.append("bf16")
        else:
            skipped["bf16"] = "not supported by this GPU"
        dtypes.append("fp16")
    else:
        skipped["tf32"] = "TF32 exists only on GPUs"
        dtypes += ["bf16", "fp16"]
    return dtypes, skipped


def matmul_flops(device: torch.device, dtype: str, sizes: BenchSizes) -> float:
    """Best flop/s of ``n x n @ n x n`` over the sizes (see :func:`matmul_flops_spread`)."""
    return matmul_flops_spread(device, dtype, sizes)[0]


def matmul_flops_spread(device: torch.device, dtype: str, sizes: BenchSizes) -> tuple[float, float]:
    """Best flop/s of ``n x n @ n x n`` over the sizes, and the relative spread of that size's
    timing windows.

    On a CPU, half precision without hardware support runs about 50x slower than fp32, so
    those dtypes get only the two smallest sizes (the number of sizes is decided by the
    device, never by a timing, so that ranks measuring together stay in step).
    """
    sync = synchronizer(device)
    tdtype = _TORCH_DTYPES[dtype]
    best, spread = 0.0, 0.0
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        ns = sizes.matmul_sizes if device.type == "cuda" or dtype == "fp32" else sizes.matmul_sizes[:2]
        for n in ns:
            gen = torch.Generator(device="cpu").manual_seed(n)
            a = torch.randn(n, n, generator=gen).to(device=device, dtype=tdtype)
            b = torch.randn(n, n, generator=gen).to(device=device, dtype=tdtype)
            def product(a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
                return a @ b

            samples = window_samples(product, window_seconds=sizes.window_seconds, repeats=sizes.repeats, sync=sync)
            flops = 2.0 * n**3 / statistics.median(samples)
            if flops > best:
                best, spread = flops, relative_spread(samples)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    return best, spread


def copy_bandwidth_Bps(device: torch.device, sizes: BenchSizes) -> float:
    """Bytes read plus bytes written per second by a large ``copy_``."""
    sync = synchronizer(device)
    src = torch.ones(sizes.copy_bytes // 4, device=device)
    dst = torch.empty_like(src)
    seconds = window_seconds(lambda: dst.copy_(src), window_seconds=sizes.window_seconds, repeats=sizes.repeats,
                             sync=sync)
    return 2.0 * src.numel() * 4 / seconds


def launch_seconds(device: torch.device, sizes: BenchSizes, chain: int = 50) -> float:
    """Fixed seconds per op and direction: a chain of tiny ops, forward and backward."""
    sync = synchronizer(device)
    x = torch.ones(1, device=device, requires_grad=True)

    def work() -> None:
        y = x
        for _ in range(chain):
            y = y * 1.0001
        (_g,) = torch.autograd.grad(y, (x,))

    return window_seconds(work, window_seconds=sizes.window_seconds, repeats=sizes.repeats, sync=sync) / (2 * chain)


def measure_device(device: torch.device, *, quick: bool = False, ranks_on_host: int = 1,
                   between: Callable[[], None] = lambda: None,
                   say: Callable[[str], None] = lambda m: None) -> DeviceNumbers:
    """All numbers of one device.

    ``between`` (a barrier) runs before each benchmark, the same number of times on every
    rank whatever it measures, so that ranks sharing a core measure together and each sees
    the share of the core it will have in training.
    """
    sizes = BenchSizes.for_mode(device, quick)
    dtypes, skipped = dtypes_to_measure(device)
    peaks: dict[str, float] = {}
    spread = 0.0
    for dt in ("fp32", "tf32", "bf16", "fp16"):
        between()
        if dt not in dtypes:
            continue
        say(f"matmul {dt}")
        try:
            peaks[dt], dt_spread = matmul_flops_spread(device, dt, sizes)
            spread = dt_spread if dt == "fp32" else spread
        except RuntimeError as exc:      # no kernel for this dtype on this device
            skipped[dt] = f"matmul failed: {str(exc).splitlines()[0][:80]}"
    between()
    say("memory bandwidth (copy)")
    hbm = copy_bandwidth_Bps(device, sizes)
    between()
    say("op launch overhead")
    launch = launch_seconds(device, sizes)
    return DeviceNumbers(device_name(device), peaks, device_memory_bytes(device, ranks_on_host), hbm, launch,
                         skipped, spread)
