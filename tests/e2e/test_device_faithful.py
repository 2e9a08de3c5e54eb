"""Device-faithful tracing end to end on CPU gloo ranks (issue 24, slow): a model that branches
on ``device.type`` and a tiny Hugging Face Qwen3-MoE (whose experts pick ``histc``'s input
dtype by device: traced on meta, its program crashed on CPUs) compile for CPU clusters and
verify. Run: ``.venv/bin/python -m pytest -q -m slow tests/e2e/test_device_faithful.py -s``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hapc.cli import main
from tests.runs import torchrun, verify_line

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
THREE_CPUS = {"name": "cpu3-uneven", "nodes": [{
    "devices": [{"name": f"cpu{i}", "tflops": t, "memory_GB": 8, "hbm_GBps": 20, "count": 1}
                for i, t in enumerate([0.3, 0.2, 0.1])],
    "intra_link": "loopback"}]}


@pytest.mark.parametrize("model", ["tests/frontend/models/device_branch.py", "tests/e2e/families/qwen3_moe.py"])
def test_device_branching_model_verifies_on_three_cpu_ranks(model, tmp_path, capsys):
    if "qwen3" in model:
        pytest.importorskip("transformers")
    cluster = tmp_path / "cpu3.yaml"
    cluster.write_text(yaml.safe_dump(THREE_CPUS))
    out = tmp_path / "out"
    assert main(["compile", str(REPO / model), "--cluster", str(cluster), "-o", str(out), "--quiet"]) == 0
    capsys.readouterr()
    proc = torchrun(out / "program.py", 3, "--verify", "--steps", "1")
    line = verify_line(proc)
    assert line.startswith("verify: ok") and proc.returncode == 0, line + proc.stderr[-3000:]
    print(line)
