"""Measured numbers -> a cluster file (design.md section 3), new or merged into an existing one.

A new file has one node per host; within a node, consecutive ranks whose measured numbers
agree (fp32 within 15%, memory bandwidth within 25%) form one device group with their mean
numbers, so a uniform machine reads as ``{name: cpu, count: 2, ...}`` and the heterogeneous
testbed as one fast device and a group of two slow ones. Numbers are written in the file's
human units (``tflops``, ``memory_GB``, ``hbm_GBps``, ``bandwidth_GBps``, ``latency_us``),
rounded to 4 significant digits.

``hbm_GBps`` is the *measured* copy bandwidth, so ``efficiency.hbm`` is written as 1 (the
catalog's 0.8 would discount it twice); the other efficiencies are the measured ones of
:mod:`profiler.opclass_bench`, relative to the measured peak.

Merging keeps the existing file's topology: its nodes, node counts, device groups, names
and catalog types, link names, ``name`` and ``allow_tf32``; it replaces the numbers that were
measured (device ``tflops``/``hbm_GBps``/``memory_GB`` as overrides, link bandwidth and
latency, efficiencies, launch latency) and keeps the rest.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from costmodel.cluster import Cluster, Link
from costmodel.cluster_file import parse_cluster
from hapc.errors import UserError
from profiler.fit import LinkFit
from profiler.opclass_bench import log_median

_DEVICE_NUMBER_KEYS = ("tflops", "peak_flops", "memory_GB", "memory_bytes", "hbm_GBps", "hbm_Bps")
_LINK_NUMBER_KEYS = ("bandwidth_GBps", "bandwidth_Gbps", "bandwidth_Bps", "latency_us", "latency_s")


def sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits, as a plain float for YAML."""
    return float(f"{x:.{digits}g}")


def write_cluster_file(path: str | Path, data: Mapping[str, Any], header_lines: list[str] | None = None) -> Cluster:
    """Check that the cost model accepts ``data``, then write it (comment header first).

    Returns the parsed cluster, so the caller holds exactly what a later ``load_cluster``
    of the file gives.
    """
    path = Path(path)
    cluster = parse_cluster(data, str(path))
    header = "".join((ln if ln.startswith("#") else f"# {ln}") + "\n" for ln in header_lines or [])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=None, width=110))
    cluster.source = str(path)
    return cluster


# ---- device numbers ---------------------------------------------------------------------------

def device_fields(numbers: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The cluster-file fields of a device group from its ranks' measured numbers (their mean)."""
    dtypes = [dt for dt in ("fp32", "tf32", "bf16", "fp16") if all(dt in n["peak_flops"] for n in numbers)]
    tflops = {dt: sig(statistics.fmean(n["peak_flops"][dt] for n in numbers) / 1e12) for dt in dtypes}
    return {"tflops": tflops,
            "memory_GB": sig(statistics.fmean(n["memory_bytes"] for n in numbers) / 1e9),
            "hbm_GBps": sig(statistics.fmean(n["hbm_bandwidth_Bps"] for n in numbers) / 1e9)}


FLOPS_NOISE_FLOOR = 0.15     # fp32 peaks closer than this are one kind of device, whatever their spread


def _similar(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """One kind of device: the same name, bandwidths within 25%, and fp32 peaks that the
    measurements cannot tell apart — within 15%, or within the two measurements' spreads
    (identical cores of a shared machine can measure far apart, and shares split on that noise
    run slower than even data parallelism)."""
    fa, fb = a["peak_flops"]["fp32"], b["peak_flops"]["fp32"]
    ha, hb = a["hbm_bandwidth_Bps"], b["hbm_bandwidth_Bps"]
    noise = fa * a.get("flops_spread", 0.0) + fb * b.get("flops_spread", 0.0)
    flops_alike = abs(fa - fb) <= max(FLOPS_NOISE_FLOOR * max(fa, fb), noise)
    return a["name"] == b["name"] and flops_alike and abs(ha - hb) <= 0.25 * max(ha, hb)


def group_ranks(devices: list[Mapping[str, Any]]) -> list[list[int]]:
    """Consecutive ranks with similar numbers, as lists of indices into ``devices``."""
    groups: list[list[int]] = []
    for i, d in enumerate(devices):
        if groups and _similar(devices[groups[-1][0]], d):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def efficiency_fields(result: Mapping[str, Any]) -> dict[str, float]:
    """Per measured class: the (log-scale) median over ranks of its efficiency; ``hbm`` is 1 (see above)."""
    per_class: dict[str, list[float]] = {}
    for r in result["ranks"]:
        for cls, found in (r.get("op_classes") or {}).items():
            per_class.setdefault(cls, []).append(found["efficiency"])
    out = {cls: sig(min(1.0, max(1e-4, log_median(v)))) for cls, v in per_class.items()}
    out.setdefault("matmul", 1.0)          # the peak itself was measured on matmuls
    out["hbm"] = 1.0
    return out


def launch_us(result: Mapping[str, Any]) -> float:
    return sig(statistics.median(r["device"]["launch_seconds"] for r in result["ranks"]) * 1e6)


def link_fields(fit: LinkFit, name: str) -> dict[str, Any]:
    return {"name": name, **link_numbers(fit.as_link(name))}


def link_numbers(link: Link) -> dict[str, Any]:
    """A link's numbers in the cluster file's units: its own alpha-beta and each collective's."""
    out: dict[str, Any] = {"bandwidth_GBps": sig(link.bandwidth_Bps / 1e9),
                           "latency_us": sig(link.latency_seconds * 1e6)}
    if link.per_kind:
        out["collectives"] = {k: {"bandwidth_GBps": sig(bw / 1e9), "latency_us": sig(a * 1e6)}
                              for k, bw, a in link.per_kind}
    return out


def link_name(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo-shm"


# ---- a new file -------------------------------------------------------------------------------

def build_cluster(result: Mapping[str, Any], intra: LinkFit | None, network: LinkFit | None,
                  name: str) -> dict[str, Any]:
    """A cluster-file dict describing exactly the measured ranks."""
    devices = [r["device"] for r in result["ranks"]]
    all_groups = []
    for ranks in result["nodes"]:
        all_groups.append([[ranks[i] for i in g] for g in group_ranks([devices[r] for r in ranks])])
    kinds = sum(len(g) for g in all_groups)
    nodes = []
    for groups in all_groups:
        entries = []
        for g in groups:
            fields = device_fields([devices[r] for r in g])
            base = devices[g[0]]["name"]
            label = base if kinds == 1 else f"{base}-{fields['tflops']['fp32'] * 1e3:.3g}gf"
            entries.append({"name": label, "count": len(g), **fields})
        node: dict[str, Any] = {"devices": entries}
        if sum(len(g) for g in groups) > 1:
            if intra is None:
                raise ValueError("a node with several ranks needs the intra-node link fit")
            node["intra_link"] = link_fields(intra, link_name(result["device_type"]))
        nodes.append(node)
    out: dict[str, Any] = {"name": name, "nodes": nodes}
    if len(nodes) > 1:
        if network is None:
            raise ValueError("several nodes need the network link fit")
        out["network"] = link_fields(network, "network")
    out["efficiency"] = efficiency_fields(result)
    out["launch_latency_us"] = launch_us(result)
    if "comm_overlap" in result:
        out["comm_overlap"] = sig(result["comm_overlap"])
    return out


# ---- merging into an existing file ------------------------------------------------------------

def merge_cluster(existing: Mapping[str, Any], result: Mapping[str, Any], intra: LinkFit | None,
                  network: LinkFit | None, where: str = "<cluster>") -> dict[str, Any]:
    """``existing`` (a cluster-file dict) with its numbers replaced by the measured ones."""
    current = parse_cluster(existing, where)          # its own errors first, one line each
    data = copy.deepcopy(dict(existing))
    devices = [r["device"] for r in result["ranks"]]
    measured_world = len(devices)
    slots = group_slots(data)                         # (node entry, group entry, ranks) in rank order
    if measured_world == current.world:
        for _, group, ranks in slots:
            _set_device_numbers(group, device_fields([devices[r] for r in ranks]))
    elif len(group_ranks(devices)) == 1 and current.is_homogeneous:
        fields = device_fields(devices)
        for _, group, _ in slots:
            _set_device_numbers(group, fields)
    else:
        raise UserError(f"measured {measured_world} rank(s) but the file has {current.world} devices of "
                        "several kinds; profile all of them (--nproc, or torchrun across the nodes) to merge",
                        where=where)
    if intra is not None:
        for node in data.get("nodes") or []:
            if node.get("intra_link") is not None:
                node["intra_link"] = _merged_link(node["intra_link"], intra)
    if network is not None and data.get("network") is not None:
        data["network"] = _merged_link(data["network"], network)
    eff = dict(data.get("efficiency") or {})
    eff.update(efficiency_fields(result))
    data["efficiency"] = eff
    data.pop("launch_latency_s", None)
    data["launch_latency_us"] = launch_us(result)
    if "comm_overlap" in result:
        data["comm_overlap"] = sig(result["comm_overlap"])
    return data


def group_slots(data: Mapping[str, Any]) -> list[tuple[dict, dict, list[int]]]:
    """Every device group of the file with the ranks it covers (a node ``count`` repeats them)."""
    per_group: dict[tuple[int, int], list[int]] = {}
    rank = 0
    nodes = data.get("nodes") or []
    for i, node in enumerate(nodes):
        for _ in range(int(node.get("count", 1))):
            for j, group in enumerate(node["devices"]):
                n = int(group["count"])
                per_group.setdefault((i, j), []).extend(range(rank, rank + n))
                rank += n
    return [(nodes[i], nodes[i]["devices"][j], ranks) for (i, j), ranks in per_group.items()]


def _set_device_numbers(group: dict, fields: Mapping[str, Any]) -> None:
    for key in _DEVICE_NUMBER_KEYS:
        group.pop(key, None)
    group.update(copy.deepcopy(dict(fields)))


def _merged_link(old: Any, fit: LinkFit) -> dict[str, Any]:
    """The old link's name (or catalog type) with the measured bandwidth and latency."""
    if isinstance(old, str):
        out: dict[str, Any] = {"name": old}
    else:
        out = {k: v for k, v in dict(old).items() if k not in _LINK_NUMBER_KEYS and k not in ("type", "collectives")}
        if "name" not in out and "type" in old:
            out["name"] = old["type"]
    out.update(link_numbers(fit.as_link(out.get("name", ""))))
    return out
