"""Fault injection on real torchrun jobs (gloo, CPU ranks): a rank that stops answering or dies
ends the whole job with one line from each survivor and a non-zero exit, within --timeout plus
torchrun's grace period; never a hang, never a raw backend traceback from our ranks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from costmodel.cluster import load_cluster
from tests.runs import emit_model, plan_for

pytestmark = pytest.mark.slow

CPU2 = {"name": "cpu2", "nodes": [{"devices": [{"type": "cpu", "count": 2}], "intra_link": "loopback"}]}


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    return emit_model("mlp", plan_for("mlp", "dp-even", load_cluster(CPU2)), tmp_path_factory.mktemp("faults"))


def _rank_pids(parent: int) -> dict[int, int]:
    """Rank -> pid of torchrun's worker processes (children of ``parent`` with RANK set)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) != parent:
                continue
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = int(entry)
    return found


def _run_and_hurt(program: Path, sig: signal.Signals, timeout: float, *extra: str,
                  after: str = "step 5 ") -> tuple[int, str, float]:
    """Start a long 2-rank run, send ``sig`` to rank 1 once a line starting with ``after`` is
    printed; return the exit status, stderr, and seconds from the signal to the job's end."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           str(program), "--device", "cpu", "--steps", "1000000", "--timeout", str(timeout), *extra]
    job = subprocess.Popen(cmd, cwd=program.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        for line in job.stdout:
            if line.startswith(after):
                break
        else:
            pytest.fail(f"the job ended before {after!r}: {job.wait()} {job.stderr.read()[-3000:]}")
        os.kill(_rank_pids(job.pid)[1], sig)
        hurt = time.monotonic()
        _, err = job.communicate(timeout=180)
        return job.returncode, err, time.monotonic() - hurt
    finally:
        if job.poll() is None:
            job.kill()
            for pid in _rank_pids(job.pid).values():
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_rank_that_stops_or_dies_ends_the_job(program, sig):
    status, err, seconds = _run_and_hurt(program, sig, timeout=10)
    assert status != 0
    assert seconds < 120, f"the job took {seconds:.0f} s to end"
    ours = [line for line in err.splitlines() if line.startswith("rank 0:")]
    assert len(ours) == 1 and "a collective failed: a peer rank stopped answering or left" in ours[0], err[-3000:]
    assert "File \"" + str(program) not in err, "a traceback from the program"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
def test_a_rank_killed_while_saving_every_step_leaves_a_usable_latest(program, tmp_path):
    """Saving every step, a rank dies (most of a step is its save): whatever it interrupted,
    ``latest`` names a complete checkpoint that passes every check and resumes on one rank."""
    from hapc.runtime import checkpoint as K
    from tests.runs import torchrun

    ck = tmp_path / "ck"
    status, err, _ = _run_and_hurt(program, signal.SIGKILL, 10, "--save", str(ck), "--save-every", "1",
                                   "--keep", "3", after="saved ")
    assert status != 0
    directory, manifest = K.read_manifest(ck)            # every file present, sizes and CRCs right
    assert directory.name == (ck / K.LATEST).read_text().strip()
    assert len(list(ck.glob("step-*"))) <= 4             # --keep 3, plus the one being written
    one = emit_model("mlp", plan_for("mlp", "dp-even", load_cluster(
        {"name": "cpu1", "nodes": [{"devices": [{"type": "cpu", "count": 1}], "intra_link": "loopback"}]})),
        tmp_path / "one")
    resumed = torchrun(one, 1, "--steps", "1", "--load", str(ck))
    assert resumed.returncode == 0 and f"at step {manifest['progress']['step']}" in resumed.stdout, resumed.stderr
