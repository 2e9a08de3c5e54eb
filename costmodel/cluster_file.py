"""Reading and validating a cluster file (the YAML contract of design.md section 3).

Units live in key names: ``bandwidth_GBps`` (10^9 bytes/s), ``bandwidth_Gbps`` (10^9 bits/s),
``latency_us``, ``tflops``, ``memory_GB``, ``hbm_GBps``. The base-unit spellings
``bandwidth_Bps``, ``latency_s``, ``peak_flops``, ``memory_bytes``, ``hbm_Bps`` are accepted
too (:meth:`Cluster.to_dict` writes them, so a dump loads back exactly). A bare
``bandwidth: 25`` is refused: 25 what? Mixing up bits and bytes is an 8x error in every
communication cost, the kind HAP's released model made.

Optional top-level keys: ``name``; ``efficiency`` (fraction of peak per op class, see
:mod:`costmodel.opclass`; the profiler writes measured ones); ``allow_tf32`` (price fp32
products at the TF32 peak); ``launch_latency_us`` (one kernel launch, default 5);
``comm_overlap`` (the fraction of asynchronous communication compute can hide, default 1). A node
holding several devices needs its ``intra_link``; a cluster of several nodes its ``network``
(bandwidth per node, i.e. one network card shared by the node's devices). A link given by
bandwidth alone gets a 10 us latency. A link may add ``collectives: {reduce_scatter:
{bandwidth_GBps: .., latency_us: ..}, ...}``: its numbers for particular collectives (what
``hapc profile`` fits per kind), the link's own numbers for the rest.

Every error is a :class:`UserError` of one line: ``FILE: FIELD.PATH: what was wrong;
expected ...``.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import isnan
from pathlib import Path
from typing import Any

from costmodel.catalog import DTYPES, alias_note, device_names, device_spec, link_names, link_spec
from costmodel.cluster import Cluster, Device, Host, Link
from costmodel.opclass import DEFAULT_EFFICIENCY
from hapc.errors import UserError

DEFAULT_LINK_LATENCY_US = 10.0     # for a link given by bandwidth alone
DEFAULT_LAUNCH_LATENCY_US = 5.0    # one kernel launch (CUDA); a cluster file may override

_TOP_KEYS = ("name", "nodes", "network", "efficiency", "allow_tf32", "launch_latency_us", "launch_latency_s",
             "comm_overlap", "measured_ops")
_NODE_KEYS = ("count", "devices", "intra_link", "name")
# The most devices a cluster file may describe: checked before any is built, so that a typo
# (count: 1000000000) is one line, not minutes of allocation. Far above the clusters the planner
# is meant for (the largest training runs use tens of thousands of GPUs).
MAX_DEVICES = 1 << 17
_DEVICE_KEYS = ("type", "count", "name", "tflops", "peak_flops", "memory_GB", "memory_bytes", "hbm_GBps",
                "hbm_Bps")
_LINK_KEYS = ("type", "name", "bandwidth_GBps", "bandwidth_Gbps", "bandwidth_Bps", "latency_us", "latency_s",
              "collectives")
_LINK_NUMBER_KEYS = ("bandwidth_GBps", "bandwidth_Gbps", "bandwidth_Bps", "latency_us", "latency_s")
# Collectives a link may give its own numbers for (what ``hapc profile`` measures).
LINK_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")


class _Ctx:
    """Where we are in the file, for error messages."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.notes: list[str] = []       # not errors: what a reader should know about how it was read

    def fail(self, path: str, message: str) -> UserError:
        return UserError(f"{path}: {message}" if path else message, where=self.file)


def read_cluster_file(path: str | Path) -> Cluster:
    """Load and validate a cluster YAML file."""
    p = Path(path)
    label = str(path)
    if not p.is_file():
        hint = "" if p.suffix in (".yaml", ".yml") else " (a cluster file is YAML, e.g. configs/clusters/*.yaml)"
        raise UserError(f"no such cluster file{hint}", where=label)
    import yaml      # here, not at the top: a plan.json carries its cluster as a dict (hapc replan never reads YAML)

    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"not valid YAML: {at}{problem}", where=label) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the cluster file: {exc}", where=label) from None
    cluster = parse_cluster(data, label)
    cluster.source = label
    if cluster.op_table is None:       # per-op times measured on the device, beside the file
        from costmodel.optable import load_beside

        cluster.op_table = load_beside(p, [d.type for d in cluster.devices])
    return cluster


def parse_cluster(data: Any, file: str = "<cluster dict>") -> Cluster:
    """Validate the file's structure and build the :class:`Cluster` in base units."""
    ctx = _Ctx(file)
    if not isinstance(data, Mapping):
        raise ctx.fail("nodes", "empty cluster: the file is empty; expected 'nodes:' (a list of nodes with devices)"
                       if data is None else f"expected a mapping with 'nodes:' at the top, got {type(data).__name__}")
    _check_keys(ctx, "", data, _TOP_KEYS)
    nodes_data = data.get("nodes")
    if not nodes_data:
        raise ctx.fail("nodes", "empty cluster: expected a list of nodes, "
                       "each like {devices: [{type: A100-80GB, count: 8}], intra_link: nvlink3}")
    if not isinstance(nodes_data, list):
        raise ctx.fail("nodes", f"expected a list of nodes, got {type(nodes_data).__name__}")

    shapes = []          # (how many such nodes, their device kinds, their link), read before any is built
    total = 0
    for i, nd in enumerate(nodes_data):
        path = f"nodes[{i}]"
        if not isinstance(nd, Mapping):
            raise ctx.fail(path, f"expected a mapping with 'devices:', got {nd!r}")
        _check_keys(ctx, path, nd, _NODE_KEYS)
        repeat = _count(ctx, f"{path}.count", nd.get("count", 1))
        groups = nd.get("devices")
        if not groups:
            raise ctx.fail(f"{path}.devices", "missing or empty; expected a list like [{type: V100-32GB, count: 8}]")
        if not isinstance(groups, list):
            raise ctx.fail(f"{path}.devices", f"expected a list of device groups, got {type(groups).__name__}")
        kinds = [_device_group(ctx, f"{path}.devices[{j}]", g) for j, g in enumerate(groups)]
        per_node = sum(n for _, n in kinds)
        total += repeat * per_node
        if total > MAX_DEVICES:
            raise ctx.fail(f"{path}.count" if repeat > 1 else f"{path}.devices",
                           f"{repeat} node(s) of {per_node} devices bring the cluster to {total} devices; "
                           f"hapc plans clusters of at most {MAX_DEVICES}")
        intra = None
        if "intra_link" in nd and nd["intra_link"] is not None:
            intra = _link(ctx, f"{path}.intra_link", nd["intra_link"])
        elif per_node > 1:
            raise ctx.fail(f"{path}.intra_link", f"missing; a node with {per_node} devices needs the link "
                           "between them: a name (nvlink3, pcie4, ...) or {bandwidth_GBps: .., latency_us: ..}")
        shapes.append((repeat, kinds, intra))

    devices: list[Device] = []
    hosts: list[Host] = []
    for repeat, kinds, intra in shapes:
        for _ in range(repeat):
            node_index = len(hosts)
            ranks = []
            for (name, peaks, mem, hbm, unrated), n in kinds:
                for _ in range(n):
                    ranks.append(len(devices))
                    devices.append(Device(len(devices), node_index, name, peaks, mem, hbm, unrated))
            hosts.append(Host(node_index, tuple(ranks), intra))

    network = None
    if data.get("network") is not None:
        network = _link(ctx, "network", data["network"])
    elif len(hosts) > 1:
        raise ctx.fail("network", f"missing; a cluster of {len(hosts)} nodes needs the link between nodes, "
                       "e.g. {bandwidth_Gbps: 25, latency_us: 30} or a name (ethernet25g, infiniband-hdr)")

    efficiency = dict(DEFAULT_EFFICIENCY)
    eff = data.get("efficiency") or {}
    if not isinstance(eff, Mapping):
        raise ctx.fail("efficiency", f"expected a mapping of op class to a fraction, got {eff!r}")
    for key, value in eff.items():
        if key not in DEFAULT_EFFICIENCY:
            raise ctx.fail(f"efficiency.{key}", f"unknown op class; expected one of {', '.join(DEFAULT_EFFICIENCY)}")
        x = _number(ctx, f"efficiency.{key}", value)
        if not 0 < x <= 1:
            raise ctx.fail(f"efficiency.{key}", f"expected a fraction of peak in (0, 1], got {value}")
        efficiency[key] = x

    allow_tf32 = data.get("allow_tf32", False)
    if not isinstance(allow_tf32, bool):
        raise ctx.fail("allow_tf32", f"expected true or false, got {allow_tf32!r}")
    if "launch_latency_s" in data:
        launch = _number(ctx, "launch_latency_s", data["launch_latency_s"], zero_ok=True)
    else:
        launch = _number(ctx, "launch_latency_us", data.get("launch_latency_us", DEFAULT_LAUNCH_LATENCY_US),
                         zero_ok=True) * 1e-6
    overlap = _number(ctx, "comm_overlap", data.get("comm_overlap", 1.0), zero_ok=True)
    if overlap > 1:
        raise ctx.fail("comm_overlap", f"expected a fraction in [0, 1], got {data['comm_overlap']}")
    name = data.get("name") or ""
    if not isinstance(name, str):
        name = str(name)
    cluster = Cluster(devices, hosts, network, efficiency, name, allow_tf32, launch, overlap, source=file,
                      notes=ctx.notes)
    if data.get("measured_ops") is not None:     # a plan's copy of the table it was priced with
        from costmodel.optable import OpTable, usable_table

        try:
            table = OpTable.from_dict(data["measured_ops"], f"{file}: measured_ops")
        except (ValueError, KeyError, TypeError) as exc:
            raise ctx.fail("measured_ops", f"not a per-op table ({exc})") from None
        cluster.op_table = usable_table(table, [d.type for d in devices])
    return cluster


def _check_keys(ctx: _Ctx, path: str, data: Mapping, allowed: tuple[str, ...]) -> None:
    for key in data:
        if key in allowed:
            continue
        where = f"{path}.{key}" if path else str(key)
        if str(key) in ("bandwidth", "latency", "memory", "hbm", "flops"):
            units = {"bandwidth": "bandwidth_GBps (bytes/s) or bandwidth_Gbps (bits/s)",
                     "latency": "latency_us", "memory": "memory_GB", "hbm": "hbm_GBps",
                     "flops": "tflops"}[str(key)]
            raise ctx.fail(where, f"a number without its unit; put the unit in the key: {units}")
        raise ctx.fail(where, f"unknown field; expected one of {', '.join(allowed)}")


def _number(ctx: _Ctx, path: str, value: Any, *, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ctx.fail(path, f"expected a number, got {value!r}")
    if isnan(value) or value < 0 or (value == 0 and not zero_ok):
        raise ctx.fail(path, f"expected a {'non-negative' if zero_ok else 'positive'} number, got {value}")
    return float(value)


def _count(ctx: _Ctx, path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ctx.fail(path, f"expected a positive whole number, got {value!r}")
    if value < 1:
        raise ctx.fail(path, f"expected a positive whole number, got {value}")
    return value


def _device_group(ctx: _Ctx, path: str, g: Any) -> tuple[tuple[str, dict[str, float], int, float, frozenset], int]:
    """((type name, peak flop/s per dtype, memory bytes, HBM bytes/s, unrated dtypes), count) of
    one device group."""
    if isinstance(g, str):
        raise ctx.fail(path, f"expected {{type: {g}, count: N}}, got a bare name")
    if not isinstance(g, Mapping):
        raise ctx.fail(path, f"expected a mapping like {{type: V100-32GB, count: 8}}, got {g!r}")
    _check_keys(ctx, path, g, _DEVICE_KEYS)
    if "count" not in g:
        raise ctx.fail(f"{path}.count", "missing; expected how many devices of this kind the node holds")
    count = _count(ctx, f"{path}.count", g["count"])

    peaks: dict[str, float] | None = None
    unrated: frozenset[str] = frozenset()
    memory: float | None = None
    hbm: float | None = None
    name = g.get("name")
    if "type" in g:
        spec = device_spec(str(g["type"]))
        if spec is None:
            known = ", ".join(device_names()[:8])
            raise ctx.fail(f"{path}.type", f"unknown device type {g['type']!r}; expected a catalog name "
                           f"({known}, ...) or your own tflops, memory_GB, hbm_GBps")
        peaks, unrated = {k: v * 1e12 for k, v in spec.tflops.items()}, spec.unrated
        memory, hbm = spec.memory_GB * 1e9, spec.hbm_GBps * 1e9
        note = alias_note(str(g["type"])) if "memory_GB" not in g and "memory_bytes" not in g else None
        if note is not None and not any(f" as {spec.name} " in n for n in ctx.notes):     # once per type
            ctx.notes.append(f"{ctx.file}: {path}.{note}")
        name = name or spec.name
    if "tflops" in g or "peak_flops" in g:
        key, scale = ("tflops", 1e12) if "tflops" in g else ("peak_flops", 1.0)
        peaks, unrated = _peaks(ctx, f"{path}.{key}", g[key], scale, peaks, unrated)
    if "memory_GB" in g:
        memory = _number(ctx, f"{path}.memory_GB", g["memory_GB"]) * 1e9
    if "memory_bytes" in g:
        memory = _number(ctx, f"{path}.memory_bytes", g["memory_bytes"])
    if "hbm_GBps" in g:
        hbm = _number(ctx, f"{path}.hbm_GBps", g["hbm_GBps"]) * 1e9
    if "hbm_Bps" in g:
        hbm = _number(ctx, f"{path}.hbm_Bps", g["hbm_Bps"])
    for field_name, got in (("tflops", peaks), ("memory_GB", memory), ("hbm_GBps", hbm)):
        if got is None:
            raise ctx.fail(f"{path}.{field_name}" if "type" not in g else f"{path}.type",
                           "missing; a device without a catalog 'type' needs tflops, memory_GB and hbm_GBps")
    return (str(name or "custom"), peaks, round(memory), hbm, unrated), count


def _peaks(ctx: _Ctx, path: str, value: Any, scale: float, base: dict[str, float] | None,
           unrated: frozenset[str]) -> tuple[dict[str, float], frozenset[str]]:
    """(peaks, unrated dtypes) from a single number (every dtype, each rated at it) or a
    per-dtype mapping; dtypes left out keep the catalog's value (and its rating) or fall back
    to fp32, unrated."""
    if isinstance(value, Mapping):
        for k in value:
            if k not in DTYPES:
                raise ctx.fail(f"{path}.{k}", f"unknown dtype; expected one of {', '.join(DTYPES)}")
        given = {k: _number(ctx, f"{path}.{k}", v) * scale for k, v in value.items()}
        if base is None and "fp32" not in given:
            raise ctx.fail(f"{path}.fp32", "missing; a custom device needs at least its fp32 peak")
        out = dict(base) if base else {}
        out.update(given)
        missing = unrated if base else frozenset(k for k in DTYPES if k not in out)
        return {k: out.get(k, out["fp32"]) for k in DTYPES}, frozenset(missing - set(given))
    x = _number(ctx, path, value) * scale
    return {k: x for k in DTYPES}, frozenset()


def _link(ctx: _Ctx, path: str, value: Any) -> Link:
    if isinstance(value, str):
        spec = link_spec(value)
        if spec is None:
            raise ctx.fail(path, f"unknown link {value!r}; expected one of {', '.join(link_names())} "
                           "or {bandwidth_GBps: .., latency_us: ..}")
        return Link(spec.name, spec.bandwidth_GBps * 1e9, spec.latency_us * 1e-6)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ctx.fail(path, f"a bandwidth without its unit ({value}); write {{bandwidth_GBps: {value}}} "
                       f"(bytes/s) or {{bandwidth_Gbps: {value}}} (bits/s)")
    if not isinstance(value, Mapping):
        raise ctx.fail(path, f"expected a link name or a mapping with bandwidth_GBps/bandwidth_Gbps, got {value!r}")
    _check_keys(ctx, path, value, _LINK_KEYS)
    name, bandwidth, latency = None, None, None
    if "type" in value:
        spec = link_spec(str(value["type"]))
        if spec is None:
            raise ctx.fail(f"{path}.type", f"unknown link {value['type']!r}; expected one of {', '.join(link_names())}")
        name, bandwidth, latency = spec.name, spec.bandwidth_GBps * 1e9, spec.latency_us * 1e-6
    given = [k for k in ("bandwidth_GBps", "bandwidth_Gbps", "bandwidth_Bps") if k in value]
    if len(given) > 1:
        raise ctx.fail(f"{path}.{given[1]}", f"two bandwidths given ({', '.join(given)}); expected one")
    if given:
        key = given[0]
        scale = {"bandwidth_GBps": 1e9, "bandwidth_Gbps": 1e9 / 8, "bandwidth_Bps": 1.0}[key]
        bandwidth = _number(ctx, f"{path}.{key}", value[key]) * scale
    if bandwidth is None:
        raise ctx.fail(f"{path}.bandwidth_GBps", "missing; expected bandwidth_GBps (bytes/s) or "
                       "bandwidth_Gbps (bits/s), or a catalog type")
    if "latency_s" in value:
        latency = _number(ctx, f"{path}.latency_s", value["latency_s"], zero_ok=True)
    elif "latency_us" in value:
        latency = _number(ctx, f"{path}.latency_us", value["latency_us"], zero_ok=True) * 1e-6
    elif latency is None:
        latency = DEFAULT_LINK_LATENCY_US * 1e-6
    if value.get("name"):
        name = str(value["name"])
    if name is None:
        name = "link"
    per_kind = _per_collective(ctx, f"{path}.collectives", value.get("collectives"), bandwidth, latency)
    return Link(name, bandwidth, latency, per_kind)


def _per_collective(ctx: _Ctx, path: str, value: Any, bandwidth: float,
                    latency: float) -> tuple[tuple[str, float, float], ...]:
    """``collectives: {all_gather: {bandwidth_GBps: .., latency_us: ..}, ...}``: numbers for
    particular collectives over this link; a number left out is the link's own."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ctx.fail(path, f"expected a mapping of collective -> {{bandwidth_GBps, latency_us}}, got {value!r}")
    out = []
    for kind in sorted(value, key=str):
        where = f"{path}.{kind}"
        if kind not in LINK_COLLECTIVES:
            raise ctx.fail(where, f"unknown collective; expected one of {', '.join(LINK_COLLECTIVES)}")
        entry = value[kind]
        if not isinstance(entry, Mapping):
            raise ctx.fail(where, f"expected {{bandwidth_GBps: .., latency_us: ..}}, got {entry!r}")
        _check_keys(ctx, where, entry, _LINK_NUMBER_KEYS)
        full = dict(entry)
        if not any(k.startswith("bandwidth") for k in entry):
            full["bandwidth_Bps"] = bandwidth
        if not any(k.startswith("latency") for k in entry):
            full["latency_s"] = latency
        link = _link(ctx, where, full)
        out.append((str(kind), link.bandwidth_Bps, link.latency_seconds))
    return tuple(out)
