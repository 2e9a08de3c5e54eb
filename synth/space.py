"""The search space: for every node, its strategies and their prices; liveness; segments.

Values fall into three kinds for the search:

* **activations** (node results) — tracked in the search state with the layouts they are
  currently held in, until their last use;
* **parameters** — stored in one layout (``Replicate`` costs a gradient all-reduce, ``Shard``
  costs nothing) and moved to whatever layout each use wants;
* **free values** (the batch, buffers, constants) — every rank can take any piece of them at
  no cost (it loads or holds the whole).

**Segments** are runs of nodes between *cut points*, where at most one activation is live
(between transformer blocks only the residual stream is). Two segments with the same
structure (op, shapes, constants, wiring; not names) have the same optimal sub-plans, so the
search solves each distinct segment once: that is what makes its time grow about linearly
with depth while HAP's grows quadratically.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from hapc.ir.graph import Graph, Node, Ref
from hapc.ir.layout import ExpertRows, Layout, Partial, Replicate, Shard
from hapc.ir.program import Strategy
from hapc.rules.expert_rows import expert_row_values
from hapc.rules.registry import strategies
from synth.costs import Prices

ACT, PARAM, FREE = "act", "param", "free"


@dataclass
class NodeSpace:
    index: int
    node: Node
    options: list[Strategy]
    compute_seconds: list[float]
    lower_bound_seconds: float
    inputs: list[tuple[str, str]]          # (value, kind) per tensor argument
    signature: tuple = ()


@dataclass
class Segment:
    start: int                 # first node index
    stop: int                  # one past the last node index
    entry: tuple[str, ...]     # the activations live when the segment starts
    exit: tuple[str, ...]      # the activations live when it ends (the loss, after the last)
    signature: str = ""


@dataclass
class SearchSpace:
    graph: Graph
    prices: Prices
    nodes: list[NodeSpace]
    last_use: dict[str, int]
    segments: list[Segment] = field(default_factory=list)
    param_uses: dict[str, int] = field(default_factory=dict)
    allow_replicated_params: bool = True
    live: list[list[str]] = field(default_factory=list)
    # Segments whose exact search ran out of states before on this cluster (under any shares):
    # every search of the same graph there beams them at once instead of spending the budget.
    hard_segments: set[str] = field(default_factory=set)

    @staticmethod
    def build(graph: Graph, prices: Prices, *, allow_replicated_params: bool = True,
              free_layouts: tuple[Layout, ...] | None = None) -> SearchSpace:
        """``free_layouts`` restricts how free values (the batch) may be read, e.g. to
        ``(Replicate(),)`` for tensor-parallel-only programs; parameters stored ``Replicate``
        can be forbidden (memory pressure) with ``allow_replicated_params=False``."""
        shape = _structure_of(graph)
        nodes = []
        seen: dict[int, tuple[list[Strategy], list[float], float]] = {}
        for i, node in enumerate(graph.nodes):
            key, key_id = shape.keys[i], shape.key_ids[i]
            if key_id not in seen:       # repeated layers share strategies and prices
                options = [s for s in shape.strategies(key, node)
                           if _allowed(s, node, graph, shape.kinds, free_layouts, prices.world)]
                compute = [prices.compute_seconds(node, s, key) for s in options]
                seen[key_id] = (options, compute, prices.node_lower_bound(node, key))
            options, compute, lb = seen[key_id]
            nodes.append(NodeSpace(i, node, options, compute, lb, shape.inputs[i], key))
        space = SearchSpace(graph, prices, nodes, shape.last_use, param_uses=shape.param_uses,
                            allow_replicated_params=allow_replicated_params)
        if shape.live is None:
            shape.live = space.live = live_sets(space)
            shape.segments = _segments(space)
        space.live = shape.live
        space.segments = list(shape.segments)
        space.hard_segments = shape.hard_segments_on(prices.cluster)
        return space

    @property
    def _producer_index(self) -> dict[str, int]:
        if not hasattr(self, "_prod"):
            self._prod = {o: i for i, n in enumerate(self.graph.nodes) for o in n.outputs}
        return self._prod


@dataclass
class _GraphShape:
    """What a search space takes from the graph alone, not from prices: value kinds, last
    uses, each node's cost key and unfiltered strategies, liveness and segments. The outer
    loop builds a space per LP round and overlap assumption, and the baselines more; all of
    them share this, derived once per graph (see :func:`_structure_of`)."""

    graph: Graph
    size: tuple[int, int, str]
    kinds: dict[str, str]
    last_use: dict[str, int]
    param_uses: dict[str, int]
    keys: list[tuple]
    inputs: list[list[tuple[str, str]]]
    key_ids: list[int] = field(default_factory=list)   # equal keys, equal ids (cheap to hash)
    live: list[list[str]] | None = None
    segments: list[Segment] = field(default_factory=list)
    _strategies: dict[tuple, list[Strategy]] = field(default_factory=dict)
    _index: dict[str, int] | None = None
    # Per cluster (by identity): the segments that ran out of states under its prices.
    _hard: dict[int, tuple[Any, set[str]]] = field(default_factory=dict)

    def hard_segments_on(self, cluster: Any) -> set[str]:
        entry = self._hard.get(id(cluster))
        if entry is None or entry[0] is not cluster:
            entry = self._hard[id(cluster)] = (cluster, set())
        return entry[1]

    def index_of(self, node: Node) -> int:
        if self._index is None:
            self._index = {n.name: i for i, n in enumerate(self.graph.nodes)}
        return self._index[node.name]

    def strategies(self, key: tuple, node: Node) -> list[Strategy]:
        hit = self._strategies.get(key)
        if hit is None:
            hit = self._strategies[key] = strategies(node, self.graph)
        return hit


_SHAPES: list[_GraphShape] = []     # the last few graphs searched, newest last
_SHAPES_KEPT = 4


def _structure_of(graph: Graph) -> _GraphShape:
    """The graph's :class:`_GraphShape`, from a small cache of recent graphs (by identity, with
    its size as a guard against a graph edited in place between two searches)."""
    size = (len(graph.nodes), len(graph.values), graph.output)
    for shape in _SHAPES:
        if shape.graph is graph and shape.size == size:
            return shape
    kinds = {}
    for v in graph.values.values():
        kinds[v.name] = PARAM if v.kind == "param" else (ACT if v.kind == "activation" else FREE)
    last_use: dict[str, int] = {}
    param_uses: dict[str, int] = {}
    inputs = []
    for i, node in enumerate(graph.nodes):
        refs = node.input_refs()
        inputs.append([(r, kinds[r]) for r in refs])
        for r in refs:
            last_use[r] = i
            if kinds[r] == PARAM:
                param_uses[r] = param_uses.get(r, 0) + 1
    last_use[graph.output] = len(graph.nodes)          # the loss lives to the end
    keys = [cost_key(graph, n) for n in graph.nodes]
    ids: dict[tuple, int] = {}
    shape = _GraphShape(graph, size, kinds, last_use, param_uses, keys, inputs,
                        [ids.setdefault(key, len(ids)) for key in keys])
    _SHAPES[:] = [s for s in _SHAPES if s.graph is not graph][-(_SHAPES_KEPT - 1):] + [shape]
    return shape


def node_strategies(graph: Graph, node: Node) -> list[Strategy]:
    """Every strategy of ``node`` (a node of ``graph``), derived once per graph and cost key."""
    shape = _structure_of(graph)
    return shape.strategies(shape.keys[shape.index_of(node)], node)


def _allowed(s: Strategy, node: Node, graph: Graph, kinds: dict[str, str],
             free_layouts: tuple[Layout, ...] | None, world: int) -> bool:
    """Strategies the search may use: every rank gets a non-empty piece (several ops reject
    empty tensors), and free values are read only in ``free_layouts`` when that is set."""
    for name, lay in list(zip(node.input_refs(), s.inputs)) + list(zip(node.outputs, s.outputs)):
        if isinstance(lay, Shard) and graph.meta(name).shape[lay.dim] < world:
            return False
    if free_layouts is None:
        return True
    return all(lay in free_layouts for r, lay in zip(node.input_refs(), s.inputs) if kinds[r] == FREE)


def cost_key(graph: Graph, node: Node) -> tuple:
    """Structure of a node without value names: equal keys have equal strategies and prices."""
    slot = {r: i for i, r in enumerate(dict.fromkeys(node.input_refs()))}

    def anon(a: Any) -> Any:
        if isinstance(a, Ref):
            return ("%", slot[a.name])
        if isinstance(a, (list, tuple)):
            return tuple(anon(x) for x in a)
        return repr(a)

    key = (node.op, anon(node.args), tuple((k, anon(v)) for k, v in node.kwargs.items()),
           tuple((graph.meta(r), graph.values[r].requires_grad, graph.values[r].kind) for r in slot),
           tuple((graph.meta(o), graph.values[o].requires_grad) for o in node.outputs))
    rows = expert_row_values(graph)      # a cast between two grouped matmuls has more choices
    if rows:
        key += (tuple(r in rows for r in slot) + tuple(o in rows for o in node.outputs),)
    return key


LONG_SEGMENT = 24  # nodes: a segment longer than this is also cut where two activations are live


def live_sets(space: SearchSpace) -> list[list[str]]:
    """Activations live before node ``i`` (and, at ``n``, after the last): produced before it,
    read at or after it. Ordered as the graph lists values, so equal layers line up."""
    n = len(space.graph.nodes)
    order = {name: k for k, name in enumerate(space.graph.values)}
    producer = space._producer_index
    live: list[list[str]] = [[] for _ in range(n + 1)]
    for v, last in space.last_use.items():
        if space.graph.values[v].kind == "activation":
            for i in range(producer[v] + 1, last + 1):
                live[i].append(v)
    return [sorted(x, key=order.__getitem__) for x in live]


def _segments(space: SearchSpace) -> list[Segment]:
    """Cut wherever at most one activation is live; cut long segments also where two are
    (a residual stream plus a running auxiliary loss, as in mixture-of-experts models).

    Fewer boundary values mean fewer entry states to solve a segment for, so two-value cuts
    are used only where one-value cuts leave the search a long stretch.
    """
    n = len(space.graph.nodes)
    live = space.live
    ones = [0] + [i for i in range(1, n) if len(live[i]) <= 1] + [n]
    cuts = []
    for a, b in zip(ones, ones[1:]):
        cuts.append(a)
        if b - a > LONG_SEGMENT:
            cuts += [i for i in range(a + 1, b) if len(live[i]) == 2]
    cuts.append(n)
    segments = []
    for start, stop in zip(cuts, cuts[1:]):
        seg = Segment(start, stop, tuple(live[start]), tuple(live[stop]))
        seg.signature = _segment_signature(space, seg)
        segments.append(seg)
    return segments


def _segment_signature(space: SearchSpace, seg: Segment) -> str:
    """A hash of the segment's structure with values named by position, not by name."""
    graph = space.graph
    local: dict[str, tuple] = {v: ("entry", k) for k, v in enumerate(seg.entry)}
    parts = []
    for i in range(seg.start, seg.stop):
        ns = space.nodes[i]
        ins = []
        for r, kind in ns.inputs:
            if r in local:
                ins.append(local[r])
            elif kind == PARAM:
                ins.append(("param", space.param_uses.get(r, 1) > 1))
            else:
                ins.append((kind,))
        for k, o in enumerate(ns.node.outputs):
            local[o] = ("node", i - seg.start, k)
        parts.append((ns.signature, tuple(ins)))
    parts.append(("exit", tuple(local.get(v) for v in seg.exit)))
    parts.append(("loss", local.get(graph.output)))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:20]


def layout_order(layout: Layout) -> tuple:
    """A total order on layouts, for deterministic state keys."""
    if isinstance(layout, Replicate):
        return (0, 0)
    if isinstance(layout, ExpertRows):
        return (3, 0)
    if isinstance(layout, Shard):
        return (1, layout.dim)
    assert isinstance(layout, Partial)
    return (2, 0)
