"""The forward written by block: each repeated layer once as a function, called per layer.

:mod:`hapc.ir.blocks` finds the blocks; this module writes them. A block function is the
usual one line per step, with its first call's value names (those are the names the tables hold:
a later call's pieces are the same lengths, so the first call's entries serve every call). It
takes the values its call reads, parameters last, and returns the values read after it.

Per call only two things differ: the parameters (``BLOCK_<k>_PARAMS``, one row per call) and the
names of the block's local-op nodes (``BLOCK_<k>_NODES``): a dropout mask is keyed by its node's
name, so every call draws its own layer's masks, exactly as the unrolled program did. Calls that
chain (each reads the previous one's results and nothing else does) run as a loop over those
rows; others are one line each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hapc.ir.blocks import Block, Call
from hapc.codegen.indexed import render_rows
from hapc.ir.program import Compute, DistProgram, Redistribute

SOURCE_KINDS = ("param", "buffer", "constant", "input")


def later_calls(program: DistProgram, blocks: list[Block]) -> tuple[set[str], set[str]]:
    """Values made inside and nodes run by every call but each block's first: the tables need not
    list them (a call's results are read by name after it, so those stay)."""
    outputs = {n.name: n.outputs for n in program.graph.nodes}
    values: set[str] = set()
    nodes: set[str] = set()
    for block in blocks:
        for call in block.calls[1:]:
            for step in program.steps[call.start:call.stop]:
                if isinstance(step, Redistribute):
                    values.add(step.out)
                else:
                    nodes.add(step.node)
                    values.update(outputs[step.node])
            values.difference_update(call.outputs)
    return values, nodes


@dataclass(frozen=True)
class _Slots:
    """How a block's arguments are given: ``passed`` by name at the call (activations; values
    every call shares), ``tabled`` from the call's row of ``BLOCK_<k>_PARAMS`` (its own sources)."""

    passed: tuple[int, ...]
    tabled: tuple[int, ...]

    @property
    def order(self) -> tuple[int, ...]:
        return self.passed + self.tabled


def render(program: DistProgram, blocks: list[Block], names: Any, sources: list[str],
           step_lines: Callable[..., list[str]]) -> str:
    """The block tables and functions, then ``forward`` calling them (source text)."""
    graph = program.graph
    slots = {b.name: _slots(program, b) for b in blocks}
    parts = [_tables(b, slots[b.name]) for b in blocks]
    parts += [_function(program, b, slots[b.name], names, step_lines) for b in blocks]

    mutates = {n.name: n.mutates for n in graph.nodes}
    last_read = _last_reads(program, mutates)
    calls = sorted(((c.start, b, i) for b in blocks for i, c in enumerate(b.calls)), key=lambda x: x[0])
    starts: dict[int, list[tuple[Block, int]]] = {}
    for start, block, i in calls:
        starts.setdefault(start, []).append((block, i))
    covered = {i for b in blocks for c in b.calls for i in range(c.start, c.stop)}

    # Sources bound by name: those outside steps read, and those given to calls by name.
    wanted: set[str] = set()
    for i, step in enumerate(program.steps):
        if i not in covered:
            wanted.update(_reads(step, mutates))
    for b in blocks:
        for c in b.calls:
            wanted.update(c.inputs[s] for s in slots[b.name].passed)
    lines = ["def forward(rt: Rank, v: dict[str, torch.Tensor]) -> torch.Tensor:",
             '    """One training forward on this rank\'s pieces; returns its piece of the loss."""',
             "    # sources: this rank's pieces of parameters, buffers and inputs (a block's own",
             "    # parameters are handed to its calls from its BLOCK_<k>_PARAMS rows)"]
    lines += [f"    {names[s]} = v[{s!r}]" for s in sources if s in wanted]
    i = 0
    pending: list = []
    while i < len(program.steps):
        if i not in starts:
            pending.append(program.steps[i])
            i += 1
            continue
        lines += step_lines(pending)
        pending = []
        block, first = starts[i][0]
        run = _chained_run(program, block, first, slots[block.name], last_read)
        lines += _calls(program, block, first, run, slots[block.name], names)
        i = block.calls[first + run - 1].stop
    lines += step_lines(pending)
    lines.append(f"    return {names[graph.output]}")
    parts.append("\n".join(lines) + "\n")
    return "\n\n\n".join(parts)


def _slots(program: DistProgram, block: Block) -> _Slots:
    values = program.graph.values
    passed, tabled = [], []
    for s in range(len(block.first.inputs)):
        seen = [c.inputs[s] for c in block.calls]
        own_sources = len(set(seen)) > 1 and all(v in values and values[v].kind in SOURCE_KINDS for v in seen)
        (tabled if own_sources else passed).append(s)
    return _Slots(tuple(passed), tuple(tabled))


def _tables(block: Block, slots: _Slots) -> str:
    n = block.name.upper()
    parts = [f"# {block.name} runs {len(block.calls)} times. Per call (one row each): the parameters it is given,"
             f"\n# and its names of the block's local-op nodes (each call draws its own dropout masks)."]
    if slots.tabled:
        parts.append(render_rows(f"{n}_PARAMS: tuple[tuple[str, ...], ...]",
                                 [tuple(c.inputs[s] for s in slots.tabled) for c in block.calls]))
    if block.first.nodes:
        parts.append(render_rows(f"{n}_NODES: tuple[tuple[str, ...], ...]", [c.nodes for c in block.calls]))
    return "\n".join(parts)


def _function(program: DistProgram, block: Block, slots: _Slots, names: Any,
              step_lines: Callable[..., list[str]]) -> str:
    first = block.first
    args = ["rt: Rank"] + (["nodes: tuple[str, ...]"] if first.nodes else [])
    args += [names[first.inputs[s]] for s in slots.order]
    position = {node: k for k, node in enumerate(first.nodes)}
    where = _source_lines(program, first)
    head = _wrap(f"def {block.name}(", args, ") -> Any:")
    doc = [f'    """{len(block.calls)} calls{where}; written with the first call\'s names.',
           "",
           "    ``nodes``: this call's names of the local-op nodes (their random streams are its own)."
           if first.nodes else "    No local op in it draws random numbers of its own.",
           '    """']
    body = step_lines(program.steps[first.start:first.stop],
                      lambda node: f"rt.ctx({node!r}, nodes[{position[node]}])")
    outs = [names[o] for o in first.outputs]
    ret = f"    return {outs[0]}" if len(outs) == 1 else f"    return {', '.join(outs)}"
    return "\n".join(head + doc + body + [ret]) + "\n"


def _source_lines(program: DistProgram, call: Call) -> str:
    nodes = {n.name: n for n in program.graph.nodes}
    locs = [nodes[s.node].source for s in program.steps[call.start:call.stop]
            if isinstance(s, Compute) and nodes[s.node].source is not None]
    if not locs:
        return ""
    files = sorted({loc.file.rsplit("/", 1)[-1] for loc in locs})
    lines = sorted({loc.line for loc in locs})
    return f" ({', '.join(files)} lines {lines[0]}-{lines[-1]})" if len(files) == 1 else ""


def _chained_run(program: DistProgram, block: Block, first: int, slots: _Slots, last_read: dict[str, int]) -> int:
    """How many calls from ``first`` on run as one loop: each directly after the one before,
    reading its results at fixed argument positions and the shared values, nothing else, and
    nobody else reading the results of any call but the last. At least 1."""
    calls = block.calls
    carry = _carry(block, first, slots)
    if carry is None:
        return 1
    n = 1
    while first + n < len(calls):
        prev, this = calls[first + n - 1], calls[first + n]
        if this.start != prev.stop or program.graph.output in prev.outputs:
            break
        if any(this.inputs[s] != prev.outputs[o] for s, o in carry.items()):
            break
        if any(this.inputs[s] != prev.inputs[s] for s in slots.passed if s not in carry):
            break
        if any(last_read.get(o, -1) >= this.stop for o in prev.outputs):
            break
        n += 1
    return n


def _carry(block: Block, first: int, slots: _Slots) -> dict[int, int] | None:
    """Argument position -> the output slot of the previous call it reads (from the second call)."""
    if first + 1 >= len(block.calls):
        return None
    prev, this = block.calls[first], block.calls[first + 1]
    carry = {}
    for s in slots.passed:
        if this.inputs[s] in prev.outputs:
            carry[s] = prev.outputs.index(this.inputs[s])
    return carry


def _calls(program: DistProgram, block: Block, first: int, run: int, slots: _Slots, names: Any) -> list[str]:
    n = block.name.upper()
    calls = block.calls[first:first + run]
    has_nodes, has_params = bool(block.first.nodes), bool(slots.tabled)
    if run == 1:
        call = calls[0]
        args = ["rt"] + ([f"{n}_NODES[{first}]"] if has_nodes else [])
        args += [names[call.inputs[s]] for s in slots.passed]
        args += [f"*(v[p] for p in {n}_PARAMS[{first}])"] if has_params else []
        outs = [names[o] for o in call.outputs]
        return _wrap(f"    {', '.join(outs)} = {_callee(program, block)}", args, ")")
    last = calls[-1]
    carry = _carry(block, first, slots) or {}
    loop_vars = [names[o] for o in last.outputs]
    lines = [f"    # {block.name}, calls {first}..{first + run - 1}: each reads the one before's results"]
    for s, o in carry.items():
        if names[calls[0].inputs[s]] != loop_vars[o]:
            lines.append(f"    {loop_vars[o]} = {names[calls[0].inputs[s]]}")
    window = "" if (first, run) == (0, len(block.calls)) else f"[{first}:{first + run}]"
    iterated = ([f"{n}_PARAMS{window}"] if has_params else []) + ([f"{n}_NODES{window}"] if has_nodes else [])
    targets = (["params"] if has_params else []) + (["nodes"] if has_nodes else [])
    if len(iterated) == 2:
        head = f"    for params, nodes in zip({iterated[0]}, {iterated[1]}):"
    elif iterated:
        head = f"    for {targets[0]} in {iterated[0]}:"
    else:
        head = f"    for _ in range({run}):"
    lines.append(head)
    args = ["rt"] + (["nodes"] if has_nodes else [])
    args += [loop_vars[carry[s]] if s in carry else names[calls[0].inputs[s]] for s in slots.passed]
    args += ["*(v[p] for p in params)"] if has_params else []
    lines += _wrap(f"        {', '.join(loop_vars)} = {_callee(program, block)}", args, ")")
    return lines


def _callee(program: DistProgram, block: Block) -> str:
    """How a call begins: ``block_0(``, or ``rt.recompute(block_0, `` in a program that
    recomputes its layers in backward (its activations are not kept, costmodel.recompute)."""
    return f"rt.recompute({block.name}, " if program.recompute else f"{block.name}("


def _wrap(head: str, args: list[str], tail: str, width: int = 110) -> list[str]:
    one = head + ", ".join(args) + tail
    if len(one) <= width:
        return [one]
    indent = " " * (len(head) - len(head.lstrip()) + 8)
    lines, line = [head.rstrip()], indent
    for a in args:
        if line.strip() and len(line) + len(a) + 2 > width:
            lines.append(line.rstrip())
            line = indent
        line += a + ", "
    lines.append(line.rstrip().rstrip(","))
    lines.append(" " * (len(head) - len(head.lstrip())) + tail.lstrip())
    return lines


def _reads(step: Any, mutates: dict[str, str | None]) -> tuple[str, ...]:
    """What a step reads by name (a buffer it writes back included)."""
    if isinstance(step, Redistribute):
        return (step.src,)
    written = mutates.get(step.node)
    return tuple(step.inputs) + ((written,) if written else ())


def _last_reads(program: DistProgram, mutates: dict[str, str | None]) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, step in enumerate(program.steps):
        for value in _reads(step, mutates):
            last[value] = i
    return last
