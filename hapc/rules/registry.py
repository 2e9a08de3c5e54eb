"""The one registry of op sharding rules.

A *rule* says, for one IR node, which combinations of input layouts an SPMD program may feed
it and which output layouts it then produces: a list of :class:`Strategy` (Hoare triples
``{inputs} op {outputs}``). Rules live next to the ops they serve, one module per op family,
and are registered with :func:`register` keyed by the aten overload name. Every rule ships
*samples* (small argument sets) so that :mod:`hapc.rules.check` can run it against the
unsharded op; trust comes from that checker, not from review.

An op without a rule still works: :func:`strategies` then offers only all-``Replicate``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import R
from hapc.ir.program import Strategy
from hapc.rules.expert_rows import expert_row_strategies

RuleFn = Callable[[Node, Graph], list["Strategy"]]


@dataclass
class Sample:
    """Arguments for one check of a rule: tensors (global, unsharded) and constants."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Positions (among the sample's tensors, in order) of float tensors that take no
    # gradient, such as class weights of a loss.
    frozen: tuple[int, ...] = ()
    # Who holds which rows of ExpertRows (hapc.ir.layout) in a check: "any" (each row on a
    # random rank) or the rank holding the row's expert, by the sample's 3-D weight sharded on
    # its first dim and its 1-D offsets ("experts"), or by its first tensor sharded on its first
    # dim and its 1-D sorted expert ids ("routed").
    owners: str = "any"


@dataclass
class Rule:
    op: str
    fn: RuleFn
    samples: Callable[[], list[Sample]] | None


_RULES: dict[str, Rule] = {}


def register(ops: str | Iterable[str], samples: Callable[[], list[Sample]] | None = None):
    """Decorator: ``@register("aten.mm.default", samples=...)`` over ``rule(node, graph)``."""
    names = [ops] if isinstance(ops, str) else list(ops)

    def wrap(fn: RuleFn) -> RuleFn:
        for name in names:
            if name in _RULES:
                raise ValueError(f"two rules for {name}")
            _RULES[name] = Rule(name, fn, samples)
        return fn

    return wrap


def register_spec(ops: str | Iterable[str], build: Callable[[Node, Graph], list[Strategy]],
                  samples: Callable[[], list[Sample]] | None = None) -> None:
    """One-line registration of ops whose rule comes from a shared generator."""
    register(ops, samples)(build)


def has_rule(op: str) -> bool:
    _load_families()
    return op in _RULES


def rules() -> dict[str, Rule]:
    _load_families()
    return dict(sorted(_RULES.items()))


def replicated(node: Node) -> Strategy:
    return Strategy(tuple(R for _ in node.input_refs()), tuple(R for _ in node.outputs))


def strategies(node: Node, graph: Graph) -> list[Strategy]:
    """Every strategy for ``node``; an all-``Replicate`` one is always present."""
    _load_families()
    rule = _RULES.get(node.op)
    found = rule.fn(node, graph) if rule else []
    # A rule may bring its own all-Replicate strategy (dropout does, to draw masks its own way).
    out = [] if any(s.is_replicated for s in found) else [replicated(node)]
    for s in found + expert_row_strategies(node, graph):
        if s not in out:
            out.append(s)
    return out


_loaded = False


def _load_families() -> None:
    """Import the family modules once; each registers its rules at import time."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import pkgutil

    import hapc.rules as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("ops_"):
            importlib.import_module(f"hapc.rules.{info.name}")
