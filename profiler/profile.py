"""``hapc profile``: measure this machine (or a torchrun job's machines) and write a cluster file.

Steps: start the ranks (:mod:`profiler.workers`; or be one of them under torchrun), measure
every device and the collectives, fit each link class's alpha and beta (:mod:`profiler.fit`),
turn it all into a cluster file (:mod:`profiler.clusterfile`), check that the cost model loads
it, and write it with a header saying how it was measured. The raw measurements are written
beside it (``cluster.yaml`` -> ``cluster.profile.json``) for later inspection or refits.

``hapc-affinity:`` in the header records the pinning the numbers hold for, so that
``hapc calibrate`` and the testbed run programs under the same pinning.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from costmodel.cluster import Cluster
from costmodel.cluster_file import read_cluster_file
from hapc.errors import UserError
from profiler.clusterfile import build_cluster, merge_cluster, write_cluster_file
from profiler.comm import CommSample
from profiler.fit import LinkFit, fit_link
from profiler.pin import format_affinity, parse_affinity
from profiler.workers import WorkerConfig, run_rank, spawn

AFFINITY_TAG = "hapc-affinity:"


@dataclass
class ProfileResult:
    """What was measured, what was fitted, and the cluster file written."""

    raw: dict[str, Any]
    intra: LinkFit | None
    network: LinkFit | None
    data: dict[str, Any]            # the cluster file's content
    cluster: Cluster
    path: Path
    seconds: float

    def summary(self) -> str:
        return format_summary(self)


def under_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ and "MASTER_ADDR" in os.environ


def profile(output: str | Path, *, nproc: int | None = None, merge: str | Path | None = None, quick: bool = False,
            affinity: str | None = None, threads: int = 1, device: str = "auto", op_classes: bool = True,
            say: Callable[[str], None] = lambda m: None) -> ProfileResult | None:
    """Measure and write ``output``; None on the ranks other than 0 under torchrun."""
    started = time.perf_counter()
    device_type = _device_type(device)
    existing = None
    if merge is not None:
        read_cluster_file(merge)                      # a missing or broken file fails now, in one line
        existing = yaml.safe_load(Path(merge).read_text())
    pins = parse_affinity(affinity)
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
    else:
        world = nproc or (torch.cuda.device_count() if device_type == "cuda" else _cores())
        if pins is not None and len(pins) != world:
            if nproc is None:
                world = len(pins)
            else:
                raise UserError(f"--affinity names {len(pins)} ranks but --nproc is {nproc}")
    if world < 1:
        raise UserError("--nproc must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        config = WorkerConfig(device_type, quick, threads, tuple(tuple(sorted(p)) for p in pins) if pins else None,
                              op_classes, str(Path(tmp) / "result.json"))
        if under_torchrun():
            raw = run_rank(config)
            if raw is None:
                return None
        else:
            say(f"starting {world} rank(s) on {device_type}"
                + (f", pinned {format_affinity(pins)}" if pins else ""))
            raw = spawn(world, config)

    samples = [CommSample(**s) for s in raw["collectives"]]
    intra = _fit(samples, "intra", say)
    network = _fit(samples, "network", say)
    name = f"{socket.gethostname()}-{device_type}{world}" + ("-pinned" if pins else "")
    if existing is not None:
        data = merge_cluster(existing, raw, intra, network, str(merge))
    else:
        data = build_cluster(raw, intra, network, name)
    out = Path(output)
    header = _header(raw, intra, network, merge, time.perf_counter() - started)
    cluster = write_cluster_file(out, data, header)   # refuses what the cost model would not load
    out.with_suffix(".profile.json").write_text(json.dumps(raw, indent=1) + "\n")
    return ProfileResult(raw, intra, network, data, cluster, out, time.perf_counter() - started)


def _device_type(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device {device!r}: expected cpu, cuda or auto")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available here")
    return device


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _fit(samples: list[CommSample], link: str, say: Callable[[str], None]) -> LinkFit | None:
    mine = [s for s in samples if s.link == link]
    if not mine:
        return None
    fit = fit_link(mine)
    say(f"{link} link: latency {fit.latency_seconds * 1e6:.1f} us, bandwidth {fit.bandwidth_Bps / 1e9:.3g} GB/s "
        f"joint; per collective median fit error {fit.median_rel_error * 100:.0f}% over {fit.samples} timings, "
        f"{fit.joint_rel_error * 100:.0f}% with the joint numbers alone)")
    return fit


def read_affinity(path: str | Path) -> str | None:
    """The ``hapc-affinity:`` recorded in a profiled cluster file's header, if any."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if not line.startswith("#"):
            break
        if AFFINITY_TAG in line:
            return line.split(AFFINITY_TAG, 1)[1].strip() or None
    return None


def _header(raw: dict, intra: LinkFit | None, network: LinkFit | None, merged: Any, seconds: float) -> list[str]:
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [f"# Measured by `hapc profile` on {socket.gethostname()} at {when} in {seconds:.0f} s: "
             f"{raw['world']} rank(s), {raw['device_type']}, {raw['threads']} thread(s) per rank, torch {raw['torch']}"
             + (" (--quick)" if raw.get("quick") else "") + "."]
    if merged:
        lines.append(f"# Topology and names from {merged}; the numbers are measured.")
    if raw.get("affinity"):
        spec = ",".join("+".join(str(c) for c in cores) for cores in raw["affinity"])
        lines.append("# Ranks pinned to cores (rank i -> i-th entry); run programs pinned the same way.")
        lines.append(f"# {AFFINITY_TAG} {spec}")
    for label, fit in (("intra-node link", intra), ("network", network)):
        if fit is not None:
            kinds = ", ".join(f"{k} {v * 100:.0f}%" for k, v in sorted(fit.per_kind_rel_error.items()))
            lines.append(f"# {label}: alpha-beta fit per collective over {fit.samples} timings, median error "
                         f"{fit.median_rel_error * 100:.0f}% ({kinds}); one alpha-beta for all: "
                         f"{fit.joint_rel_error * 100:.0f}%.")
    for what, why in sorted(raw.get("skipped_collectives", {}).items()):
        lines.append(f"# not measured: {what} ({why})")
    skipped = {dt: why for r in raw["ranks"] for dt, why in r["device"].get("skipped", {}).items()}
    for dt, why in sorted(skipped.items()):
        lines.append(f"# {dt} not measured ({why}); the cost model uses the fp32 peak for it.")
    return lines


def format_summary(result: ProfileResult) -> str:
    """A table of what was measured, per rank and per link, in the units people read."""
    raw = result.raw
    lines = [(f"{'rank':>4} {'host':<14} {'fp32 GFLOPS':>11} {'spread':>6} {'bf16':>7} {'fp16':>7} {'copy GB/s':>9} "
             f"{'launch us':>9}")]
    for r in raw["ranks"]:
        d = r["device"]
        pk = d["peak_flops"]
        lines.append(f"{r['rank']:>4} {r['host'][:14]:<14} {pk['fp32'] / 1e9:11.1f} "
                     f"{'+-' + format(d.get('flops_spread', 0.0) * 100, '.0f') + '%':>6} "
                     f"{pk.get('bf16', float('nan')) / 1e9:7.2f} {pk.get('fp16', float('nan')) / 1e9:7.2f} "
                     f"{d['hbm_bandwidth_Bps'] / 1e9:9.2f} {d['launch_seconds'] * 1e6:9.1f}")
    for label, fit in (("intra-node", result.intra), ("network", result.network)):
        if fit is not None:
            lines.append(f"{label} link: {fit.bandwidth_Bps / 1e9:.3g} GB/s, {fit.latency_seconds * 1e6:.1f} us "
                         f"joint; per collective: " + ", ".join(
                             f"{k} {bw / 1e9:.3g} GB/s {a * 1e6:.0f} us" for k, (a, bw) in sorted(fit.per_kind.items()))
                         + f" (median fit error {fit.median_rel_error * 100:.0f}%)")
    eff = result.data.get("efficiency", {})
    if eff:
        lines.append("efficiency: " + ", ".join(f"{k} {v:.3g}" for k, v in eff.items()))
    for what, why in sorted(raw.get("skipped_collectives", {}).items()):
        lines.append(f"not measured: {what} ({why})")
    lines.append(f"wrote {result.path} ({result.cluster.describe()}) in {result.seconds:.1f} s; "
                 f"raw timings in {result.path.with_suffix('.profile.json')}")
    return "\n".join(lines)
