"""A pipelined plan -> one standalone ``program.py`` for every rank.

The program is the one-stage skeleton (:mod:`hapc.codegen.skeleton` and
:mod:`hapc.codegen.skeleton_main`: launch checks, verify, optimizer loop) with, between its ``generated`` markers, a table per stage (``STAGES``) and a
forward function per stage; :mod:`hapc.runtime.pipeline` (copied as ``hapc_pipeline.py``)
runs a rank's stage in the 1F1B or GPipe schedule and moves the boundary tensors.

**Micro-batch shapes.** A stage's program was planned on the whole batch, but each forward
runs one micro-batch. The model is traced again at ``batch / m`` samples and the graph
checked to be the same node for node (names, ops, values); each stage's strategies (shares,
source layouts, steps) are then applied to that graph, so every shape the program writes —
a view's target size, a shard's piece lengths (the shares re-rounded on the micro-batch, as
the one-stage emitter rounds them on the batch), a local op's global shapes — is the
micro-batch's, exactly as torch.export saw it.

That trace needs torch, seconds of an emit that otherwise needs none, so it is done once:
:meth:`hapc.plan.plan.Plan.save` records in plan.json what differs from the whole-batch graph
(:func:`micro_batch_record`: the values whose shapes change, the nodes whose arguments do,
and the loss's reduction, which is read from torch's op schema), and emitting from a plan
that holds the record for its micro-batch rebuilds the graph from it without torch
(:func:`micro_batch_graph`). A program emitted from the record has no constants.pt: like a
one-stage program emitted from plan.json, it recovers lifted constants from the model at
start-up.

**What runs where.** A redistribution belongs to the stage of the node that consumes it (the
cost model charges it there too). A stage's forward reads its sources (the parameters,
buffers, constants and inputs its steps read) and, from the stage before it, every value
produced before its first node that it or a later stage reads. Those values cross each cut
whole (see :mod:`hapc.runtime.pipeline` for the layouts at a cut).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hapc.codegen import emitter
from hapc.errors import UserError
from hapc.codegen.micro_graph import (  # noqa: F401 - re-exported: this module's interface before the split
    MicroTrace, drawing_nodes, loss_split_of, micro_batch_dims, micro_batch_graph)
from hapc.ir.graph import Graph, Ref
from hapc.ir.layout import ExpertRows, Layout, Partial, Replicate, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute
from hapc.codegen import runtime_facts
from hapc.codegen.recompute_segments import recomputed_segments, render_segment
from hapc.codegen.sync_tables import grad_sync_order, low_gathers, state_rows

if TYPE_CHECKING:
    from hapc.plan.plan import Plan

SOURCE_KINDS = ("param", "buffer", "constant", "input")


def emit_pipeline(plan: Plan, out_dir: str | Path, micro: MicroTrace | None = None) -> Path:
    """Write ``out_dir/program.py`` for a pipelined ``plan`` (and the files beside it);
    ``micro``: its micro-batch graph when the caller has it already."""
    pipe = plan.pipeline
    assert pipe is not None
    micro = micro if micro is not None else micro_batch_graph(plan)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_name, constants_sha256 = _copy_files(plan.model["file"], out, micro.graph, micro.constants)
    source = render_pipeline(plan, micro.graph, model_name, micro.loss_reduction, constants_sha256, micro.loss_node)
    path = out / "program.py"
    path.write_text(source)
    return path


def on_graph(program: DistProgram, graph: Graph) -> DistProgram:
    """``program``'s strategies on another graph of the same structure (the micro-batch's)."""
    return DistProgram(graph, tuple(program.shares), dict(program.source_layouts), list(program.steps),
                       program.state_shares, program.recompute)


# ---- stages --------------------------------------------------------------------------------------

@dataclass
class _StageCode:
    """What one stage's forward runs and exchanges, by value name."""

    program: DistProgram          # the group's program on the micro-batch graph
    first: int
    stop: int
    ranks: tuple[int, ...]
    cluster: Any                  # the group as a cluster of its own (resolves "auto" collectives)
    steps: list                   # the program's steps this stage runs, in order
    sources: list[str]            # parameters, buffers, constants, inputs its steps read
    needs: dict[str, str]         # value read -> the boundary value (whole) it is a piece of
    produced: set[str]


def _base(name: str) -> str:
    return name.split("@", 1)[0]


def _stage_steps(program: DistProgram, first: int, stop: int) -> list:
    """The steps of nodes ``[first, stop)``; a redistribution goes with the node consuming it."""
    index = {n.name: i for i, n in enumerate(program.graph.nodes)}
    out, pending = [], []
    for step in program.steps:
        if isinstance(step, Redistribute):
            pending.append(step)
            continue
        if first <= index[step.node] < stop:
            out += pending + [step]
        pending = []
    if pending and stop == len(program.graph.nodes):
        out += pending
    return out


def _stage_code(program: DistProgram, first: int, stop: int, ranks: tuple[int, ...], cluster: Any) -> _StageCode:
    graph = program.graph
    steps = _stage_steps(program, first, stop)
    makers = {s.out: s for s in program.steps if isinstance(s, Redistribute)}
    produced: set[str] = set()
    nodes = {n.name: n for n in graph.nodes}
    reads: list[str] = []
    for step in steps:
        reads += list(step.inputs) if isinstance(step, Compute) else [step.src]
        produced.update(nodes[step.node].outputs if isinstance(step, Compute) else [step.out])
    # A redistributed source made in an earlier stage (a parameter gathered once, read by two
    # stages) is made again here, from this stage's own copy of the source.
    extra: list = []
    for name in list(dict.fromkeys(reads)):
        chain = []
        while name not in produced and name in makers and graph.values[_base(name)].kind in SOURCE_KINDS:
            chain.append(makers[name])
            produced.add(name)
            name = makers[name].src
        extra += chain[::-1]
    steps = extra + steps
    reads = [s.src for s in extra] + reads
    sources, needs = [], {}
    for name in dict.fromkeys(reads):
        if name in produced:
            continue
        if graph.values.get(name) is not None and graph.values[name].kind in SOURCE_KINDS:
            sources.append(name)
        else:
            needs[name] = _base(name)
    return _StageCode(program, first, stop, ranks, cluster, steps, sources, needs, produced)


def _layout_code(layout: Layout) -> str:
    if isinstance(layout, ExpertRows):     # synth.stagespace never cuts where such a value lives
        raise ValueError("a stage cannot send expert rows: only the grouped matmuls know whose they are")
    if isinstance(layout, Shard):
        return "S"
    if isinstance(layout, Partial):
        return "P"
    assert isinstance(layout, Replicate), layout
    return "R"


def _producers(graph: Graph) -> dict[str, int]:
    return {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}


# ---- rendering ---------------------------------------------------------------------------------

def render_pipeline(plan: Plan, graph: Graph, model_name: str, reduction: str | None = None,
                    constants_sha256: str | None = None, loss_node: str | None = None) -> str:
    """The text of a pipelined ``program.py`` (``reduction`` and ``loss_node``: how micro-batches'
    losses add up, see :func:`loss_split_of`; worked out from ``graph`` when not given;
    ``constants_sha256``: see :func:`emitter.save_constants`)."""
    from costmodel.groups import sub_cluster

    pipe = plan.pipeline
    codes = [_stage_code(on_graph(st.program, graph), st.first_node, st.stop_node, tuple(st.ranks),
                         sub_cluster(plan.cluster, st.ranks)) for st in pipe.stages]
    producer = _producers(graph)
    # crossing[k]: values stage k receives whole (produced before its first node, read by it or later)
    crossing: list[list[str]] = [[] for _ in codes]
    for k, code in enumerate(codes):
        wanted = list(dict.fromkeys(b for later in codes[k:] for b in later.needs.values()))
        crossing[k] = [b for b in wanted if producer[b] < code.first] if k else []
    for k, code in enumerate(codes):
        missing = [b for b in code.needs.values() if producer[b] >= code.first]
        if missing:
            raise UserError(f"stage {k} reads {missing[0]} before its stage computes it (a plan out of order)")
    draws = micro_batch_dims(plan.graph, graph, pipe.microbatches)
    tables = [_stage_table(k, code, crossing, codes, draws) for k, code in enumerate(codes)]
    if reduction is None:
        split = loss_split_of(graph, pipe.microbatches)
        reduction, loss_node = split.kind, split.node
    count = loss_count_spec(graph, codes[-1], loss_node) if reduction == "count" else None
    forwards = [_stage_forward(k, code, crossing, count) for k, code in enumerate(codes)]
    holders: dict[str, list[int]] = {}
    for k, code in enumerate(codes):
        for name in code.sources:
            if graph.values[name].kind == "param":
                holders.setdefault(name, []).append(k)
    body = "\n".join([
        _globals(plan, graph, model_name, pipe, holders, reduction, count, constants_sha256),
        emitter._precision_tables(plan.precision, plan.cluster),
        "# ZeRO-3: weights gathered for low-precision products only travel in that dtype.",
        emitter._dict("LOW_GATHERS: dict[str, str]", dict(kv for code in codes for kv in low_gathers(code.program))),
        "",
        "# One table per stage: its group's global ranks, its SPMD tables at micro-batch shapes",
        "# (SHARDS, LOCAL_CALLS, GRAD_SYNC_ORDER as in a one-stage program), the sources it holds,",
        "# the values it receives whole at its first cut (recv: name, shape, dtype, carries a",
        "# gradient) and sends at its last (send: ... and its layout here, 'pass' when it only",
        "# passes through), and which of its values are pieces of received ones (needs).",
        "STAGES: tuple[dict[str, Any], ...] = (",
        *[t + "," for t in tables],
        ")",
        "",
        "",
        "\n\n".join(forwards),
        "",
        f"STAGE_FORWARDS = ({', '.join(f'stage_{k}' for k in range(len(codes)))},)",
    ])
    head, tail = emitter.skeleton_parts()
    return _docstring(plan, model_name) + head.rstrip("\n") + "\n\n" + emitter.BEGIN + "\n" + body + "\n" + \
        emitter.END + tail


def _globals(plan: Plan, graph: Graph, model_name: str, pipe: Any, holders: dict[str, list[int]],
             reduction: str, count: dict[str, Any] | None, constants_sha256: str | None) -> str:
    from synth.stagespace import batch_size

    whole = plan.graph
    batch, m = batch_size(whole), pipe.microbatches
    split = tuple(bool(graph.meta(x).shape) and whole.meta(x).shape[0] == batch and graph.meta(x).shape[0] != batch
                  for x in graph.inputs)
    lines = [
        f"MODEL_FILE = {model_name!r}",
        emitter.model_kwargs_line(plan.model.get("kwargs")),
        "SEED = 0",
        f"OPTIMIZER = {plan.model.get('optimizer', 'adamw')!r}             # unless the model file defines optimizer(params)",
        f"WORLD = {plan.cluster.world}",
        "# Ranks per node, in the cluster file's order (a multi-node launch is checked against it).",
        f"NODE_SIZES: tuple[int, ...] = {tuple(len(h.devices) for h in plan.cluster.nodes)!r}",
        "",
        f"# The pipeline: {len(pipe.stages)} stages, {m} micro-batches of {batch // m} samples, {pipe.schedule} schedule.",
        f"MICROBATCHES, SCHEDULE = {m}, {pipe.schedule!r}",
        *_loss_lines(graph, reduction, count, m),
        emitter._dict("PARAMS: dict[str, str]", {p: graph.values[p].target for p in graph.params}),
        emitter._dict("BUFFERS: dict[str, str]", {b: graph.values[b].target for b in graph.buffers}),
        emitter._dict("CONSTANTS: dict[str, str]",
                      {n: v.target for n, v in graph.values.items() if v.kind == "constant"}),
        emitter.constants_hash_line(constants_sha256),
        f"INPUTS: tuple[str, ...] = {tuple(graph.inputs)!r}   # model inputs, in call order",
        f"INPUT_SPLIT: tuple[bool, ...] = {split!r}   # cut into micro-batches along dim 0",
        "# The stage whose gradient --verify reports for each parameter, and the parameters several",
        "# stages read (their gradients are summed across those stages after the last backward).",
        emitter._dict("PARAM_OWNER: dict[str, int]", {p: ks[0] for p, ks in holders.items()}),
        emitter._dict("SHARED_PARAMS: dict[str, tuple[int, ...]]",
                      {p: tuple(ks) for p, ks in holders.items() if len(ks) > 1}),
        "# The nodes that draw random numbers (dropout, rand, ...), in graph order: a micro-batch draws its",
        "# rows of the whole batch's draw (STAGES' random_batch_dims), which --verify's reference replays.",
        f"RANDOM_NODES: tuple[tuple[str, str], ...] = {tuple(drawing_nodes(graph))!r}",
        "# One-stage tables the skeleton's helpers read (a pipeline's live in STAGES).",
        "SHARDS: dict[str, tuple[int, tuple[int, ...]]] = {}",
        "LOCAL_CALLS: dict[str, tuple] = {}",
        "GRAD_SYNC_ORDER: tuple[str, ...] = ()",
        "HIERARCHICAL = False",
    ]
    return "\n".join(lines)


def loss_count_spec(graph: Graph, code: _StageCode, loss_node: str | None) -> dict[str, Any]:
    """What the last stage counts for a ``"count"`` loss: the loss node's target, its ignored id
    and class weights (``cross_entropy``/``nll_loss`` take them at the same positions), and
    whether the stage holds the target in pieces (then the group sums the pieces' counts)."""
    if loss_node is None:
        raise UserError("a loss over counted targets without its loss node (a damaged plan record)")
    node = graph.node(loss_node)

    def arg(pos: int, name: str, default: Any) -> Any:
        return node.args[pos] if len(node.args) > pos else node.kwargs.get(name, default)

    target, weight, ignore = arg(1, "target", None), arg(2, "weight", None), arg(4, "ignore_index", -100)
    target = target.name if isinstance(target, Ref) else None
    weight = weight.name if isinstance(weight, Ref) else None
    held = set(code.sources) | set(code.needs) | code.produced
    missing = [x for x in (target, weight) if x is not None and x not in held]
    if target is None or missing:
        raise UserError(f"the loss node {node.name} counts targets the last stage does not hold "
                        f"({', '.join(missing) or 'no target'}); use --microbatches 1")
    sharded = isinstance(code.program.layouts().get(target), Shard)
    return {"node": node.name, "target": target, "ignore_index": int(ignore), "weight": weight,
            "sharded": sharded}


def _stage_table(k: int, code: _StageCode, crossing: list[list[str]], codes: list[_StageCode],
                 draws: dict[str, int]) -> str:
    program, graph = code.program, code.program.graph
    layouts = program.layouts()
    used = set(code.sources) | set(code.needs) | code.produced
    shards = {n: v for n, v in emitter._shards(program, layouts).items() if n in used}
    local_ids = {s.node for s in code.steps if isinstance(s, Compute)}
    local_calls = {n: v for n, v in emitter._local_calls(program).items() if n in local_ids}
    params = [p for p in code.sources if graph.values[p].kind == "param"]
    sync = tuple(p for p in grad_sync_order(program) if p in params)
    producer = _producers(graph)

    def spec(base: str) -> tuple:
        meta = graph.meta(base)
        return (base, tuple(meta.shape), meta.dtype, bool(graph.values[base].requires_grad and meta.is_float))

    recv = tuple(spec(b) for b in crossing[k])
    send = ()
    if k + 1 < len(codes):
        send = tuple(spec(b) + ((_layout_code(layouts[b]) if producer[b] >= code.first else "pass"),)
                     for b in crossing[k + 1])
    needs = {n: (b, _layout_code(layouts[n])) for n, b in code.needs.items()}
    hierarchical = any(runtime_facts.method_of(emitter._method(program, s, code.cluster))
                       == runtime_facts.hierarchical() for s in code.steps if isinstance(s, Redistribute))
    first_name, last_name = graph.nodes[code.first].name, graph.nodes[code.stop - 1].name
    fields = {
        "ranks": code.ranks,
        "shares": tuple(round(s, 6) for s in program.shares),
        "hierarchical": hierarchical,
        "loss_partial": isinstance(layouts[graph.output], Partial) if k == len(codes) - 1 else False,
        "params": {p: graph.values[p].target for p in params},
        "buffers": {b: graph.values[b].target for b in code.sources if graph.values[b].kind == "buffer"},
        "constants": {c: graph.values[c].target for c in code.sources if graph.values[c].kind == "constant"},
        "inputs": tuple(x for x in code.sources if graph.values[x].kind == "input"),
        "recv": recv,
        "send": send,
        "needs": needs,
        "shards": shards,
        "local_calls": local_calls,
        "random_batch_dims": {n: d for n, d in draws.items() if n in local_calls},
        "grad_sync_order": sync,
        "state_rows": {p: rows for p, rows in state_rows(program) if p in params},
    }
    inner = "".join(f"        {key!r}: {value!r},\n" for key, value in fields.items())
    return (f"    # stage {k}: nodes {code.first}..{code.stop - 1} ({first_name} .. {last_name}) "
            f"on ranks {list(code.ranks)}\n    {{\n{inner}    }}")


def _loss_lines(graph: Graph, reduction: str, count: dict[str, Any] | None, m: int) -> list[str]:
    """The globals that say how the step adds up its micro-batches' losses (see
    :func:`loss_split_of`)."""
    if count is not None:
        return ["# The model's loss is a mean over counted targets (ignored ids and class weights change the",
                "# count, which depends on the data): each micro-batch's loss weighs its count, and the step",
                "# divides the sum, and every gradient, by the whole batch's count.",
                f"LOSS, LOSS_SCALE = {graph.output!r}, 1.0",
                f"LOSS_COUNT: dict[str, Any] | None = {count!r}"]
    what = "the mean of the micro-batch losses." if reduction == "mean" else "their sum."
    return [f"# The model's loss is a {reduction} over its batch: the step's loss is {what}",
            f"LOSS, LOSS_SCALE = {graph.output!r}, {1.0 / m if reduction == 'mean' else 1.0!r}",
            "LOSS_COUNT: dict[str, Any] | None = None"]


def _stage_forward(k: int, code: _StageCode, crossing: list[list[str]], count: dict[str, Any] | None = None) -> str:
    """``stage_k(rt, v)``: the stage's steps, one line each, as the one-stage ``forward`` writes
    them; returns the values it sends (this rank's pieces) or, last, the loss (and, for a loss
    over counted targets, the target and class weights the runtime counts)."""
    program, graph = code.program, code.program.graph
    names = emitter._Names(program)
    nodes = {n.name: n for n in graph.nodes}
    lines = [f"def stage_{k}(rt: Rank, v: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:",
             f'    """Stage {k} (nodes {code.first}..{code.stop - 1}) on this rank\'s pieces of one micro-batch."""']
    for name in (*code.sources, *code.needs):
        lines.append(f"    {names[name]} = v[{name!r}]")
    if k + 1 < len(crossing):
        out = [b for b in crossing[k + 1] if b in code.produced]
    else:
        out = [graph.output] + [x for x in ((count or {}).get("target"), (count or {}).get("weight")) if x]
    last_source: list = [None]

    def step_lines(step: Compute | Redistribute) -> list[str]:
        if isinstance(step, Redistribute):
            return emitter._redistribute(program, step, names, code.cluster)
        node, got = nodes[step.node], []
        loc = node.source
        if loc is not None and (loc.file, loc.line) != last_source[0]:
            got.append(f"    # {os.path.basename(loc.file)}:{loc.line}{f'  {loc.code}' if loc.code else ''}")
            last_source[0] = (loc.file, loc.line)
        got += emitter._compute(program, node, step, names)
        if node.mutates and node.mutates in graph.values and graph.values[node.mutates].kind == "buffer" \
                and node.outputs:
            got.append(f"    rt.write_back({names[node.mutates]}, {names[node.outputs[0]]})")
        return got

    segments = {s.start: s for s in recomputed_segments(program, code.steps, out)}
    numbers = {start: n for n, start in enumerate(sorted(segments))}
    i = 0
    while i < len(code.steps):
        segment = segments.get(i)
        if segment is None:
            lines += step_lines(code.steps[i])
            i += 1
            continue
        body = [line for step in code.steps[segment.start:segment.stop] for line in step_lines(step)]
        lines += render_segment(segment, numbers[i], names.__getitem__, body)
        i = segment.stop
    lines.append("    return {" + ", ".join(f"{b!r}: {names[b]}" for b in out) + "}")
    return "\n".join(lines)


def _docstring(plan: Plan, model_name: str) -> str:
    pipe = plan.pipeline
    from hapc.codegen.launch import launch_lines

    launch = "\n    ".join(launch_lines(plan.cluster, "program.py", extra="[--steps K] [--verify]"))
    stages = "\n".join(f"  stage {k}: nodes {st.first_node}..{st.stop_node - 1} on ranks {list(st.ranks)}"
                       for k, st in enumerate(pipe.stages))
    summary = plan.summary().strip().replace('"""', "'''").replace("\\", "\\\\")
    return f'''"""Pipelined training of {model_name} on {plan.cluster.world} ranks: generated by hapc.

{len(pipe.stages)} stages, {pipe.microbatches} micro-batches, {pipe.schedule} schedule:
{stages}

Run (one line per node; every node may be this host):

    {launch}

Files beside this one: {model_name} (the model file), hapc_local_ops.py, hapc_random_ops.py,
hapc_collectives.py, hapc_loss_scale.py, hapc_pipeline.py (the schedule and the exchange between stages), hapc_checkpoint.py,
hapc_timings.py and hapc_memory.py. Only torch is needed. Each stage's ``stage_k`` is one line per step of its
group's plan; ``STAGES`` holds the tables.

Plan:
{summary}
"""
'''


# ---- files ---------------------------------------------------------------------------------------

def _copy_files(model_file: str, out: Path, graph: Graph, constants: dict | None) -> tuple[str, str | None]:
    """The model file and the runtime beside the program (as :func:`emitter.emit` does), plus
    hapc_pipeline.py; returns the model file's name there and constants.pt's SHA-256."""
    model_name = Path(model_file).name
    if model_name in ("program.py", *emitter.RUNTIME_FILES, "hapc_pipeline.py"):
        model_name = "model.py"
    if Path(model_file).resolve() != (out / model_name).resolve():
        shutil.copyfile(model_file, out / model_name)
    for name, source in {**emitter.RUNTIME_FILES, "hapc_pipeline.py": runtime_facts.PIPELINE}.items():
        shutil.copyfile(source, out / name)
    return model_name, emitter.save_constants(out, graph, constants)


__all__ = ["MicroTrace", "emit_pipeline", "loss_split_of", "micro_batch_graph", "on_graph",
           "render_pipeline"]
