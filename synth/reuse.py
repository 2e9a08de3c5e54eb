"""What ``hapc replan`` reuses from the run that made a plan: a small cache beside ``plan.json``.

``plan.json`` holds the graph, so a replan never traces again; but the search also needs every
node's candidate strategies, and those come from the sharding rules, which import torch (their
test samples are tensors): one to two seconds of a replan whose budget is one. The strategies
depend only on the graph, not on the cluster or the shares, so the run that writes a plan
writes them too, once per distinct node (48 identical layers share their lists), and a replan
installs them into the search space's per-graph structure instead of asking the rules.

The cache is an accelerator, never a source of truth: it names the graph it was made for by
a fingerprint of the graph's structure, and :func:`load` refuses one that is missing,
corrupt, of another format version or of another graph (``StaleCache``, with the reason in
one line), after which the caller derives the strategies from the rules as before.

The fingerprint hashes every node's cost key and wiring: a tenth of a second for a 48-layer
GPT, a tenth of ``hapc replan``'s budget. So a cache written beside a ``plan.json`` also
records that file's SHA-256 (``plan_sha256``), and a replan that loads the plan from the very
same bytes skips the fingerprint: equal bytes decode to an equal graph, the graph the cache
was written (or, for a replan's copy, validated) for. Any other plan file, an edited one
included, is checked by the fingerprint as before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hapc.ir.graph import Graph
from hapc.ir.layout import parse_layout
from hapc.ir.program import Strategy
from synth.space import _structure_of, node_strategies

FORMAT = "hapc-replan-cache/1"
FILE_NAME = "replan-cache.json"


class StaleCache(Exception):
    """The cache cannot be used for this plan; the message says why, in one line."""


def graph_fingerprint(graph: Graph) -> str:
    """A hash of what a node's strategies depend on: every node's cost key (op, constants,
    shapes, dtypes, value kinds) and its wiring, in order."""
    shape = _structure_of(graph)
    # shape.inputs[i] lists node i's input_refs() (with their kinds), already derived once.
    wiring = [(n.name, tuple(r for r, _ in refs), tuple(n.outputs)) for n, refs in zip(graph.nodes, shape.inputs)]
    text = repr((len(graph.nodes), graph.output, shape.keys, wiring))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_path(plan_path: str | Path) -> Path:
    """Where the cache of ``plan_path`` (a ``plan.json``) lives: beside it."""
    return Path(plan_path).with_name(FILE_NAME)


def plan_digest(plan_file: str | Path) -> str:
    """The stamp of a ``plan.json``: the SHA-256 of its bytes (a millisecond for a 48-layer GPT)."""
    return hashlib.sha256(Path(plan_file).read_bytes()).hexdigest()


def write(graph: Graph, path: str | Path, plan_file: str | Path | None = None) -> Path:
    """Write the cache of ``graph``'s strategies to ``path``; ``plan_file``, when given, is the
    ``plan.json`` already written for ``graph`` (its stamp lets a replan skip the
    fingerprint). In the process that searched the graph the strategies are already derived
    (the search space keeps them per graph), so this costs a serialisation."""
    shape = _structure_of(graph)
    classes: dict[tuple, int] = {}
    lists: list[list[list[Any]]] = []
    per_node: list[int] = []
    for key, node in zip(shape.keys, graph.nodes):
        k = classes.get(key)
        if k is None:
            k = classes[key] = len(lists)
            lists.append([_strategy_to_list(s) for s in node_strategies(graph, node)])
        per_node.append(k)
    data = {"format": FORMAT, "graph": graph_fingerprint(graph), "strategies": lists, "node_strategies": per_node}
    if plan_file is not None:
        data["plan_sha256"] = plan_digest(plan_file)
    out = Path(path)
    out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    return out


def load(graph: Graph, path: str | Path, plan_sha256: str | None = None) -> int:
    """Install the cached strategies of ``graph`` into its search structure, so that searches
    of ``graph`` in this process never call the sharding rules; returns how many distinct
    strategy lists were installed. ``plan_sha256`` is the :func:`plan_digest` of the bytes
    ``graph`` was loaded from, when it was loaded from a plan file: a cache stamped with it
    needs no fingerprint. Raises :class:`StaleCache` when the file cannot be used."""
    where = Path(path)
    try:
        data = json.loads(where.read_text())
    except FileNotFoundError:
        raise StaleCache(f"{where}: no replan cache") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StaleCache(f"{where}: unreadable replan cache ({type(exc).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise StaleCache(f"{where}: replan cache format {found!r}, expected {FORMAT!r}")
    stamped = plan_sha256 is not None and data.get("plan_sha256") == plan_sha256
    if not stamped and data.get("graph") != graph_fingerprint(graph):
        raise StaleCache(f"{where}: replan cache of another graph (its fingerprint does not match the plan's)")
    per_node, lists = data.get("node_strategies"), data.get("strategies")
    if not isinstance(per_node, list) or not isinstance(lists, list) or len(per_node) != len(graph.nodes):
        raise StaleCache(f"{where}: replan cache with {len(per_node) if isinstance(per_node, list) else 'no'} "
                         f"node entries for a graph of {len(graph.nodes)} nodes")
    try:
        decoded = [[_strategy_from_list(s) for s in strategies] for strategies in lists]
        chosen = [decoded[k] for k in per_node]
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
        raise StaleCache(f"{where}: corrupt replan cache entry ({exc})") from None
    # Every strategy of a list has its nodes' numbers of inputs and outputs: checked per list.
    arities = [{(len(s.inputs), len(s.outputs)) for s in strategies} for strategies in decoded]
    shape = _structure_of(graph)
    for node, refs, k in zip(graph.nodes, shape.inputs, per_node):
        if not arities[k] <= {(len(refs), len(node.outputs))}:
            raise StaleCache(f"{where}: replan cache strategies do not match node {node.name}'s arguments")
    for key, strategies in zip(shape.keys, chosen):
        shape._strategies.setdefault(key, strategies)
    return len(decoded)


def _strategy_to_list(s: Strategy) -> list[Any]:
    return [[repr(x) for x in s.inputs], [repr(x) for x in s.outputs], s.local,
            list(s.rescale) if s.rescale is not None else None]


def _strategy_from_list(item: list[Any]) -> Strategy:
    inputs, outputs, local, rescale = item
    return Strategy(tuple(parse_layout(x) for x in inputs), tuple(parse_layout(x) for x in outputs), local,
                    tuple(rescale) if rescale is not None else None)


def restamp(path: str | Path, target: str | Path, plan_file: str | Path) -> Path:
    """Copy the cache at ``path`` to ``target``, stamped for ``plan_file``: a plan written for
    the same graph (a replan's, whose graph is the old plan's, which this cache was just
    loaded for). The strategies and the fingerprint are copied as they are."""
    data = json.loads(Path(path).read_text())
    data["plan_sha256"] = plan_digest(plan_file)
    out = Path(target)
    out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    return out
