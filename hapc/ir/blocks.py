"""Repeated blocks of a distributed program: the layers that can be written once and called.

Two stretches of program steps are the same block when they are equal up to the names of
their values: the same ops with the same constant arguments, output shapes and dtypes, the same
strategies (layouts and local ops), the same piece lengths of every sharded value, the same
collectives, the same user source lines, and the same data flow between them. Uneven shares are
per device and the same in every layer, so a plan usually makes every layer of a stack one
block; a layer the search planned differently is another block (or stays inline).

Finding them: each step gets a *token* that holds everything above except names; the longest
tandem repeat of tokens (:mod:`hapc.ir.repeats`) proposes the layers; each proposed copy
is then put in canonical form (values renamed by where they are made, or by first use when made
outside) and only consecutive copies with equal forms become calls of one block. What is left
on either side is searched again (an encoder stack, then a decoder stack). Blocks with equal
forms found in different places share one function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from hapc.ir.repeats import longest_repeat
from hapc.ir.graph import Node, Ref
from hapc.ir.layout import Layout, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute

MIN_BLOCK_STEPS = 8       # shorter repeats (q, k, v projections) read better inline
_LIST_INDEX = re.compile(r"(?:^|\.)(\d+)(?=\.|$)")     # "blocks.3.ln1.weight" -> 3


@dataclass(frozen=True)
class Call:
    """One run of a block: program steps ``[start, stop)``.

    ``inputs``: values made outside and read inside, in the block's argument order;
    ``outputs``: this call's values at the block's output slots (read after it, or the loss);
    ``nodes``: this call's names of the block's local-op nodes (their random streams are the
    call's own: dropout masks are keyed by node name).
    """

    start: int
    stop: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Block:
    """A stretch of steps written once as ``def <name>(...)``; ``calls[0]`` names its values."""

    name: str
    calls: tuple[Call, ...]

    @property
    def first(self) -> Call:
        return self.calls[0]


def find_blocks(program: DistProgram, *, min_steps: int = MIN_BLOCK_STEPS) -> list[Block]:
    """Every repeated block of ``program`` with two calls or more, calls in program order."""
    steps = program.steps
    if len(steps) < 2 * min_steps:
        return []
    nodes = {n.name: n for n in program.graph.nodes}
    flow = _Flow([_reads(s, nodes) for s in steps], [_writes(s, nodes) for s in steps])
    # Equal tokens get equal numbers, so the repeat search and the canonical forms compare
    # and hash small ints instead of the tokens' nested tuples (a third of the search's time).
    numbers: dict[tuple, int] = {}
    tokens = [numbers.setdefault(t, len(numbers)) for t in _tokens(program, nodes)]
    last_read = _last_reads(flow)
    crossing = _live_across(flow, last_read)
    made: dict[tuple[int, int], tuple] = {}       # (start, stop) -> its _canonical
    owned: list[list[frozenset]] = []

    def owners() -> list[frozenset]:
        if not owned:
            owned.append(_param_owners(program, flow))
        return owned[0]

    def canonical(start: int, stop: int) -> tuple:
        if (start, stop) not in made:
            made[start, stop] = _canonical(flow, tokens, start, stop)
        return made[start, stop]

    groups: dict[tuple, list[list[tuple[int, int]]]] = {}     # canonical form -> runs of calls

    def search(lo: int, hi: int) -> None:
        found = longest_repeat(tokens[lo:hi], min_period=min_steps)
        if found is None:
            return
        start, stop, period = found.start + lo, found.stop + lo, found.period
        # The layer starts where fewest values cross the cut (a residual stream, not a residual
        # stream plus a branch), among the phases that keep the most copies; then where its
        # parameters belong to fewest modules of a list (blocks.3 alone, not blocks.2 and blocks.3).
        phase = min(range(period), key=lambda f: (-((stop - start - f) // period), crossing[start + f],
                                                  _layers_touched(owners(), start + f, start + f + period), f))
        first = start + phase
        copies = [(first + k * period, first + (k + 1) * period) for k in range((stop - first) // period)]
        forms = [canonical(s, e)[0] for s, e in copies]
        i = 0
        while i < len(copies):
            j = i
            while j + 1 < len(copies) and forms[j + 1] == forms[i]:
                j += 1
            if j > i:
                groups.setdefault(forms[i], []).append(copies[i:j + 1])
            else:
                search(copies[i][0], copies[i][1])
            i = j + 1
        search(lo, copies[0][0])
        search(copies[-1][1], hi)

    search(0, len(steps))
    blocks = []
    ordered = sorted(groups.values(), key=lambda runs: min(s for run in runs for s, _ in run))
    for index, runs in enumerate(ordered):
        ranges = sorted(r for run in runs for r in run)
        blocks.append(_block(f"block_{index}", program, [canonical(s, e) for s, e in ranges], last_read, ranges))
    return blocks


class _Flow(NamedTuple):
    """The values each program step reads and writes, by step index."""

    reads: list[tuple[str, ...]]
    writes: list[tuple[str, ...]]


def _block(name: str, program: DistProgram, made: list[tuple], last_read: dict[str, int],
           ranges: list[tuple[int, int]]) -> Block:
    """The calls of one block (``made``: each call's :func:`_canonical`); its outputs are the
    slots any call's caller reads."""
    slots: set[tuple[int, int]] = set()
    for (s, e), (_, _, internal) in zip(ranges, made):
        for value, slot in internal.items():
            if last_read.get(value, -1) >= e or value == program.graph.output:
                slots.add(slot)
    order = sorted(slots)
    calls = []
    for (s, e), (_, externals, internal) in zip(ranges, made):
        by_slot = {slot: value for value, slot in internal.items()}
        local = tuple(step.node for step in program.steps[s:e]
                      if isinstance(step, Compute) and step.strategy.local is not None
                      and step.strategy.local != "linear_sfb")
        calls.append(Call(s, e, tuple(externals), tuple(by_slot[slot] for slot in order), local))
    return Block(name, tuple(calls))


# ---- tokens and canonical forms -------------------------------------------------------------

def _tokens(program: DistProgram, nodes: dict[str, Node]) -> list[tuple]:
    """Per step, everything that must match for two steps to be the same but their names."""
    layouts = program.layouts()
    known: dict[str, tuple | None] = {}

    def pieces(value: str) -> tuple | None:
        if value not in known:
            known[value] = _pieces(program, value, layouts)
        return known[value]

    out: list[tuple] = []
    for step in program.steps:
        if isinstance(step, Redistribute):
            out.append(("move", step.src_layout, step.dst_layout, step.method, _meta(program, step.src),
                        pieces(step.src), pieces(step.out)))
            continue
        node = nodes[step.node]
        src = node.source
        out.append(("op", node.op, _shape_of_args(node.args), _shape_of_args(tuple(node.kwargs.items())),
                    tuple(_meta(program, o) for o in node.outputs), step.strategy,
                    tuple(pieces(v) for v in step.inputs), tuple(pieces(o) for o in node.outputs),
                    node.mutates is not None, (src.file, src.line, src.code) if src is not None else None))
    return out


def _meta(program: DistProgram, value: str) -> tuple:
    meta = program.graph.meta(value.split("@", 1)[0])
    return meta.shape, meta.dtype


def _pieces(program: DistProgram, value: str, layouts: dict[str, Layout]) -> tuple | None:
    lay = layouts.get(value)
    if not isinstance(lay, Shard):
        return None
    dim = program._dim(value, lay.dim)
    return dim, tuple(program.lengths(value, dim))


_NO_REF = Ref("")
_PLAIN = frozenset({int, float, str, bool, type(None)})     # the constants most arguments are


def _shape_of_args(args: Any) -> Any:
    """Constant arguments as they are; value references as a placeholder."""
    kind = type(args)
    if kind in _PLAIN:
        return (kind.__name__, repr(args))
    if isinstance(args, Ref):
        return _NO_REF
    if isinstance(args, (list, tuple)):
        return (kind.__name__,) + tuple(map(_shape_of_args, args))
    return (kind.__name__, repr(args))


def _reads(step, nodes: dict[str, Node]) -> tuple[str, ...]:
    if isinstance(step, Redistribute):
        return (step.src,)
    mutated = nodes[step.node].mutates
    extra = (mutated,) if mutated and mutated not in step.inputs else ()
    return tuple(step.inputs) + extra


def _writes(step, nodes: dict[str, Node]) -> tuple[str, ...]:
    return (step.out,) if isinstance(step, Redistribute) else nodes[step.node].outputs


def _canonical(flow: _Flow, tokens: list[int], start: int, stop: int):
    """(form, external values in first-use order, internal value -> (step offset, output index))."""
    internal: dict[str, tuple[int, int]] = {}
    externals: dict[str, int] = {}
    form = []
    for offset in range(stop - start):
        reads = []
        for value in flow.reads[start + offset]:
            if value in internal:
                reads.append(internal[value])
            else:
                reads.append(("in", externals.setdefault(value, len(externals))))
        form.append((tokens[start + offset], tuple(reads)))
        for j, value in enumerate(flow.writes[start + offset]):
            internal[value] = (offset, j)
    return tuple(form), list(externals), internal


def _param_owners(program: DistProgram, flow: _Flow) -> list[frozenset]:
    """Per step, the numbered modules (``blocks.3`` -> ("3",)) owning the parameters it reads."""
    values = program.graph.values
    of_value: dict[str, tuple[str, ...] | None] = {}
    out = []
    for reads in flow.reads:
        owners = set()
        for value in reads:
            if value not in of_value:
                target = values[value].target if value in values and values[value].kind == "param" else None
                of_value[value] = tuple(_LIST_INDEX.findall(target)) if target else None
            if of_value[value] is not None:
                owners.add(of_value[value])
        out.append(frozenset(owners))
    return out


def _layers_touched(owners: list[frozenset], start: int, stop: int) -> int:
    """How many numbered modules (``blocks.3``) own the parameters steps ``[start, stop)`` read."""
    return len(frozenset().union(*owners[start:stop]))


def _last_reads(flow: _Flow) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, reads in enumerate(flow.reads):
        for value in reads:
            last[value] = i
    return last


def _live_across(flow: _Flow, last_read: dict[str, int]) -> list[int]:
    """For each step index c, how many values made before step c are read at c or later."""
    steps = len(flow.writes)
    delta = [0] * (steps + 2)
    for i, writes in enumerate(flow.writes):
        for value in writes:
            end = last_read.get(value, -1)
            if end > i:
                delta[i + 1] += 1
                delta[end + 1] -= 1
    out, running = [], 0
    for c in range(steps + 1):
        running += delta[c]
        out.append(running)
    return out
