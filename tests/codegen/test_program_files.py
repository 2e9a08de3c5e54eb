"""What an emitted program reads beside itself is checked before it is used: constants.pt
against the SHA-256 written into program.py (one flipped bit in a lifted constant would train
another model) and loaded with ``weights_only=True``; a missing sibling file is one line and
exit 2, not a traceback."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hapc
from costmodel.cluster import load_cluster
from hapc.codegen import emit
from synth.baselines import baseline_program

FAMILIES = Path(__file__).resolve().parents[1] / "e2e" / "families"
ONE_CPU = {"name": "cpu1", "nodes": [{"devices": [{"type": "cpu", "count": 1}], "intra_link": "loopback"}]}


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    """A one-rank program of a model whose trace lifts constants with data (index lists)."""
    sys.path.insert(0, str(FAMILIES))
    try:
        import patterns
    finally:
        sys.path.remove(str(FAMILIES))
    torch.manual_seed(0)
    traced = hapc.trace(patterns.model("list_index"), patterns.inputs())
    assert traced.constants and not traced.dataless_constants()
    out = tmp_path_factory.mktemp("program")
    emit(baseline_program("dp-even", traced.graph, load_cluster(ONE_CPU)), str(FAMILIES / "patterns.py"), str(out),
         model_kwargs={"pattern": "list_index"}, constants=traced.constants)
    return out / "program.py"


def _run(path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, str(path), "--steps", "1", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_the_program_holds_the_hash_of_its_constants(program):
    digest = hashlib.sha256((program.parent / "constants.pt").read_bytes()).hexdigest()
    assert f"CONSTANTS_SHA256 = {digest!r}" in program.read_text()
    run = _run(program, "--verify")
    assert run.returncode == 0 and "verify: ok" in run.stdout, run.stderr[-2000:]


@pytest.mark.parametrize("damage", ["one flipped bit", "missing"])
def test_damaged_constants_stop_the_program_in_one_line(program, tmp_path, damage):
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in program.parent.iterdir():
        if f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    constants = copy / "constants.pt"
    if damage == "missing":
        constants.unlink()
    else:
        raw = bytearray(constants.read_bytes())
        raw[len(raw) * 3 // 4] ^= 0x01
        constants.write_bytes(bytes(raw))
    run = _run(copy / "program.py")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    expected = "checksum mismatch" if damage == "one flipped bit" else "is missing"
    assert len(run.stderr.strip().splitlines()) == 1 and expected in run.stderr and "constants.pt" in run.stderr


def test_a_program_copied_without_its_siblings_says_so_in_one_line(program, tmp_path):
    (tmp_path / "program.py").write_text(program.read_text())
    run = _run(tmp_path / "program.py")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == (f"program.py: hapc_local_ops.py is missing beside it in {tmp_path.resolve()} "
                                  "(copy the whole folder hapc wrote)")


def test_the_step_watchdog_ends_a_rank_whose_step_stalls(program, monkeypatch, capsys):
    """The backstop behind the process group's timeout: 1.5x --timeout after a step began, one
    line and exit 1; disarmed (around saves and --verify's reference) it waits."""
    import importlib.util
    import threading

    spec = importlib.util.spec_from_file_location("program_under_test", program)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ended = threading.Event()
    monkeypatch.setattr(module.os, "_exit", lambda status: ended.set())
    watchdog = module.StepWatchdog(0.2, rank=3)
    watchdog.start()
    try:
        watchdog.beat(6, armed=False)
        assert not ended.wait(0.6)                 # disarmed: no end however long
        watchdog.beat(6)
        assert ended.wait(5)
    finally:
        watchdog.stop()
    assert capsys.readouterr().err.startswith("rank 3: step 7 made no progress for 0.3 s (1.5x --timeout): "
                                              "a peer rank stopped answering; ending this rank")


def test_peer_failures_are_told_from_the_programs_own_errors(program):
    import importlib.util

    spec = importlib.util.spec_from_file_location("program_peer_failure", program)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for text in ("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer",
                 "[unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete",
                 "Application timeout caused pair closure"):
        assert module._peer_failure(RuntimeError(text)), text
    assert not module._peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)"))
    assert not module._peer_failure(ValueError("Connection reset by peer"))
