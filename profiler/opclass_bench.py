"""Efficiency per op class: how close to the measured peak each kind of op really gets.

The cost model prices a node as a roofline (:func:`costmodel.compute.roofline_seconds`):
``max(flops / (peak * efficiency[class]), bytes / hbm) + launch`` for the forward and again
for the backward. With the device's peak, memory bandwidth and launch latency measured
(:mod:`profiler.device`), the one unknown left per class is its efficiency, so one timed op
per class (forward and backward, at a size typical of training) gives it: the efficiency at
which the roofline predicts the measured time. Where even efficiency 1 predicts a slower
op than measured (the op is memory-bound and streams faster than a copy) the efficiency is
1; efficiency then does not matter for that op.

FLOPs and bytes are counted as the tracer counts them for the IR (``hapc.frontend.tracer._node_cost``):
FLOPs from ``FlopCounterMode`` for the forward and the backward, one per element touched
when torch counts none (twice that for the backward); bytes are the inputs plus the
outputs for the forward, and the output gradient, the saved inputs and one gradient per
input needing it for the backward. A test checks that the two agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from costmodel.compute import roofline_seconds
from profiler.timing import window_seconds


@dataclass(frozen=True)
class OpCost:
    """The tracer's view of one op: forward/backward FLOPs and bytes."""

    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float


@dataclass(frozen=True)
class OpBench:
    """One op standing for its class: how to build its inputs and run it."""

    op_class: str
    label: str
    make: Callable[[torch.device, bool], tuple[Callable[..., torch.Tensor], list[torch.Tensor]]]


def _rand(*shape: int, device: torch.device, grad: bool = True) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(sum(shape))
    return torch.randn(*shape, generator=gen).to(device).requires_grad_(grad)


def _tokens(quick: bool, device: torch.device) -> int:
    return 4096 if device.type == "cuda" else (256 if quick else 512)


def _linear(device, quick):
    t, h = _tokens(quick, device), 1024 if device.type == "cuda" else 256
    return F.linear, [_rand(t, h, device=device), _rand(4 * h, h, device=device)]


def _add(device, quick):
    t = _tokens(quick, device)
    return torch.add, [_rand(t, 1024, device=device), _rand(t, 1024, device=device)]


def _gelu(device, quick):
    return F.gelu, [_rand(_tokens(quick, device), 1024, device=device)]


def _relu(device, quick):
    return F.relu, [_rand(_tokens(quick, device), 1024, device=device)]


def _layer_norm(device, quick):
    h = 1024 if device.type == "cuda" else 256
    return (lambda x, w, b: F.layer_norm(x, (h,), w, b),
            [_rand(_tokens(quick, device), h, device=device), _rand(h, device=device), _rand(h, device=device)])


def _softmax(device, quick):
    return (lambda x: torch.softmax(x, -1)), [_rand(_tokens(quick, device), 1024, device=device)]


def _sum(device, quick):
    return (lambda x: x.sum(-1)), [_rand(_tokens(quick, device), 1024, device=device)]


def _cross_entropy(device, quick):
    t = _tokens(quick, device)
    labels = torch.arange(t, device=device) % 1000
    return F.cross_entropy, [_rand(t, 1000, device=device), labels]


def _embedding(device, quick):
    t = _tokens(quick, device)
    ids = (torch.arange(t, device=device) * 7) % 4096
    return F.embedding, [ids, _rand(4096, 256, device=device)]


def _attention(device, quick):
    b, s = (8, 512) if device.type == "cuda" else (2 if quick else 4, 128)
    return ((lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
            [_rand(b, 4, s, 32, device=device) for _ in range(3)])


def _conv(device, quick):
    b = 16 if device.type == "cuda" else (2 if quick else 4)
    return ((lambda x, w: F.conv2d(x, w, padding=1)),
            [_rand(b, 16, 32, 32, device=device), _rand(32, 16, 3, 3, device=device)])


BENCHES: tuple[OpBench, ...] = (
    OpBench("matmul", "linear", _linear),
    OpBench("elementwise", "add", _add),
    OpBench("elementwise", "gelu", _gelu),
    OpBench("elementwise", "relu", _relu),
    OpBench("norm", "layer_norm", _layer_norm),
    OpBench("softmax", "softmax", _softmax),
    OpBench("reduction", "sum", _sum),
    OpBench("loss", "cross_entropy", _cross_entropy),
    OpBench("embedding", "embedding", _embedding),
    OpBench("attention", "sdpa", _attention),
    OpBench("conv", "conv2d", _conv),
)


def op_cost(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor]) -> OpCost:
    """FLOPs and bytes of ``fn(*inputs)`` forward and backward, counted as the tracer counts.

    Counted on meta copies, as the tracer does: the kernel a real tensor dispatches to can
    hide its FLOPs from the counter (CPU attention does), the meta one does not.
    """
    inputs = [t.detach().to("meta").requires_grad_(t.requires_grad) for t in inputs]
    wrt = [t for t in inputs if t.requires_grad]
    with FlopCounterMode(display=False) as counter:
        out = fn(*inputs)
        fwd = float(counter.get_total_flops())
        if wrt:
            torch.autograd.grad(out, wrt, torch.ones_like(out))
        bwd = float(counter.get_total_flops()) - fwd
    in_bytes = sum(t.numel() * t.element_size() for t in inputs)
    out_bytes = out.numel() * out.element_size()
    grad_in = sum(t.numel() * t.element_size() for t in wrt)
    if fwd == 0:
        fwd = float(max(out.numel(), sum(t.numel() for t in inputs)))
        bwd = 2.0 * fwd
    return OpCost(fwd, bwd if wrt else 0.0, float(in_bytes + out_bytes),
                  float(out_bytes + in_bytes + grad_in) if wrt else 0.0)


def op_seconds(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], *, repeats: int = 3,
               window: float = 0.1, sync: Callable[[], None] | None = None) -> float:
    """Median seconds of one forward and backward of ``fn(*inputs)`` (fixed-time windows)."""
    wrt = [t for t in inputs if t.requires_grad]
    out0 = fn(*inputs)
    grad_out = torch.ones_like(out0)

    def work() -> None:
        out = fn(*inputs)
        torch.autograd.grad(out, wrt, grad_out)

    return window_seconds(work, window_seconds=window, repeats=repeats, sync=sync)


def solve_efficiency(cost: OpCost, seconds: float, peak_flops: float, hbm_bandwidth_Bps: float,
                     launch_seconds: float, *, lowest: float = 1e-4) -> float:
    """The efficiency at which the roofline of ``cost`` predicts ``seconds`` (in [lowest, 1]).

    The predicted time falls as efficiency rises, so bisection (on a log scale) finds it.
    """
    def predicted(eff: float) -> float:
        return (roofline_seconds(cost.fwd_flops, cost.fwd_bytes, peak_flops, eff, hbm_bandwidth_Bps, 1.0,
                                 launch_seconds)
                + roofline_seconds(cost.bwd_flops, cost.bwd_bytes, peak_flops, eff, hbm_bandwidth_Bps, 1.0,
                                   launch_seconds))

    if predicted(1.0) >= seconds:
        return 1.0
    if predicted(lowest) <= seconds:
        return lowest
    lo, hi = math.log(lowest), 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if predicted(math.exp(mid)) > seconds:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def measure_classes(device: torch.device, peak_flops: float, hbm_bandwidth_Bps: float, launch: float, *,
                    quick: bool = False, between: Callable[[], None] = lambda: None,
                    say: Callable[[str], None] = lambda m: None) -> dict[str, dict]:
    """Per class: the solved efficiency (median over the class's ops) and what each op measured.

    ``between`` runs before every op, on every rank alike (see :func:`profiler.device.measure_device`).
    """
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    found: dict[str, list[dict]] = {}
    say("op classes: " + ", ".join(dict.fromkeys(b.op_class for b in BENCHES)))
    for bench in BENCHES:
        between()
        fn, inputs = bench.make(device, quick)
        cost = op_cost(fn, inputs)
        seconds = op_seconds(fn, inputs, repeats=3, window=0.05 if quick else 0.1, sync=sync)
        eff = solve_efficiency(cost, seconds, peak_flops, hbm_bandwidth_Bps, launch)
        found.setdefault(bench.op_class, []).append(
            {"op": bench.label, "seconds": seconds, "efficiency": eff, "cost": cost.__dict__})
    return {cls: {"efficiency": log_median([r["efficiency"] for r in runs]), "ops": runs}
            for cls, runs in found.items()}


def log_median(values: Sequence[float]) -> float:
    """The median on a log scale: efficiencies span decades, and the median of two is then
    their geometric mean, not an arithmetic one dominated by the larger."""
    return math.exp(statistics.median(math.log(max(v, 1e-12)) for v in values))
