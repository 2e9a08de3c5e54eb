"""The facts about torch that writing a program needs, derived while torch is loaded.

The emitter writes ``a, b = aten.op(...)`` only where it knows how many results ``aten.op``
returns, and ``torch.float32`` for the traced string constant ``"float32"`` only where it knows
that the string names a dtype. Both answers come from torch (an op's schema, torch's
attributes), whose import alone takes seconds: more than ``hapc replan`` may spend. So the
tracer records them in the graph (:func:`record` -> :class:`hapc.ir.graph.TorchFacts`, saved
with the graph in ``plan.json``), and the emitter reads them through :class:`Facts`, which
asks torch only for what a graph does not record (a graph built by hand, a plan written
before the record existed): correct either way, torch-free when recorded.

This module imports torch only inside the functions that derive a fact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hapc.ir.graph import Graph, TorchFacts


def record(graph: Graph) -> TorchFacts:
    """Every fact the emitter may ask about ``graph``: each op's result count and each string
    constant's torch name (call where torch is loaded: the tracer)."""
    ops = sorted({n.op for n in graph.nodes})
    strings = sorted({s for n in graph.nodes for s in _strings((n.args, tuple(n.kwargs.values())))})
    return TorchFacts({op: op_results(op) for op in ops}, {s: torch_name(s) for s in strings})


def resolve_op(op: str) -> Any:
    """The operator overload behind ``namespace.op.overload``, or None (a higher-order op, or
    a name no library registered in this process)."""
    import torch

    parts = op.split(".")
    if len(parts) != 3:
        return None
    try:
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        return None


def op_results(op: str) -> int | None:
    """How many results the overload ``namespace.op.overload`` returns; None for a ``Tensor[]``
    (a list of any length) or an op torch does not know."""
    overload = resolve_op(op)
    if overload is None:
        return None
    rets = overload._schema.returns
    if len(rets) == 1 and _is_list(str(rets[0].type)):
        return None
    return len(rets)


def _is_list(schema_type: str) -> bool:
    """``Tensor[]`` as older torch prints a list type, ``List[Tensor]`` as torch 2.x does."""
    return "[]" in schema_type or schema_type.startswith("List[")


def torch_name(text: str) -> str | None:
    """The code for the torch object a traced string constant names (the tracer writes dtypes
    as ``"float32"``, layouts and memory formats as ``"torch.strided"``), or None."""
    import torch

    if hasattr(torch, text) and isinstance(getattr(torch, text), torch.dtype):
        return f"torch.{text}"
    if text.startswith("torch.") and hasattr(torch, text.removeprefix("torch.")):
        return text
    return None


class Facts:
    """A graph's recorded facts, with torch asked (and imported) only for one not recorded."""

    def __init__(self, graph: Graph) -> None:
        self._recorded = graph.torch_facts if graph.torch_facts is not None else TorchFacts()

    def op_results(self, op: str) -> int | None:
        known = self._recorded.op_results
        return known[op] if op in known else op_results(op)

    def torch_name(self, text: str) -> str | None:
        known = self._recorded.torch_names
        return known[text] if text in known else torch_name(text)


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _strings(x)
