"""The cluster: devices in a fixed order, the machines (nodes) that hold them, and the links.

Everything here is in base units (flops per second, bytes, bytes per second, seconds):
conversion from the file's units (TFLOPS, GB, GB/s, Gb/s, microseconds) happens once, in
:mod:`costmodel.cluster_file`. Devices are numbered node by node and, inside a node, device
group by device group, exactly as the file lists them; rank ``i`` of an emitted program runs
on ``cluster.devices[i]``.

Memory sizes in GB are 10^9 bytes. Cards sold as "80GB" hold 80 GiB (about 86 * 10^9
bytes); reading the label as 10^9 leaves the difference for the CUDA context, NCCL buffers
and allocator fragmentation, which is the headroom a plan needs anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from costmodel.catalog import DTYPES


@dataclass(frozen=True)
class Link:
    """A link between two ranks: bandwidth per direction and latency per message.

    ``per_kind`` optionally gives other numbers for particular collectives, as
    ``((kind, bandwidth_Bps, latency_seconds), ...)``. A library does not run every
    collective equally well over the same wire: gloo's reduce-scatter on one host moves a
    byte about four times slower than its broadcast, and NCCL's bus bandwidth differs per
    collective too. ``hapc profile`` fits each measured kind on its own; kinds not listed use
    the link's own numbers.
    """

    name: str
    bandwidth_Bps: float
    latency_seconds: float
    per_kind: tuple[tuple[str, float, float], ...] = ()

    def seconds(self, nbytes: float) -> float:
        """Alpha-beta time of one message of ``nbytes`` over this link."""
        return self.latency_seconds + nbytes / self.bandwidth_Bps

    def for_kind(self, kind: str) -> Link:
        """The link as ``kind`` sees it: its own numbers for that collective, if it has them."""
        for k, bandwidth, latency in self.per_kind:
            if k == kind:
                return Link(self.name, bandwidth, latency)
        return Link(self.name, self.bandwidth_Bps, self.latency_seconds) if self.per_kind else self

    def scaled(self, bandwidth: float = 1.0, latency: float = 1.0) -> Link:
        """Every bandwidth times ``bandwidth`` and every latency times ``latency``."""
        return Link(self.name, self.bandwidth_Bps * bandwidth, self.latency_seconds * latency,
                    tuple((k, b * bandwidth, t * latency) for k, b, t in self.per_kind))

    def __repr__(self) -> str:
        extra = "".join(f", {k} {b / 1e9:g} GB/s {t * 1e6:g} us" for k, b, t in self.per_kind)
        return f"{self.name}({self.bandwidth_Bps / 1e9:g} GB/s, {self.latency_seconds * 1e6:g} us{extra})"


@dataclass(frozen=True)
class Device:
    """One accelerator (or CPU process): its rank, node and published capabilities."""

    index: int
    node: int
    type: str
    peak_flops: Mapping[str, float]     # dtype ("fp32", "tf32", "bf16", "fp16") -> flop/s
    memory_bytes: int
    hbm_bandwidth_Bps: float
    # Dtypes whose peak above is the fp32 one filled in: the device has no rate of its own for them.
    unrated: frozenset[str] = frozenset()

    def flops(self, dtype: str) -> float:
        return self.peak_flops[dtype]

    def __repr__(self) -> str:
        return (f"Device({self.index}: {self.type} on node {self.node}, "
                f"{self.peak_flops['fp32'] / 1e12:g} TFLOPS fp32, {self.memory_bytes / 1e9:g} GB)")


@dataclass(frozen=True)
class GroupShape:
    """A group of ranks as the collective formulas see it (:meth:`Cluster.group_shape`).

    ``by_node`` holds the members node by node (nodes in order, in the node's device order),
    ``positions`` each node's members as indices into ``ranks`` (where their piece sizes sit),
    ascending,
    ``node_links`` the link inside each node's part (None for a part of one rank) and ``link``
    the slowest link of the whole group (:meth:`Cluster.group_link`).
    """

    ranks: tuple[int, ...]
    by_node: tuple[tuple[int, ...], ...]
    positions: tuple[tuple[int, ...], ...]
    node_links: tuple[Link | None, ...]
    link: Link | None

    @property
    def spans_nodes(self) -> bool:
        return len(self.by_node) > 1


@dataclass(frozen=True)
class Host:
    """One machine of the cluster: the ranks it holds and the link between them."""

    index: int
    devices: tuple[int, ...]
    intra_link: Link | None     # None only for a single-device node


@dataclass
class Cluster:
    """A heterogeneous cluster as the cost model sees it.

    ``efficiency`` holds one fraction-of-peak per op class (see :mod:`costmodel.opclass`);
    ``allow_tf32`` lets fp32 products use the TF32 peak (PyTorch's default is off for
    matmuls, so the default here is off too); ``launch_latency_seconds`` is the fixed cost
    of one kernel launch. ``comm_overlap`` is the fraction of an asynchronous collective's
    time that compute on the same devices can hide: about 1 where communication has its own
    engines (NCCL on GPUs), about 0 where it runs on the cores that compute (gloo on a CPU
    rank with one core); ``hapc profile`` measures it.
    """

    devices: list[Device]
    nodes: list[Host]
    network: Link | None
    efficiency: dict[str, float]
    name: str = ""
    allow_tf32: bool = False
    launch_latency_seconds: float = 5e-6
    comm_overlap: float = 1.0
    source: str = field(default="", compare=False)
    # How the file was read where a reader should know (a short device name's memory size).
    notes: list[str] = field(default_factory=list, compare=False, repr=False)
    # Per-op times measured on the device (costmodel.optable.OpTable), or None: roofline only.
    op_table: Any = field(default=None, compare=False)
    _kind_views: dict[str, Cluster] = field(default_factory=dict, init=False, repr=False, compare=False)
    _groups: dict[tuple[int, ...] | None, GroupShape] = field(default_factory=dict, init=False, repr=False,
                                                              compare=False)
    _kinds: tuple[int, ...] | None = field(default=None, init=False, repr=False, compare=False)

    # ---- structure -------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return len(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def node_of(self, rank: int) -> int:
        return self.devices[rank].node

    def ranks_by_node(self, ranks: Iterable[int] | None = None) -> list[list[int]]:
        """The given ranks (default: all) grouped by node, nodes in order, empty groups dropped."""
        return [list(g) for g in self.group_shape(ranks).by_node]

    def group_shape(self, ranks: Iterable[int] | None = None) -> GroupShape:
        """How the group ``ranks`` (default: all) sits on the nodes, made once per group.

        Every collective formula needs this (nodes spanned, members per node, the slowest
        link); collectives over the same group are priced thousands of times per synthesis,
        and building it is linear in devices while the formulas are linear in nodes.
        """
        key = None if ranks is None else tuple(ranks)
        if key is not None and key == tuple(range(self.world)):
            key = None
        shape = self._groups.get(key)
        if shape is None:
            shape = self._groups[key] = self._make_group_shape(key)
        return shape

    def _make_group_shape(self, ranks: tuple[int, ...] | None) -> GroupShape:
        members = tuple(range(self.world)) if ranks is None else ranks
        position = {r: i for i, r in enumerate(members)}
        by_node = tuple(g for g in (tuple(r for r in host.devices if r in position) for host in self.nodes) if g)
        node_links = tuple(self.nodes[self.node_of(g[0])].intra_link if len(g) > 1 else None for g in by_node)
        links = [lk for lk in node_links if lk is not None]
        if len(by_node) > 1 and self.network is not None:
            links.append(self.network)
        link = None
        if links:
            slow = min(links, key=lambda lk: lk.bandwidth_Bps)
            latency = max(lk.latency_seconds for lk in links)
            link = slow if latency == slow.latency_seconds else Link(slow.name, slow.bandwidth_Bps, latency)
        return GroupShape(members, by_node, tuple(tuple(sorted(position[r] for r in g)) for g in by_node),
                          node_links, link)

    def for_collective(self, kind: str) -> Cluster:
        """The cluster with every link replaced by what ``kind`` sees of it (:meth:`Link.for_kind`).

        Itself when no link has per-collective numbers; otherwise a view built once per kind.
        """
        view = self._kind_views.get(kind)
        if view is None:
            links = [h.intra_link for h in self.nodes] + [self.network]
            if not any(lk is not None and lk.per_kind for lk in links):
                view = self
            else:
                def see(lk: Link | None) -> Link | None:
                    return None if lk is None else lk.for_kind(kind)

                view = replace(self, nodes=[Host(h.index, h.devices, see(h.intra_link)) for h in self.nodes],
                               network=see(self.network))
            self._kind_views[kind] = view
        return view

    def link(self, a: int, b: int) -> Link | None:
        """The link a message from rank ``a`` to rank ``b`` crosses (None when a == b)."""
        if a == b:
            return None
        na, nb = self.node_of(a), self.node_of(b)
        return self.nodes[na].intra_link if na == nb else self.network

    def group_link(self, ranks: Iterable[int] | None = None) -> Link | None:
        """The slowest link inside a group: a collective over the group runs at its pace.

        Bandwidth is the smallest and latency the largest over the links the group uses
        (intra-node links of nodes holding two or more members, the network if it spans
        nodes). None for a group of one rank.
        """
        return self.group_shape(ranks).link

    def device_kinds(self) -> tuple[int, ...]:
        """Each rank's kind of device, numbered in order of first appearance: ranks of one kind
        have the same type and capabilities (peaks, memory, HBM bandwidth), so the cost model
        prices them alike (:mod:`costmodel.classes`). Made once per cluster."""
        if self._kinds is None:
            index: dict[tuple, int] = {}
            self._kinds = tuple(index.setdefault(
                (d.type, tuple(sorted(d.peak_flops.items())), d.memory_bytes, d.hbm_bandwidth_Bps), len(index))
                for d in self.devices)
        return self._kinds

    # ---- capabilities ----------------------------------------------------------------------
    def peak_flops(self, rank: int, dtype: str = "fp32") -> float:
        return self.devices[rank].flops(dtype)

    def effective_flops(self, rank: int, op_class: str = "matmul", dtype: str = "fp32") -> float:
        """Peak times the class efficiency: what a well-fed op of that class gets per second."""
        return self.devices[rank].flops(dtype) * self.efficiency[op_class]

    def memory_bytes(self) -> list[int]:
        return [d.memory_bytes for d in self.devices]

    @property
    def is_homogeneous(self) -> bool:
        first = self.devices[0]
        return all((d.peak_flops, d.memory_bytes, d.hbm_bandwidth_Bps) ==
                   (first.peak_flops, first.memory_bytes, first.hbm_bandwidth_Bps) for d in self.devices)

    def flops_shares(self, dtype: str = "fp32") -> tuple[float, ...]:
        """Per-device shares proportional to peak FLOPS (the FLOPs-proportional baseline)."""
        peaks = [d.flops(dtype) for d in self.devices]
        total = sum(peaks)
        return tuple(p / total for p in peaks)

    # ---- presentation ----------------------------------------------------------------------
    def describe(self) -> str:
        """Compact composition: ``"2x(8x V100-32GB) + 6x(8x P100-16GB)"``."""
        parts: list[tuple[str, int]] = []
        for host in self.nodes:
            counts: list[tuple[str, int]] = []
            for r in host.devices:
                t = self.devices[r].type
                if counts and counts[-1][0] == t:
                    counts[-1] = (t, counts[-1][1] + 1)
                else:
                    counts.append((t, 1))
            shape = " + ".join(f"{n}x {t}" for t, n in counts)
            if parts and parts[-1][0] == shape:
                parts[-1] = (shape, parts[-1][1] + 1)
            else:
                parts.append((shape, 1))
        return " + ".join(s if n == 1 else f"{n}x({s})" for s, n in parts)

    def __repr__(self) -> str:
        name = f"{self.name!r}, " if self.name else ""
        total_tflops = sum(d.flops("fp32") for d in self.devices) / 1e12
        net = f", network {self.network!r}" if self.network and len(self.nodes) > 1 else ""
        return (f"Cluster({name}{self.world} devices on {len(self.nodes)} node(s): {self.describe()}; "
                f"{total_tflops:g} TFLOPS fp32{net})")

    def to_dict(self) -> dict[str, Any]:
        """The cluster-file form, in base units, such that ``load_cluster(c.to_dict()) == c``."""
        nodes: list[dict[str, Any]] = []
        for host in self.nodes:
            groups: list[dict[str, Any]] = []
            for r in host.devices:
                d = _device_dict(self.devices[r])
                if groups and {k: v for k, v in groups[-1].items() if k != "count"} == d:
                    groups[-1]["count"] += 1
                else:
                    groups.append({**d, "count": 1})
            entry: dict[str, Any] = {"count": 1, "devices": groups}
            if host.intra_link is not None:
                entry["intra_link"] = _link_dict(host.intra_link)
            if nodes and {k: v for k, v in nodes[-1].items() if k != "count"} == \
                    {k: v for k, v in entry.items() if k != "count"}:
                nodes[-1]["count"] += 1
            else:
                nodes.append(entry)
        out: dict[str, Any] = {"name": self.name, "nodes": nodes}
        if self.network is not None:
            out["network"] = _link_dict(self.network)
        out["efficiency"] = dict(self.efficiency)
        out["allow_tf32"] = self.allow_tf32
        out["launch_latency_s"] = self.launch_latency_seconds
        out["comm_overlap"] = self.comm_overlap
        if self.op_table is not None:
            out["measured_ops"] = self.op_table.to_dict()
        return out


def _device_dict(d: Device) -> dict[str, Any]:
    return {"name": d.type, "peak_flops": {k: d.peak_flops[k] for k in DTYPES if k not in d.unrated},
            "memory_bytes": d.memory_bytes, "hbm_Bps": d.hbm_bandwidth_Bps}


def _link_dict(link: Link) -> dict[str, Any]:
    out: dict[str, Any] = {"name": link.name, "bandwidth_Bps": link.bandwidth_Bps, "latency_s": link.latency_seconds}
    if link.per_kind:
        out["collectives"] = {k: {"bandwidth_Bps": b, "latency_s": t} for k, b, t in link.per_kind}
    return out


def load_cluster(source: str | Path | Mapping[str, Any] | Cluster) -> Cluster:
    """A :class:`Cluster` from a cluster file path, a dict in the file's form, or a Cluster.

    Every problem raises :class:`hapc.errors.UserError` with one line naming the file, the
    field path and what was expected.
    """
    from costmodel.cluster_file import parse_cluster, read_cluster_file

    if isinstance(source, Cluster):
        return source
    if isinstance(source, Mapping):
        return parse_cluster(source, "<cluster dict>")
    return read_cluster_file(source)
