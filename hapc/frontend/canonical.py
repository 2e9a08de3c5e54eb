"""Canonical node order and names: a traced graph that does not depend on the order Python ran
independent code in.

torch.export lists nodes in the order the forward ran them and names them after their op with
a running counter (``to``, ``to_1``, ...). A forward that iterates a ``set`` (Gemma3 and
ModernBERT build their per-layer-type attention masks with ``for kind in set(layer_types)``)
runs the same independent blocks in an order that follows ``PYTHONHASHSEED``, so the node
order and names change from one process to the next: the trace cache holds one graph, a
pipelined compile's micro-batch trace another, and plan.json differs between runs.

:func:`canonicalize` makes both a function of the graph's data flow and of where in the user's
code each node was made, never of the trace order:

* **order**: the nodes are placed from the loss backwards, each time taking, among the nodes
  whose readers are all placed, the one latest in program order: its call stack in the user's
  code (file, then line, frame by frame), then the last parameter it depends on (which layer
  of a loop it belongs to), then its content a few producers deep (op, arguments, dtypes and
  ranks, source line, parameters named with their layer number masked: the same in every
  layer; never sizes, which change with the batch a micro-batch's trace is made at), then
  its whole content (what it reads and what reads it, hashed; never a name given by the
  trace). For ordinary code this is
  the order Python ran it in, so the graphs of models without such loops keep their order;
  only blocks whose order the code does not fix (iterations of a set) are put in one order.
* **names**: each activation keeps its op-derived stem and is numbered anew in that order
  (``to``, ``to_1``, ...), as torch.export numbers them; parameters, buffers, inputs and
  constants keep their names. Dropout masks are keyed by node name, so they follow.

Besides data flow the order keeps one constraint: a node that writes a buffer back
(``Node.mutates``) comes after every node that reads the buffer's old value.
"""

from __future__ import annotations

import builtins
import hashlib
import heapq
import keyword
import os
import re
from dataclasses import replace
from typing import Any

from hapc.ir.graph import Graph, Node, Ref, Value

_COUNTER = re.compile(r"^(.*?)(?:_(\d+))?$")
_DEPTH = 16          # how deep in one line's expression the order is followed
_LOCAL_DEPTH = 4     # producers a tie-break digest looks back through (a layer's chains differ within few)
_NUMBERS = re.compile(r"\d+")
_RESERVED = frozenset(dir(builtins)) | frozenset(keyword.kwlist) | {"inf", "nan", "NoneType", "torch", "device", "pytree", "fx_pytree"}


def canonicalize(graph: Graph) -> Graph:
    """``graph`` with its nodes in canonical order and its activations canonically named (a new
    graph; sources, inputs, parameters and buffers as they were)."""
    order = canonical_order(graph)
    nodes = [graph.nodes[i] for i in order]
    return _renamed(graph, nodes, _canonical_names(graph, nodes))


def canonical_order(graph: Graph) -> list[int]:
    """Indices into ``graph.nodes`` in canonical order (see the module docstring)."""
    nodes = graph.nodes
    preds = _predecessors(graph)
    succs: list[list[int]] = [[] for _ in nodes]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    keys = _keys(graph, preds, succs)
    rank = {i: r for r, i in enumerate(sorted(range(len(nodes)), key=lambda i: (keys[i], i)))}
    waiting = [len(s) for s in succs]
    ready = [-rank[i] for i in range(len(nodes)) if not waiting[i]]
    heapq.heapify(ready)
    by_rank = {r: i for i, r in rank.items()}
    backwards: list[int] = []
    while ready:
        i = by_rank[-heapq.heappop(ready)]
        backwards.append(i)
        for p in preds[i]:
            waiting[p] -= 1
            if not waiting[p]:
                heapq.heappush(ready, -rank[p])
    if len(backwards) != len(nodes):
        raise ValueError("the graph has a cycle")
    return backwards[::-1]


def _predecessors(graph: Graph) -> list[set[int]]:
    """What each node must come after: the producers of what it reads and, for a node that
    writes a buffer back, every other node that reads the buffer (its old value)."""
    made_by = {out: i for i, n in enumerate(graph.nodes) for out in n.outputs}
    preds = [{made_by[r] for r in n.input_refs() if r in made_by} for n in graph.nodes]
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        for r in dict.fromkeys(n.input_refs()):
            readers.setdefault(r, []).append(i)
    for i, n in enumerate(graph.nodes):
        if n.mutates and n.mutates not in made_by:
            preds[i].update(j for j in readers.get(n.mutates, ()) if j != i)
    return preds


def _keys(graph: Graph, preds: list[set[int]], succs: list[list[int]]) -> list[tuple]:
    """Each node's sort key: program position, last parameter read, content (see the module
    docstring) and where it is read among its readers' arguments. Nothing in it depends on
    trace order or trace-given names."""
    nodes = graph.nodes
    made_by = {out: (i, k) for i, n in enumerate(nodes) for k, out in enumerate(n.outputs)}
    param_at = {p: j for j, p in enumerate(graph.params)}
    up: list[str] = [""] * len(nodes)
    layer = [-1] * len(nodes)
    for i in _topological(preds):
        n = nodes[i]

        def arg(a: Any) -> Any:
            if isinstance(a, Ref):
                if a.name in made_by:
                    j, k = made_by[a.name]
                    return ("%", up[j], k)
                return ("$", a.name)
            if isinstance(a, (list, tuple)):
                return _sized(a, arg)
            return repr(a)

        # The file by base name: a checkout elsewhere (a CI clone) must give the same digests.
        src = (os.path.basename(n.source.file), n.source.line, n.source.code) if n.source else None
        content = (n.op, arg(n.args), sorted((k, arg(v)) for k, v in n.kwargs.items()),
                   [_kind(graph.values[o].meta) for o in n.outputs if o in graph.values], src,
                   n.mutates if n.mutates not in made_by else None)
        up[i] = _digest(content)
        layer[i] = max([param_at.get(r, -1) for r in n.input_refs()] + [layer[p] for p in preds[i]], default=-1)
    # Refined by what reads each node, so that equal computations read in different places
    # (two identical masks, one per layer kind) are told apart.
    # A node that depends on no parameter (``arange`` in a block) belongs with its first reader.
    down: list[str] = [""] * len(nodes)
    for i in reversed(_topological(preds)):
        readers = sorted((down[j], _positions(nodes[j], nodes[i].outputs)) for j in succs[i])
        down[i] = _digest((up[i], readers, graph.output in nodes[i].outputs))
        if layer[i] < 0:
            layer[i] = min((layer[j] for j in succs[i]), default=-1)
    # Ties left after that (two chains made at one line, e.g. a library wrapper's) are broken by
    # what each node computes a few producers deep, parameters named with their layer masked, so
    # that every layer puts its chains in the same order: the repeated layers' steps then match
    # (hapc.ir.blocks) and each is called, or recomputed, as the others are.
    local = _local_digests(graph, made_by)
    # Python evaluates an expression's operands left to right, each whole before the next: a
    # node's place in its line's expression is its reader's place and where the reader takes it.
    line = [(n.source.file, n.source.line, n.source.callers) if n.source else None for n in nodes]
    place: list[tuple[int, ...]] = [()] * len(nodes)
    for i in reversed(_topological(preds)):
        reads = [(j, at) for j in succs[i] for _, at in _positions(nodes[j], nodes[i].outputs)]
        inner = [place[j] + (at,) for j, at in reads if line[j] == line[i] and line[i] is not None]
        place[i] = max(inner)[:_DEPTH] if inner else (max((at for _, at in reads), default=-1),)
    return [(_stack(n, layer[i]), place[i], layer[i], local[i], down[i]) for i, n in enumerate(nodes)]


def _local_digests(graph: Graph, made_by: dict[str, tuple[int, int]]) -> list[str]:
    """Per node, a digest of its op, arguments, outputs' metadata and source line, and of its
    producers' such digests ``_LOCAL_DEPTH`` deep: the same for the same computation in every
    layer (a source read directly, a parameter, is named with its numbers masked:
    ``p_layers_#_q_weight``), unlike the full upstream digest, which holds every layer before."""
    nodes = graph.nodes

    def arg(a: Any, below: list[str]) -> Any:
        if isinstance(a, Ref):
            if a.name in made_by:
                j, k = made_by[a.name]
                return ("%", below[j], k)
            return ("$", _NUMBERS.sub("#", a.name))
        if isinstance(a, (list, tuple)):
            return _sized(a, lambda x: arg(x, below))
        return repr(a)

    own = [(n.op, [_kind(graph.values[o].meta) for o in n.outputs if o in graph.values],
            (os.path.basename(n.source.file), n.source.line) if n.source else None) for n in nodes]
    digests = [""] * len(nodes)
    for _ in range(_LOCAL_DEPTH):
        digests = [_digest((own[i], arg(n.args, digests), sorted((k, arg(v, digests)) for k, v in n.kwargs.items())))
                   for i, n in enumerate(nodes)]
    return digests


def _kind(meta: Any) -> tuple:
    """A value's dtype and rank: its sizes vary with the batch, and a graph traced at a
    micro-batch must come out in the same order as at the whole batch (a pipelined compile
    checks the two node for node)."""
    return (meta.dtype, len(meta.shape))


def _sized(items: Any, arg: Any) -> tuple:
    """A list argument for a digest: sizes (a list of ints, as ``view`` takes) by their count
    only, for the reason :func:`_kind` gives; anything else item by item."""
    if items and all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        return ("ints", len(items))
    return tuple(arg(x) for x in items)


def _topological(preds: list[set[int]]) -> list[int]:
    """Some topological order (for computing keys; which one does not matter)."""
    order, seen = [], [False] * len(preds)
    for start in range(len(preds)):
        stack = [(start, False)]
        while stack:
            i, done = stack.pop()
            if done:
                order.append(i)
                continue
            if seen[i]:
                continue
            seen[i] = True
            stack.append((i, True))
            stack.extend((p, False) for p in preds[i] if not seen[p])
    return order


def _positions(node: Node, outputs: tuple[str, ...]) -> tuple:
    """Where ``node`` reads ``outputs`` among its arguments (by output index and place)."""
    flat = node.input_refs()
    return tuple((outputs.index(r), at) for at, r in enumerate(flat) if r in outputs)


def _stack(node: Node, layer: int) -> tuple:
    """The node's position in the user's code, outermost frame first, files by base name only
    (where a package is installed, or the project checked out, must not change the order; two
    files of one name at one line are told apart by content, as any tie). Below every calling
    frame comes ``layer``, the last parameter the node depends on: a call made in a loop
    (``for block in self.blocks: x = block(x)``) is the same frame in every iteration, and the
    iteration is told by the block's parameters."""
    if node.source is None:
        return ()
    key: list = []
    for f, line in node.source.callers:
        key += [(os.path.basename(f), line), layer]
    return tuple(key + [(os.path.basename(node.source.file), node.source.line)])


def _digest(obj: Any) -> str:
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:24]


def _canonical_names(graph: Graph, nodes: list[Node]) -> dict[str, str]:
    """Old name -> new for every node and activation, numbered per stem in ``nodes``' order."""
    produced = {o for n in nodes for o in n.outputs} | {n.name for n in nodes}
    # As torch.fx names: never a Python builtin or keyword (a ``sum`` node is ``sum_1``).
    taken = {name for name in graph.values if name not in produced} | _RESERVED
    count: dict[str, int] = {}
    names: dict[str, str] = {}

    def fresh(old: str) -> str:
        stem = _COUNTER.match(old).group(1) or old
        while True:
            k = count.get(stem, 0)
            count[stem] = k + 1
            new = stem if k == 0 else f"{stem}_{k}"
            if new not in taken:
                taken.add(new)
                return new

    for n in nodes:
        for old in ([] if n.name in n.outputs else [n.name]) + list(n.outputs):
            if old not in names:
                names[old] = fresh(old)
    return names


def _renamed(graph: Graph, nodes: list[Node], names: dict[str, str]) -> Graph:
    def arg(a: Any) -> Any:
        if isinstance(a, Ref):
            return Ref(names.get(a.name, a.name))
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return a

    new_nodes = [replace(n, name=names.get(n.name, n.name), args=arg(n.args),
                         kwargs={k: arg(v) for k, v in n.kwargs.items()},
                         outputs=tuple(names.get(o, o) for o in n.outputs),
                         mutates=names.get(n.mutates, n.mutates) if n.mutates else None) for n in nodes]
    values: dict[str, Value] = {k: v for k, v in graph.values.items() if k not in names}
    for n in nodes:
        for o in n.outputs:
            if o in graph.values:
                values[names[o]] = replace(graph.values[o], name=names[o])
    return Graph(values, new_nodes, list(graph.inputs), list(graph.params), list(graph.buffers),
                 names.get(graph.output, graph.output), dict(graph.unsupported), graph.torch_facts)
