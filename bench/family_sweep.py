"""Sweep the Hugging Face families of ``bench/zoo.py`` as a new user would: ``hapc compile`` for
3 CPU ranks of uneven speed, then the emitted program under torchrun with ``--verify``.

    .venv/bin/python -m bench.family_sweep                 # every family (~8 minutes on 2 cores)
    .venv/bin/python -m bench.family_sweep olmoe mamba      # some
    .venv/bin/python -m bench.family_sweep --pipelined      # 2 stages x 2 micro-batches on 2 nodes

Each family ends as one of: ``verify: ok``, ``verify FAILED`` (a plan that trains another model:
the worst defect), ``refused`` (the compile's one-line error, exit 2: torch.export itself refusing
is the accepted case) or ``crashed`` (anything else). The table lists the plan's expert-parallel
steps too, the mixture-of-experts families' point.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import ROOT

ZOO = ROOT / "bench" / "zoo.py"
UNEVEN3 = {"name": "cpu3-uneven", "nodes": [{
    "devices": [{"name": f"cpu{i}", "tflops": t, "memory_GB": 8, "hbm_GBps": 20, "count": 1}
                for i, t in enumerate([0.3, 0.2, 0.1])],
    "intra_link": "loopback"}]}


def sweep_one(family: str, work: Path, timeout: float = 600.0, pipelined: bool = False) -> dict:
    """Compile ``family`` and run its program with ``--verify``; what happened, in one row.
    ``pipelined``: 6 samples in 2 stages of 2 micro-batches on two nodes of 2 CPU ranks each
    (``configs/clusters/cpu-2nodes-2x2.yaml``), instead of one stage on 3 uneven ranks."""
    out = work / family
    if pipelined:
        cluster, ranks = ROOT / "configs" / "clusters" / "cpu-2nodes-2x2.yaml", 4
        extra = ["--set", "batch=6", "--stages", "2", "--microbatches", "2"]
    else:
        cluster, ranks, extra = work / "cpu3-uneven.yaml", 3, []
        cluster.write_text(yaml.safe_dump(UNEVEN3))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    compiled = subprocess.run([sys.executable, "-m", "hapc.cli", "compile", str(ZOO), "--set", f"family={family}",
                               *extra, "--cluster", str(cluster), "-o", str(out), "--quiet"],
                              capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    row = {"family": family, "compile_s": time.perf_counter() - started, "experts": 0}
    if compiled.returncode != 0:
        last = (compiled.stderr.strip().splitlines() or ["?"])[-1]
        row["status"] = "refused" if compiled.returncode == 2 else "crashed"
        row["detail"] = last[:160]
        return row
    program = out / "program.py"
    row["experts"] = len(re.findall(r"L\.grouped_mm_experts", program.read_text()))
    started = time.perf_counter()
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                          str(program), "--verify", "--steps", "2"],
                         capture_output=True, text=True, env=env, timeout=timeout, cwd=out)
    row["run_s"] = time.perf_counter() - started
    lines = [ln for ln in ran.stdout.splitlines() if ln.startswith("verify")]
    if lines and lines[-1].startswith("verify: ok") and ran.returncode == 0:
        row["status"], row["detail"] = "verify: ok", lines[-1]
    elif lines:
        row["status"], row["detail"] = "verify FAILED", lines[-1][:160]
    else:
        row["status"] = "crashed"
        row["detail"] = ((ran.stderr.strip().splitlines() or ["?"])[-1])[:160]
    return row


def main(argv: list[str] | None = None) -> int:
    from bench.zoo import FAMILIES

    parser = argparse.ArgumentParser(prog="python -m bench.family_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help=f"default: all of {', '.join(FAMILIES)}")
    parser.add_argument("--pipelined", action="store_true",
                        help="2 stages x 2 micro-batches of 3 samples on 2 nodes of 2 CPU ranks")
    args = parser.parse_args(argv)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown family {unknown[0]!r}; the zoo has {', '.join(FAMILIES)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="hapc-sweep-") as tmp:
        for family in args.families or list(FAMILIES):
            row = sweep_one(family, Path(tmp), pipelined=args.pipelined)
            rows.append(row)
            print(f"{family:12s} {row['status']:14s} experts {row['experts']}  compile {row['compile_s']:5.1f} s  "
                  f"{row.get('detail', '')}", flush=True)
    ok = sum(r["status"] == "verify: ok" for r in rows)
    failed = [r["family"] for r in rows if r["status"] == "verify FAILED"]
    print(f"{ok}/{len(rows)} verify ok" + (f"; FAILED (another model trained): {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
