"""``make bench-gpu`` (``python -m bench.gpu``): is hapc GPU-true on the device at hand?

One short run on one GPU: profile the device (``hapc profile``, one rank), then for each
config of :data:`CONFIGS` and each precision (fp32, bf16): time the model's op signatures
(``hapc profile --model --ops-only``, cached across configs), plan it for the profiled
one-device cluster, run the emitted program (one rank, NCCL) and the plain eager model (same
device, dtype, autocast and optimizer, TF32 as the cluster says), and print predicted,
measured and eager step times, the emitted/eager overhead, and predicted vs measured peak
memory; then, per precision, the median error and the rank correlation of predicted vs
measured. ``--device cpu --quick`` runs the same logic on tiny configs on CPU (a test of the
benchmark, not a measurement). Results go to ``OUT/gpu-bench.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "configs" / "models"

# (label, model file, overrides): the seven configs of issue 11, a Hugging Face GPT-2 and a
# Llama-style model of 8 layers x 1024 hidden at sequence 1024.
CONFIGS: list[tuple[str, str, dict[str, Any]]] = [
    ("gpt-2x256", "gpt.py", {"layers": 2, "hidden": 256, "seq": 128, "batch": 8, "vocab": 8192, "dropout": 0.0}),
    ("gpt-4x1024", "gpt.py", {"layers": 4, "hidden": 1024, "heads": 16, "seq": 512, "batch": 8, "vocab": 32000}),
    ("gpt2-small", "gpt.py", {"seq": 1024, "batch": 8}),
    ("bert-base", "bert.py", {"batch": 64}),
    ("vit-b16", "vit.py", {"batch": 64}),
    ("vgg19", "vgg.py", {"batch": 256}),
    ("mlp", "mlp.py", {"batch": 1024}),
    ("hf-gpt2", "hf_gpt2.py", {"seq": 512, "batch": 8}),
    ("llama-8x1024", "hf_llama.py", {}),
]
QUICK_CONFIGS: list[tuple[str, str, dict[str, Any]]] = [
    ("gpt-small", "gpt.py", {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "batch": 5,
                             "dropout": 0.1}),
    ("mlp-small", "mlp.py", {"layers": 3, "features": 20, "hidden": 64, "classes": 7, "batch": 5}),
]

_MEDIAN = re.compile(r"median step time ([0-9.eE+-]+) s")
_PEAK = re.compile(r"peak memory bytes per rank: ([0-9 ]+)")


@dataclass
class Row:
    config: str
    precision: str
    predicted_seconds: float
    measured_seconds: float | None
    eager_seconds: float | None
    predicted_peak_bytes: float
    measured_peak_bytes: float | None
    measured_ops: str                  # "N of M" op nodes priced from the per-op table
    error: str = ""

    @property
    def overhead(self) -> float | None:
        if self.measured_seconds is None or not self.eager_seconds:
            return None
        return self.measured_seconds / self.eager_seconds - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny configs (tests the benchmark on CPU)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 6, quick 3)")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--only", default="", help="comma-separated config labels to run")
    parser.add_argument("--cluster", default=None, metavar="CLUSTER.yaml",
                        help="a one-device cluster file already profiled here (skips the device profile)")
    parser.add_argument("-o", "--out", default=None, help="work folder (default: a new temporary one)")
    args = parser.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench.gpu: no CUDA device here; run with --device cpu --quick to test the benchmark", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hapc-bench-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (3 if args.quick else 6)
    configs = QUICK_CONFIGS if args.quick else CONFIGS
    if args.only:
        keep = {x.strip() for x in args.only.split(",")}
        configs = [c for c in configs if c[0] in keep]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    started = time.perf_counter()

    cluster_file = out / "cluster.yaml"
    if args.cluster:
        shutil.copyfile(args.cluster, cluster_file)
    else:
        _say(f"profiling the {args.device} device")
        from profiler.profile import profile

        profile(cluster_file, nproc=1, device=args.device, quick=args.quick, op_classes=not args.quick, say=_say)

    rows: list[Row] = []
    for label, model_file, overrides in configs:
        traced: list[Any] = []                  # traced once per config, for both precisions
        for precision in precisions:
            _say(f"{label} {precision}")
            try:
                rows.append(_one(label, MODELS / model_file, overrides, precision, cluster_file, out, args.device,
                                 steps, traced))
            except Exception as exc:          # one config failing must not lose the others' figures
                rows.append(Row(label, precision, float("nan"), None, None, float("nan"), None, "",
                                f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"))
            _say(_format_row(rows[-1]))
    text = format_table(rows)
    print(text)
    print(f"total {time.perf_counter() - started:.0f} s on {_device_name(args.device)}")
    record = {"device": _device_name(args.device), "torch": torch.__version__, "quick": args.quick, "steps": steps,
              "seconds": time.perf_counter() - started, "rows": [asdict(r) for r in rows], "summary": summary(rows)}
    (out / "gpu-bench.json").write_text(json.dumps(record, indent=1) + "\n")
    if args.device == "cuda" and not args.quick and not args.only:
        from bench.common import save_section
        from bench.render import main as render

        save_section("gpu", record)          # bench/results.json, then BENCHMARKS.md's GPU section
        render([])
    return 0 if all(not r.error for r in rows) else 1


def _one(label: str, model_file: Path, overrides: dict[str, Any], precision: str, cluster_file: Path, out: Path,
         device: str, steps: int, cache: list[Any]) -> Row:
    import torch

    from costmodel.optable import measured_share
    from hapc.api import synthesize
    from hapc.ir.precision import autocast_graph
    from hapc.frontend.modelfile import load_model_file
    from hapc.frontend.tracer import trace
    from profiler.ops import profile_ops

    mf = load_model_file(str(model_file), dict(overrides))
    if not cache:
        try:
            cache.append(trace(mf.build_model(device="meta"), tuple(t.to("meta") for t in mf.build_inputs())))
        except Exception:
            cache.append(trace(mf.build_model(), mf.build_inputs()))
    traced = cache[0]
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    graph = autocast_graph(traced.graph, precision)
    from costmodel.cluster import load_cluster

    cluster = load_cluster(cluster_file)
    profile_ops(graph, cluster_file, cluster.devices[0].type, dev, allow_tf32=cluster.allow_tf32,
                autocast=torch.bfloat16 if precision == "bf16" else None)
    plan = synthesize(traced, None, cluster_file, model_file=str(model_file), model_kwargs=dict(overrides),
                      precision=precision)
    measured_nodes, total_nodes = measured_share(plan.graph, plan.cluster.op_table)
    run_dir = out / f"{label}-{precision}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    plan.emit(run_dir, constants=traced.constants)
    plan.save(run_dir / "plan.json")
    measured, peak, error = _run_emitted(run_dir / "program.py", device, steps)
    eager = _eager_seconds(mf, dev, precision, plan.precision.allow_tf32, steps)
    return Row(label, precision, plan.cost, measured, eager, max(plan.memory), peak,
               f"{measured_nodes} of {total_nodes}", error)


def _run_emitted(program: Path, device: str, steps: int) -> tuple[float | None, float | None, str]:
    """One rank needs no torchrun: the program sets up its own one-process group."""
    import os

    cmd = [sys.executable, str(program), "--device", device, "--steps", str(steps)]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["MASTER_PORT"] = str(_free_port())
    proc = subprocess.run(cmd, cwd=program.parent, capture_output=True, text=True, check=False, timeout=600,
                          env=env)
    median = _MEDIAN.search(proc.stdout)
    if proc.returncode != 0 or median is None:
        return None, None, f"program failed (rc {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
    peak = _PEAK.search(proc.stdout)
    return float(median.group(1)), (max(float(x) for x in peak.group(1).split()) if peak else None), ""


def _eager_seconds(mf: Any, device: Any, precision: str, allow_tf32: bool, steps: int) -> float:
    """Median step (forward, backward, optimizer) of the plain model: the reference."""
    import contextlib

    import torch

    torch.manual_seed(0)
    model = mf.build_model().to(device)
    batch = [t.to(device) for t in mf.build_inputs()]
    params = [p for p in model.parameters() if p.requires_grad]
    custom = mf.optimizer                 # the model file's optimizer(params), if it has one
    try:
        opt = custom(params) if custom else torch.optim.AdamW(params, lr=1e-3, fused=True)
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW(params, lr=1e-3)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allow_tf32
    times = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        cast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        with cast:
            loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        times.append(time.perf_counter() - t0)
    del model, opt, batch
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return statistics.median(times[1:]) if len(times) > 1 else times[0]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


# ---- the report -------------------------------------------------------------------------------

def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation (no ties expected among step times)."""
    if len(a) < 2:
        return float("nan")

    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=x.__getitem__)
        r = [0.0] * len(x)
        for i, j in enumerate(order):
            r[j] = float(i)
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def summary(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per precision (and "all"): median |error|, rank correlation, worst emitted/eager overhead,
    worst memory under-prediction."""
    out = {}
    for key in sorted({r.precision for r in rows}) + ["all"]:
        ok = [r for r in rows if (key == "all" or r.precision == key) and r.measured_seconds]
        if not ok:
            continue
        pred, meas = [r.predicted_seconds for r in ok], [r.measured_seconds or 0.0 for r in ok]
        overheads = [r.overhead for r in ok if r.overhead is not None]
        mem = [r.predicted_peak_bytes / r.measured_peak_bytes - 1 for r in ok if r.measured_peak_bytes]
        out[key] = {"runs": len(ok),
                    "median_error": statistics.median(abs(p - m) / m for p, m in zip(pred, meas)),
                    "rank_correlation": spearman(pred, meas),
                    "worst_overhead": max(overheads) if overheads else float("nan"),
                    "worst_memory_under": min(mem) if mem else float("nan")}
    return out


def _format_row(r: Row) -> str:
    def ms(x: float | None) -> str:
        return f"{x * 1e3:10.2f}" if x is not None and x == x else f"{'-':>10}"

    def gb(x: float | None) -> str:
        return f"{x / 1e9:8.2f}" if x is not None and x == x else f"{'-':>8}"

    over = f"{r.overhead * 100:+7.1f}%" if r.overhead is not None else f"{'-':>8}"
    return (f"{r.config:<14} {r.precision:<5} {ms(r.predicted_seconds)} {ms(r.measured_seconds)} "
            f"{ms(r.eager_seconds)} {over} {gb(r.predicted_peak_bytes)} {gb(r.measured_peak_bytes)} "
            f"{r.measured_ops:>10}" + (f"  {r.error}" if r.error else ""))


def format_table(rows: list[Row]) -> str:
    lines = [f"{'config':<14} {'prec':<5} {'pred ms':>10} {'meas ms':>10} {'eager ms':>10} {'overhead':>8} "
             f"{'pred GB':>8} {'meas GB':>8} {'measured':>10}"]
    lines += [_format_row(r) for r in rows]
    for key, s in summary(rows).items():
        lines.append(f"{key}: {s['runs']} runs, median error {s['median_error'] * 100:.1f}%, rank correlation "
                     f"{s['rank_correlation']:.2f}, worst emitted/eager overhead {s['worst_overhead'] * 100:+.1f}%, "
                     f"worst predicted/measured peak memory {s['worst_memory_under'] * 100:+.1f}%")
    return "\n".join(lines)


def _say(msg: str) -> None:
    print(f"  [bench.gpu] {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
