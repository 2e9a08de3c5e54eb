"""What every benchmark section shares: paths, tracing a model file on the meta device,
timing as a median of several runs, and merging a section's figures into results.json.

Sections write into one JSON file, each under its own key, so one section can be rerun
(``python -m bench.quality``) without redoing the others, and the renderer reads a single
source of truth.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = ROOT / "configs" / "models"
CLUSTERS_DIR = ROOT / "configs" / "clusters"
RESULTS = ROOT / "bench" / "results.json"

# HAP's 8 heterogeneous devices (4 V100 + 4 P100, two servers): the synthesis-time anchors'
# setting. The 16- and 64-device points of the device-count sweep keep the same two device
# generations (see clusters_by_size).
HAP8 = CLUSTERS_DIR / "hap-8gpu-v100x4-p100x4.yaml"
HAP64 = CLUSTERS_DIR / "hap-paper-v100x16-p100x48.yaml"
# Issue 13's growth case: 16 nodes of 8 A100-80GB + 16 of 8 V100, 100 Gb/s (other generations).
GROWTH256 = CLUSTERS_DIR / "a100x128-v100x128-256gpu.yaml"

# HAP's released synthesizer, search only (tracing excluded), 8 heterogeneous devices, on a
# 2-core machine like this one (design.md section 4). Keys: (model, layers).
HAP_ANCHOR_SECONDS: dict[tuple[str, int], float] = {
    ("vit", 12): 2.4, ("vit", 24): 9.3, ("vit", 48): 38.1,
    ("bert", 12): 2.4, ("bert", 24): 16.3,
    ("moe", 12): 5.5,
}


# hapc's packages, as `make install` precompiles them.
PACKAGES = ("hapc", "synth", "costmodel", "profiler")


def precompile() -> None:
    """Write the bytecode of hapc's packages before anything is timed, as `make install` does
    and as `pip install` of a wheel does: a figure should be what an installed user sees, not
    the cost of compiling ~50 modules again in every command (which an editable install under
    PYTHONDONTWRITEBYTECODE=1 pays). Up-to-date files are left alone; errors are printed."""
    import compileall

    for name in PACKAGES:
        compileall.compile_dir(ROOT / name, quiet=1)


# Every benchmark imports this module before it times anything (its commands run in
# subprocesses, which then find the bytecode).
precompile()


def model_path(name: str) -> Path:
    return MODELS_DIR / f"{name}.py"


def small_config(name: str) -> dict[str, Any]:
    """The model file's ``SMALL`` dict (tiny sizes for tests and CPU runs)."""
    from hapc.frontend.modelfile import load_model_file

    return dict(load_model_file(str(model_path(name))).module.SMALL)


def trace_model(name: str, **kwargs: Any):
    """Trace ``configs/models/<name>.py`` with ``kwargs`` on the meta device, as
    ``hapc compile`` does (no weights, so a 48-layer model traces in seconds)."""
    from hapc.frontend.modelfile import load_model_file
    from hapc.frontend.tracer import trace

    mf = load_model_file(str(model_path(name)), kwargs)
    model = mf.build_model(device="meta")
    return trace(model, tuple(t.to("meta") for t in mf.build_inputs()))


def clusters_by_size() -> dict[int, Any]:
    """8, 16 and 64 devices of the same two generations: V100s on NVLink, P100s on PCIe, 10 Gb/s
    between servers. 8 and 16 are two servers, half V100 and half P100; 64 is HAP's own cluster
    (2 servers of 8 V100, 6 of 8 P100). 256 is issue 13's growth case (A100 and V100 servers,
    100 Gb/s; see ``bench.scale`` for the sweep that holds the generations fixed)."""
    sixteen = {
        "name": "hap-16gpu-v100x8-p100x8",
        "nodes": [
            {"devices": [{"type": "V100-32GB", "count": 8}], "intra_link": "nvlink2"},
            {"devices": [{"type": "P100-16GB", "count": 8}], "intra_link": "pcie3"},
        ],
        "network": {"bandwidth_Gbps": 10, "latency_us": 50},
    }
    return {8: str(HAP8), 16: sixteen, 64: str(HAP64), 256: str(GROWTH256)}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def median_seconds(fn: Callable[[], Any], repeats: int,
                   budget_seconds: float | None = None) -> tuple[float, list[float], Any]:
    """Run ``fn`` up to ``repeats`` times; (median seconds, every run's seconds, the last result).

    With ``budget_seconds``, no further run starts once the runs so far took that long, but
    at least two always happen (when ``repeats`` allows), so one slow model cannot eat the whole
    benchmark's time and no figure rests on a single run.
    """
    runs, out = [], None
    for _ in range(max(1, repeats)):
        seconds, out = timed(fn)
        runs.append(seconds)
        if budget_seconds is not None and len(runs) >= 2 and sum(runs) >= budget_seconds:
            break
    return statistics.median(runs), runs, out


def machine() -> dict[str, Any]:
    """Where and under what load the figures were taken (other work on a 2-core machine
    slows every timing; the load average says how much)."""
    import torch

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "load_avg_1min": round(os.getloadavg()[0], 2)}


def load_results() -> dict[str, Any]:
    if RESULTS.exists():
        return json.loads(RESULTS.read_text())
    return {}


def save_section(key: str, data: dict[str, Any]) -> None:
    """Replace one section of results.json, keeping the others."""
    results = load_results()
    data = dict(data)
    data.setdefault("machine", machine())
    data["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
    results[key] = data
    RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def say(msg: str) -> None:
    print(f"  {msg}", flush=True)
