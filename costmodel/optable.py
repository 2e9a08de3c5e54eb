"""Per-op times measured on the device, used instead of the roofline where they exist.

One efficiency per op class cannot price a GPU: the fitted fractions of peak spread over
orders of magnitude within a class, so some models run several times slower than priced
and others several times faster. ``hapc profile --model`` therefore times every distinct op
*signature* of a model (op, constant arguments, input shapes and dtypes) forward and backward
on the device, at the whole size and at smaller pieces, and writes them beside the cluster
file (``cluster.yaml`` -> ``cluster.ops.json``). :func:`costmodel.compute.node_seconds` asks
the table first and falls back to the roofline.

A rank doing a ``fraction`` of a node's work is priced by interpolating between the measured
pieces (fractions 1, 1/2, 1/4 of the leading dimension); below the smallest piece the time
shrinks in proportion (a conservative-to-optimistic middle: a launch-bound op is then slightly
under-priced, which the measured launch latency in the roofline would not fix either).

A table measured on another device (its device name is not in the cluster) or under another
torch version (kernels change between releases) is ignored with a warning, never used to
price silently.
"""

from __future__ import annotations

import json
import warnings
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hapc.ir.graph import Graph, Node, Ref

FORMAT = "hapc-optable/1"
FRACTIONS = (1.0, 0.5, 0.25)


class MeasuredTableIgnored(UserWarning):
    """A per-op table that does not fit the cluster or this torch, so the roofline prices."""


def signature(node: Node, graph: Graph) -> str:
    """What determines an op's run time: the op, its constant arguments, and the shape, dtype
    and need for a gradient of each tensor it reads (value names anonymised by first use, so
    repeated layers share one signature)."""
    slot = {r: i for i, r in enumerate(dict.fromkeys(node.input_refs()))}

    def anon(a: Any) -> Any:
        if isinstance(a, Ref):
            return ["%", slot[a.name]]
        if isinstance(a, (list, tuple)):
            return [anon(x) for x in a]
        return a if isinstance(a, (int, float, bool, str)) or a is None else repr(a)

    metas = [[list(graph.meta(r).shape), graph.meta(r).dtype, graph.values[r].requires_grad] for r in slot]
    kwargs = {k: anon(v) for k, v in sorted(node.kwargs.items())}
    return json.dumps([node.op, anon(list(node.args)), kwargs, metas], separators=(",", ":"))


@dataclass
class OpTable:
    """Measured (fraction, forward s, backward s) points per op signature for one device."""

    device: str                       # the cluster file's device name these times are for
    device_name: str                  # what torch calls it ("NVIDIA H200", "cpu")
    torch_version: str
    entries: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    source: str = ""
    _sig_cache: dict[tuple[int, str], tuple[Graph, str]] = field(default_factory=dict, repr=False, compare=False)

    def lookup_seconds(self, node: Node, graph: Graph, fraction: float = 1.0) -> tuple[float, float] | None:
        """(forward, backward) seconds of ``node`` doing ``fraction`` of its work, or None."""
        points = self.entries.get(self._signature(node, graph))
        if not points:
            return None
        return _interpolate(sorted(points), fraction)

    def restricted_to(self, graph: Graph) -> OpTable:
        """The entries ``graph`` uses (what a plan keeps of a table shared by many models)."""
        used = {self._signature(n, graph) for n in graph.nodes}
        return OpTable(self.device, self.device_name, self.torch_version,
                       {k: v for k, v in self.entries.items() if k in used}, self.source)

    def covers(self, node: Node, graph: Graph) -> bool:
        return self._signature(node, graph) in self.entries

    def _signature(self, node: Node, graph: Graph) -> str:
        key = (id(graph), node.name)
        hit = self._sig_cache.get(key)
        if hit is None or hit[0] is not graph:
            hit = (graph, signature(node, graph))
            self._sig_cache[key] = hit
        return hit[1]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "device": self.device, "device_name": self.device_name,
                "torch": self.torch_version,
                "entries": {k: [list(p) for p in v] for k, v in sorted(self.entries.items())}}

    @staticmethod
    def from_dict(data: Mapping[str, Any], source: str = "") -> OpTable:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ValueError(f"not a per-op table (format should be {FORMAT!r})")
        entries = {str(k): [(float(f), float(a), float(b)) for f, a, b in v] for k, v in data["entries"].items()}
        return OpTable(str(data["device"]), str(data.get("device_name", "")), str(data["torch"]), entries, source)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=0, sort_keys=True) + "\n")


def _interpolate(points: Sequence[tuple[float, float, float]], fraction: float) -> tuple[float, float]:
    fracs = [p[0] for p in points]
    if fraction <= fracs[0]:
        f0, a0, b0 = points[0]
        return a0 * fraction / f0, b0 * fraction / f0
    if fraction >= fracs[-1]:
        f1, a1, b1 = points[-1]
        return a1 * fraction / f1, b1 * fraction / f1
    i = bisect_left(fracs, fraction)
    (f0, a0, b0), (f1, a1, b1) = points[i - 1], points[i]
    w = (fraction - f0) / (f1 - f0)
    return a0 + w * (a1 - a0), b0 + w * (b1 - b0)


def table_path(cluster_file: str | Path) -> Path:
    """Where the per-op table of a cluster file lives: ``cluster.yaml`` -> ``cluster.ops.json``."""
    return Path(cluster_file).with_suffix(".ops.json")


def usable_table(table: OpTable, device_names: Sequence[str], torch_version: str | None = None) -> OpTable | None:
    """``table`` if it was measured for a device of this cluster under this torch; else None,
    with a warning that says why the table is ignored."""
    import torch

    running = torch_version or torch.__version__
    where = table.source or "the per-op table"
    if table.device not in device_names:
        warnings.warn(f"{where}: measured on {table.device} ({table.device_name}), not a device of this "
                      f"cluster ({', '.join(sorted(set(device_names)))}); ignored, the roofline prices every op",
                      MeasuredTableIgnored, stacklevel=3)
        return None
    if table.torch_version != running:
        warnings.warn(f"{where}: measured under torch {table.torch_version}, this is torch {running}; "
                      "ignored (kernels change between versions), the roofline prices every op",
                      MeasuredTableIgnored, stacklevel=3)
        return None
    return table


def load_beside(cluster_file: str | Path, device_names: Sequence[str]) -> OpTable | None:
    """The usable per-op table beside ``cluster_file``, if there is one."""
    path = table_path(cluster_file)
    if not path.exists():
        return None
    try:
        table = OpTable.from_dict(json.loads(path.read_text()), str(path))
    except (ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"{path}: unreadable per-op table ({exc}); ignored", MeasuredTableIgnored, stacklevel=2)
        return None
    return usable_table(table, device_names)


def measured_share(graph: Graph, table: OpTable | None, device_names: Sequence[str] = ()) -> tuple[int, int]:
    """(nodes priced from measurements, nodes with work) for the report."""
    from costmodel.opclass import op_class

    working = [n for n in graph.nodes if op_class(n.op) != "view"]
    if table is None or (device_names and table.device not in device_names):
        return 0, len(working)
    return sum(table.covers(n, graph) for n in working), len(working)
