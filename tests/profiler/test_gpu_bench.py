"""The GPU benchmark's logic (bench/gpu.py) and calibrate's choice of device, on CPU."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu import Row, format_table, spearman, summary
from bench.render import gpu_section
from costmodel.cluster import load_cluster
from profiler.calibrate import run_device
from hapc.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def _rows():
    return [Row("a", "fp32", 0.010, 0.011, 0.010, 2e9, 2.1e9, "5 of 5"),
            Row("b", "fp32", 0.020, 0.018, 0.018, 3e9, 2.5e9, "5 of 5"),
            Row("c", "fp32", 0.040, 0.050, 0.050, 3e9, None, "5 of 5"),
            Row("a", "bf16", 0.005, None, 0.004, 1e9, None, "", "program failed")]


def test_summary_counts_only_finished_runs_and_reports_the_targets():
    s = summary(_rows())
    assert set(s) == {"fp32", "all"} and s["fp32"]["runs"] == 3
    assert s["fp32"]["rank_correlation"] == pytest.approx(1.0)
    assert s["fp32"]["median_error"] == pytest.approx(0.002 / 0.018)     # errors 9%, 11%, 20%
    assert s["fp32"]["worst_overhead"] == pytest.approx(0.1)
    assert s["fp32"]["worst_memory_under"] == pytest.approx(2 / 2.1 - 1)   # predicted under measured
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0) and math.isnan(spearman([1], [1]))
    text = format_table(_rows())
    assert "program failed" in text and "rank correlation 1.00" in text


def test_benchmarks_gpu_section_says_not_measured_until_a_gpu_ran_it():
    assert gpu_section({})[2] == "not measured"
    rows = [{"config": "mlp", "precision": "fp32", "predicted_seconds": 0.01, "measured_seconds": 0.012,
             "eager_seconds": 0.011, "predicted_peak_bytes": 1e9, "measured_peak_bytes": 1.1e9,
             "measured_ops": "6 of 6", "error": ""}]
    text = "\n".join(gpu_section({"gpu": {"device": "NVIDIA H200", "torch": "2.x", "date": "d", "steps": 6,
                                          "seconds": 300.0, "rows": rows, "summary": {}}}))
    assert "NVIDIA H200" in text and "| mlp | fp32 | 10.00 | 12.00 | 11.00 | +9.1% |" in text


def test_calibrate_device_follows_the_cluster():
    assert run_device("auto", load_cluster(ROOT / "configs" / "clusters" / "cpu4.yaml")) == "cpu"
    h100 = load_cluster(ROOT / "configs" / "clusters" / "h100x8.yaml")
    assert run_device("cpu", h100) == "cpu"
    import torch

    if torch.cuda.device_count() < 8:
        assert run_device("auto", h100) == "cpu"          # no GPU per rank here: CPU ranks
        with pytest.raises(UserError, match="--device cuda"):
            run_device("cuda", h100)


@pytest.mark.slow
def test_quick_cpu_run_of_the_benchmark(tmp_path):
    cluster = tmp_path / "cpu1.yaml"
    cluster.write_text("name: cpu1\nnodes:\n  - devices: [{type: cpu, count: 1}]\n")
    proc = subprocess.run([sys.executable, "-m", "bench.gpu", "--device", "cpu", "--quick", "--cluster", str(cluster),
                           "-o", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith(("gpt-small", "mlp-small"))]
    assert len(rows) == 4 and all("of" in r for r in rows)
    assert (tmp_path / "out" / "cluster.ops.json").exists()              # the per-op table was used


@pytest.mark.slow
def test_calibrate_runs_several_sizes_on_one_device(tmp_path):
    from profiler.calibrate import calibrate

    cluster = tmp_path / "cpu1.yaml"
    cluster.write_text("name: cpu1\nnodes:\n  - devices: [{type: cpu, count: 1}]\n")
    small = {"layers": 3, "features": 20, "classes": 7, "batch": 5}
    runs, result, _ = calibrate(str(ROOT / "configs" / "models" / "mlp.py"), str(cluster), overrides=small,
                                plans=["dp-even"], steps=2, knobs=["compute"], device="auto",
                                sizes=[{"hidden": 64}, {"hidden": 512}], runs_path=str(tmp_path / "runs.json"))
    assert [r.kwargs["hidden"] for r in runs] == [64, 512] and len(result.measured) == 2
