"""fp16 programs on three uneven gloo CPU ranks: --verify against one device under the same
autocast and loss scale, and an overflow seen by one rank skipped by every rank (one stage and
a two-stage pipeline), the loss scale backing off and growing in step everywhere."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from hapc.cli import main
from hapc.plan.plan import Plan
from tests.runs import failure_excerpt, torchrun, verify_line

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("fp16_harness.py")
THREE_UNEVEN = {"name": "three-uneven-fp16", "nodes": [{"intra_link": "loopback", "devices": [
    {"name": "big", "tflops": {"fp32": 0.3, "fp16": 0.6}, "memory_GB": 8, "hbm_GBps": 20, "count": 1},
    {"name": "mid", "tflops": {"fp32": 0.2, "fp16": 0.4}, "memory_GB": 8, "hbm_GBps": 15, "count": 1},
    {"name": "small", "tflops": {"fp32": 0.1, "fp16": 0.2}, "memory_GB": 8, "hbm_GBps": 10, "count": 1}]}]}
GPT_SMALL = ["layers=2", "hidden=64", "heads=4", "seq=16", "vocab=101", "batch=6"]


def _compile(tmp_path: Path, *extra: str, dropout: float = 0.1) -> Path:
    cluster = tmp_path / "three.yaml"
    cluster.write_text(yaml.safe_dump(THREE_UNEVEN))
    args = ["compile", str(ROOT / "configs" / "models" / "gpt.py"), "--cluster", str(cluster), "--precision", "fp16",
            "-o", str(tmp_path / "out"), "--quiet", *extra]
    assert main(args + [x for kv in [*GPT_SMALL, f"dropout={dropout}"] for x in ("--set", kv)]) == 0
    return tmp_path / "out" / "program.py"


@pytest.mark.slow
def test_fp16_gpt_verifies_on_three_uneven_gloo_ranks(tmp_path):
    program = _compile(tmp_path)
    plan = Plan.load(tmp_path / "out" / "plan.json")
    assert plan.precision.name == "fp16" and len(set(plan.ratios)) > 1
    proc = torchrun(program, 3, "--verify", "--steps", "2", timeout=600)
    assert "verify tolerance: fp16 (one device under the same fp16 autocast and loss scale 65536)" in proc.stdout, \
        proc.stdout[-2000:] + failure_excerpt(proc)
    assert verify_line(proc).startswith("verify: ok"), proc.stdout[-2000:] + failure_excerpt(proc)


def _verdicts(stdout: str) -> dict[int, list[tuple[int, int, float, float]]]:
    """rank -> [(step, skipped, scale, next scale)] from the harness's lines (ranks interleave)."""
    out: dict[int, list] = {}
    for rank, step, skipped, scale, nxt in re.findall(
            r"verdict rank=(\d+) step=(\d+) skipped=(\d) scale=([\d.e+]+) next=([\d.e+]+)", stdout):
        out.setdefault(int(rank), []).append((int(step), int(skipped), float(scale), float(nxt)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("stages", [None, "2"])
def test_an_overflow_on_one_rank_is_skipped_by_every_rank(tmp_path, stages):
    """Rank 2 alone finds an inf in its gradients at step 2: every rank (every stage) skips that
    step and halves the scale; with a growth interval of 2 the scale doubles again after
    steps 3 and 4; training goes on with finite losses."""
    program = _compile(tmp_path, *(["--stages", stages] if stages else []), dropout=0.0)
    save = [] if stages else ["--save", str(tmp_path / "ck")]        # pipelines have no checkpoints yet
    env = {"HARNESS_PROGRAM": str(program), "HARNESS_SCALING": "growth_interval=2"}
    proc = torchrun(HARNESS, 3, "--steps", "5", *save, timeout=600, env={**env, "HARNESS_INF": "2:2"})
    assert proc.returncode == 0, proc.stdout[-2000:] + failure_excerpt(proc)
    verdicts = _verdicts(proc.stdout)
    want = [(1, 0, 65536.0, 65536.0), (2, 1, 65536.0, 32768.0), (3, 0, 32768.0, 32768.0),
            (4, 0, 32768.0, 65536.0), (5, 0, 65536.0, 65536.0)]
    assert verdicts == {0: want, 1: want, 2: want}, proc.stdout[-3000:]
    assert "step 2 skipped: inf/nan gradients, loss scale 65536 -> 32768" in proc.stdout
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)", proc.stdout, re.M)]
    assert len(losses) == 5 and all(math.isfinite(x) for x in losses)
    # Dropout 0 and the same batch: a skipped step leaves the weights, so step 3 repeats step 2's loss.
    assert losses[2] == losses[1] and losses[3] < losses[2]
    if save:       # the checkpoint carries the scale and its clean-step count (1 of 2 after step 5)
        resumed = torchrun(HARNESS, 3, "--steps", "1", "--load", str(tmp_path / "ck"), timeout=600, env=env)
        assert _verdicts(resumed.stdout) == {r: [(1, 0, 65536.0, 131072.0)] for r in range(3)}, \
            resumed.stdout[-2000:] + failure_excerpt(resumed)
