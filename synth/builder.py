"""Building distributed programs step by step, by hand or by simple policies.

:class:`ProgramBuilder` keeps the current layouts of values and inserts a
:class:`Redistribute` whenever a strategy wants an input in another layout (reusing a copy
already made). Baselines, tests and the search's final plan all go through it, so a program
is always well formed: every value read exists in the layout its reader expects.

:func:`propagate` is the simplest policy: walk the graph in order and give each node the
strategy that needs the fewest (and cheapest-looking) redistributions of what is there,
preferring sharded results. Starting from a batch-sharded input and replicated parameters it
yields data parallelism; the search does far better, but it is a sound baseline and a handy
way to get a valid program in tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import ExpertRows, Layout, Partial, Replicate, Shard, reachable
from hapc.ir.program import Compute, DistProgram, Redistribute, Strategy
from synth.space import node_strategies


class ProgramBuilder:
    def __init__(self, graph: Graph, shares: Sequence[float],
                 source_layouts: dict[str, Layout] | None = None) -> None:
        self.graph = graph
        sources = graph.params + graph.buffers + graph.inputs + \
            [v.name for v in graph.values.values() if v.kind == "constant"]
        layouts = {name: Replicate() for name in sources}
        layouts.update(source_layouts or {})
        self.program = DistProgram(graph, tuple(shares), layouts)
        # value -> {layout: name of the copy holding it in that layout}
        self._copies: dict[str, dict[Layout, str]] = {n: {lay: n} for n, lay in layouts.items()}
        self._nodes = {n.name: n for n in graph.nodes}
        self._refs = _refs_of(graph)

    def refs(self, node: Node) -> list[str]:
        """``node.input_refs()``, remembered: greedy policies score every strategy of a node."""
        hit = self._refs.get(node.name)
        if hit is None:
            hit = self._refs[node.name] = node.input_refs()
        return hit

    def layouts_of(self, value: str) -> dict[Layout, str]:
        return self._copies[value]

    def ensure(self, value: str, layout: Layout, method: str = "auto", source: Layout | None = None) -> str:
        """The name of a copy of ``value`` in ``layout``, redistributing if none exists yet
        (from the copy held in ``source`` when given, else from the cheapest-looking one)."""
        copies = self._copies[value]
        if layout in copies:
            return copies[layout]
        if source is not None and source in copies:
            src_layout, src = source, copies[source]
        else:
            src_layout, src = _best_source(copies, layout)
        out = f"{value}@{layout!r}"
        self.program.steps.append(Redistribute(src, out, src_layout, layout, method))
        copies[layout] = out
        return out

    def store(self, value: str, layout: Layout) -> None:
        """Keep source ``value`` (a parameter) in ``layout`` from the start (sharded storage)."""
        self.program.source_layouts[value] = layout
        self._copies[value] = {layout: value}

    def compute(self, node: Node | str, strategy: Strategy,
                sources: Sequence[Layout | None] | None = None) -> None:
        node = self._nodes[node] if isinstance(node, str) else node
        copies_of = self._copies
        reads = []
        for k, (value, layout) in enumerate(zip(self.refs(node), strategy.inputs)):
            name = copies_of[value].get(layout)     # most inputs are held as wanted: one lookup
            if name is None:
                name = self.ensure(value, layout, source=sources[k] if sources and k < len(sources) else None)
            reads.append(name)
        self.program.steps.append(Compute(node.name, strategy, tuple(reads)))
        for out, lay in zip(node.outputs, strategy.outputs):
            self._copies[out] = {lay: out}

    def build(self) -> DistProgram:
        self.program.invalidate()
        return self.program


_RECENT_REFS: list[tuple[Graph, tuple[int, int], dict[str, list[str]]]] = []


def _refs_of(graph: Graph) -> dict[str, list[str]]:
    """Node name -> input refs, shared by every builder of one graph (the synthesizer builds
    a dozen programs of each graph; walking every node's arguments again was a tenth of it).
    A few recent graphs are kept, by identity, with their size as a guard against a graph
    edited in place."""
    size = (len(graph.nodes), len(graph.values))
    for g, s, refs in _RECENT_REFS:
        if g is graph and s == size:
            return refs
    refs = {}
    _RECENT_REFS[:] = [e for e in _RECENT_REFS if e[0] is not graph][-3:] + [(graph, size, refs)]
    return refs


def _best_source(copies: dict[Layout, str], want: Layout) -> tuple[Layout, str]:
    """Pick the copy it is cheapest to turn into ``want``: a slice of a replica is free."""
    def rank(lay: Layout) -> int:
        if isinstance(lay, Replicate):
            return 0
        if isinstance(want, Replicate) and isinstance(lay, Shard):
            return 1
        if isinstance(lay, Shard):
            return 2
        return 3
    usable = [lay for lay in copies if reachable(lay, want)]
    if not usable:
        raise ValueError(f"no copy can become {want!r}: held as {sorted(map(repr, copies))}")
    lay = min(usable, key=lambda x: (rank(x), repr(x)))
    return lay, copies[lay]


def redistribution_penalty(have: Iterable[Layout], want: Layout) -> float:
    """A rough cost of getting ``want`` from the copies in ``have``, for greedy policies."""
    have = list(have)
    if want in have:
        return 0.0
    if not any(reachable(h, want) for h in have):
        return math.inf      # ExpertRows are made and read by ops only, never moved
    if any(isinstance(h, Replicate) for h in have) and not isinstance(want, Partial):
        return 0.1          # a free slice (keeps a tiny bias towards staying put)
    if isinstance(want, Partial):
        return 0.2
    return 1.0             # a real collective


def greedy_score(node: Node, s: Strategy, b: ProgramBuilder) -> float:
    """Propagation's default preference: no redistribution, then sharded outputs (less work
    per rank), and Partial outputs last."""
    cost = sum(redistribution_penalty(b.layouts_of(v), lay) for v, lay in zip(b.refs(node), s.inputs))
    if any(isinstance(o, ExpertRows) for o in s.outputs) and not any(isinstance(i, ExpertRows) for i in s.inputs):
        cost += 1e3     # a greedy pass cannot see whether every reader will keep them: never start
    sharded_out = any(isinstance(o, Shard) for o in s.outputs)
    return cost - (0.05 if sharded_out else 0.0) + (0.01 if any(isinstance(o, Partial) for o in s.outputs) else 0.0)


def propagate(graph: Graph, shares: Sequence[float], source_layouts: dict[str, Layout] | None = None,
              score: Callable[[Node, Strategy, ProgramBuilder], float] | None = None,
              situation: Callable[[Node, ProgramBuilder], object] | None = None) -> DistProgram:
    """Greedy layout propagation in graph order (see module docstring).

    ``situation(node, builder)``, when given, must name everything ``score`` reads besides
    the strategy and the layouts each input is already held in (``greedy_score`` reads
    nothing else: ``lambda node, builder: None``). A node with the same strategies as an
    earlier one, in the same situation and with its inputs held alike, then takes the same
    choice without scoring every strategy again: the 24 blocks of a ViT are scored once.
    """
    builder = ProgramBuilder(graph, shares, source_layouts)
    score = score or greedy_score
    chosen: dict[tuple, int] = {}
    for node in graph.nodes:
        options = node_strategies(graph, node)   # one list per cost key, kept for the graph's life
        key = None if situation is None else \
            (id(options), tuple(frozenset(builder.layouts_of(v)) for v in builder.refs(node)),
             situation(node, builder))
        best = None if key is None else chosen.get(key)
        if best is None:
            best = min(range(len(options)), key=lambda k: (score(node, options[k], builder), k))
            if key is not None:
                chosen[key] = best
        builder.compute(node, options[best])
    return builder.build()
