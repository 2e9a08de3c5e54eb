"""A distributed program in plan.json: its shares, state shares, source layouts and steps.

Written as plain records (layouts as their text, ``S(0)``, ``R``, ``P``) and read back with
every field checked first, so a hand-edited or damaged plan is refused with one line naming the
field, never half loaded.
"""

from __future__ import annotations

import math
from typing import Any

from costmodel.collectives import METHOD_NAMES
from hapc.errors import UserError
from hapc.ir.graph import Graph
from hapc.ir.layout import Layout, parse_layout
from hapc.ir.program import Compute, DistProgram, Redistribute, Strategy


def steps_to_dict(program: DistProgram) -> list[dict[str, Any]]:
    """The program's steps, JSON-ready and canonical as they are (strings, ints, lists: no float)."""
    steps: list[dict[str, Any]] = []
    for s in program.steps:
        if isinstance(s, Compute):
            steps.append({"compute": s.node, "inputs": [repr(x) for x in s.strategy.inputs],
                          "outputs": [repr(x) for x in s.strategy.outputs], "local": s.strategy.local,
                          "rescale": list(s.strategy.rescale) if s.strategy.rescale else None,
                          "reads": list(s.inputs)})
        else:
            steps.append({"redistribute": s.src, "out": s.out, "from": repr(s.src_layout),
                          "to": repr(s.dst_layout), "method": s.method})
    return steps


def program_from_dict(graph: Graph, data: dict[str, Any]) -> DistProgram:
    """A program from its ``shares`` (and ZeRO's ``state_shares``), ``source_layouts`` and ``steps``
    entries, checked first: shares are fractions that sum to 1, methods are known names."""
    shares = _fractions(data, "shares", "of the work")
    states = _fractions(data, "state_shares", "of the optimizer state, one per rank") \
        if "state_shares" in data else None
    if states is not None and len(states) != len(shares):
        raise UserError(f"state_shares: expected one per rank ({len(shares)}), got {len(states)}")
    methods = {s["method"] for s in data["steps"] if "redistribute" in s}
    if not methods <= METHOD_NAMES:
        raise UserError(f"steps: unknown collective method {sorted(map(str, methods - METHOD_NAMES))[0]!r}; "
                        f"expected one of {', '.join(sorted(METHOD_NAMES))}")
    layout_of = _LAYOUTS.__getitem__
    if type(data.get("recompute", False)) is not bool:
        raise UserError(f"recompute: expected true or false, got {str(data['recompute'])[:40]}")
    program = DistProgram(graph, shares, {k: layout_of(v) for k, v in data["source_layouts"].items()},
                          state_shares=states, recompute=data.get("recompute", False))
    for s in data["steps"]:
        if "compute" in s:
            strat = Strategy(tuple(layout_of(x) for x in s["inputs"]),
                             tuple(layout_of(x) for x in s["outputs"]), s["local"],
                             tuple(s["rescale"]) if s["rescale"] else None)
            program.steps.append(Compute(s["compute"], strat, tuple(s["reads"])))
        else:
            program.steps.append(Redistribute(s["redistribute"], s["out"], layout_of(s["from"]),
                                              layout_of(s["to"]), s["method"]))
    return program


def _fractions(data: dict[str, Any], key: str, what: str) -> tuple[float, ...]:
    values = data[key]
    if not isinstance(values, list) or not values or not all(
            type(x) in (int, float) and math.isfinite(x) and x >= 0 for x in values) \
            or abs(math.fsum(values) - 1) > 1e-6:
        raise UserError(f"{key}: expected non-negative fractions {what} that sum to 1, got {str(values)[:80]}")
    return tuple(values)


def memory_levers_entry(program: DistProgram) -> dict[str, Any]:
    """plan.json's ``state_shares`` entry (a program with ZeRO, :mod:`synth.zero`) and
    ``recompute`` entry (a program that recomputes its layers), each only when there is one."""
    out: dict[str, Any] = {} if program.state_shares is None else {"state_shares": list(program.state_shares)}
    return {**out, "recompute": True} if program.recompute else out


class _LayoutsByText(dict):
    """Layout text -> the (frozen) layout: a plan names a few layouts thousands of times."""

    def __missing__(self, text: str) -> Layout:
        layout = self[text] = parse_layout(text)
        return layout


_LAYOUTS = _LayoutsByText()
