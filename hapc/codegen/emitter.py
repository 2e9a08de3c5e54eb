"""DistProgram -> a standalone SPMD training program (``OUT/program.py``).

The program is the skeleton in :mod:`hapc.codegen.skeleton` (process group, this rank's
shards of the initial weights, gradient synchronisation, optimizer loop, ``--verify``) with
the plan pasted in as data and one function:

* tables keyed by value name — the piece length of every sharded value on each rank, the
  module attribute behind each parameter, the RankCtx shape of each local op — so the rank
  is data and every rank runs the same code;
* ``forward(rt, v)``: one line per program step with named values, the user's source line
  above the ops it produced, and the layout change and collective of each redistribution;
* a function per repeated block of steps (a transformer layer), written once and called per
  layer (:mod:`hapc.ir.blocks` finds them, :mod:`hapc.codegen.by_block` writes them), and
  per-layer table rows written as loops (:mod:`hapc.codegen.indexed`), so the program grows
  with the distinct blocks of the model, not its depth.

Beside it go a copy of the model file and copies of :mod:`hapc.runtime.local_ops`,
:mod:`hapc.runtime.random_ops` and :mod:`hapc.runtime.collectives`, so the directory runs anywhere
torch does.

Writing the program never imports torch (nor the runtime, which does): what it needs from
torch was recorded in the graph at trace time (:mod:`hapc.frontend.torchfacts`), and what it needs from
the runtime is read from the runtime's source (:mod:`hapc.codegen.runtime_facts`). Only a
plan's lifted constants, when given, load torch to be saved.
"""

from __future__ import annotations

import hashlib
import keyword
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

from hapc.codegen import by_block, runtime_facts
from hapc.ir.blocks import Block, find_blocks
from hapc.codegen.indexed import literal, render_dict, render_tuple
from hapc.codegen.sync_tables import grad_sync_order, low_gathers, state_rows
from hapc.ir.graph import Node, Ref
from hapc.ir.layout import Layout, Partial, Replicate, Shard, reachable
from hapc.ir.program import Compute, DistProgram, Redistribute, empty_ranks
from hapc.frontend.torchfacts import Facts

SKELETON = Path(__file__).with_name("skeleton.py")
SKELETON_MAIN = Path(__file__).with_name("skeleton_main.py")     # the program's second half
# The runtime beside the program: copied, never imported (each imports torch).
RUNTIME_FILES = {"hapc_local_ops.py": runtime_facts.LOCAL_OPS, "hapc_random_ops.py": runtime_facts.RANDOM_OPS,
                 "hapc_collectives.py": runtime_facts.COLLECTIVES,
                 "hapc_loss_scale.py": runtime_facts.LOSS_SCALE,   # fp16
                 "hapc_zero.py": runtime_facts.ZERO,               # ZeRO's sharded optimizer state
                 "hapc_checkpoint.py": runtime_facts.CHECKPOINT,   # --save/--load
                 "hapc_timings.py": runtime_facts.TIMINGS,         # --timings
                 "hapc_memory.py": runtime_facts.MEMORY_METER}     # --measure-memory
BEGIN = "# ==== generated: tables and forward (begin) ===="
END = "# ==== generated: tables and forward (end) ===="
CONTINUED = "# ==== skeleton, continued ====\n"    # in skeleton_main.py: the program text follows
OPTIMIZERS = ("adamw", "adam", "sgd")
# Names the generated forward uses for itself; values never take them.
RESERVED = {"rt", "v", "aten", "torch", "math", "L", "R", "C", "S", "M", "forward", "nodes", "params", "Any"}
BLOCK_FUNCTION = re.compile(r"block_\d+")     # names of the block functions (hapc.codegen.by_block)
_NOT_WORD = re.compile(r"\W+")


def emit(program: DistProgram, model_file: str, out_dir: str, *, model_kwargs: dict | None = None,
         optimizer: str = "adamw", seed: int = 0, plan_summary: str = "", cluster: Any = None,
         constants: dict | None = None, precision: Any = None) -> str:
    """Write ``out_dir/program.py`` and its sibling files; return the program's path.

    ``cluster`` (a :class:`costmodel.cluster.Cluster`) resolves each ``"auto"`` collective to
    the variant the cost model prices cheapest, so the program runs what was predicted;
    without it "auto" is the padded form. ``constants`` (``Traced.constants``) are tensors the
    trace lifted out of the model; they are saved beside the program when the graph uses any.
    ``precision`` (a :class:`hapc.ir.precision.Precision`; default float32, TF32 off) sets
    the program's autocast and TF32 tables.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {', '.join(OPTIMIZERS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_name = Path(model_file).name
    if model_name in ("program.py", *RUNTIME_FILES):
        model_name = "model.py"
    if Path(model_file).resolve() != (out / model_name).resolve():
        shutil.copyfile(model_file, out / model_name)
    for name, source in RUNTIME_FILES.items():
        shutil.copyfile(source, out / name)
    constants_sha256 = save_constants(out, program.graph, constants)
    source = render(program, model_name, model_kwargs=model_kwargs or {}, optimizer=optimizer, seed=seed,
                    plan_summary=plan_summary, cluster=cluster, precision=precision,
                    constants_sha256=constants_sha256)
    path = out / "program.py"
    path.write_text(source)
    return str(path)


def save_constants(out: Path, graph: Any, constants: dict | None) -> str | None:
    """Save the lifted constants ``graph`` reads (those with data) as ``out/constants.pt`` and
    return its SHA-256, which the program checks before loading it; None (and no file) when
    there are none. A constant traced on the meta device has no data (Falcon's
    ``x[..., [-2], :]`` index list): it is left out, and each rank re-derives it at start-up."""
    used = {graph.values[n].target for n in graph.values if graph.values[n].kind == "constant"}
    with_data = {k: t for k, t in (constants or {}).items() if k in used and not t.is_meta}
    path = out / "constants.pt"
    if not with_data:
        path.unlink(missing_ok=True)     # never another plan's constants
        return None
    import io

    import torch        # the constants are tensors: torch is loaded already

    buffer = io.BytesIO()
    torch.save(with_data, buffer)
    path.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def render(program: DistProgram, model_name: str, *, model_kwargs: dict, optimizer: str = "adamw",
           seed: int = 0, plan_summary: str = "", cluster: Any = None, precision: Any = None,
           constants_sha256: str | None = None) -> str:
    """The text of ``program.py`` (see the module docstring); ``constants_sha256``: that of the
    constants.pt written beside it (:func:`save_constants`)."""
    head, tail = skeleton_parts()
    names = _Names(program)
    blocks = find_blocks(program)       # repeated layers: written once, called per layer
    body = _tables(program, names, model_name, model_kwargs, optimizer, seed, cluster, blocks,
                   constants_sha256) + "\n" + \
        _precision_tables(precision, cluster) + "\n\n\n" + \
        _forward(program, names, cluster, blocks)
    return _docstring(program, model_name, plan_summary) + head.rstrip("\n") + "\n\n" + BEGIN + "\n" + body + \
        "\n" + END + tail


def skeleton_parts() -> tuple[str, str]:
    """The skeleton's text before the generated block (without its docstring, which each program
    replaces with its own) and after it, followed by the second half's (skeleton_main.py after
    its :data:`CONTINUED` line).

    The docstring ends at the first closing triple quote, as Python reads it (the skeleton's has
    no escaped quotes; tests/codegen/test_after_planning.py checks this against ``ast``), so the
    skeleton is read without being parsed."""
    skeleton = SKELETON.read_text()
    if not skeleton.startswith('"""'):
        raise ValueError(f"{SKELETON} should start with its docstring")
    doc_end = skeleton.count("\n", 0, skeleton.index('"""', 3)) + 1     # the docstring's last line
    head, rest = skeleton.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return "\n".join(head.splitlines()[doc_end:]), tail + SKELETON_MAIN.read_text().split(CONTINUED, 1)[1]


# ---- names -----------------------------------------------------------------------------------

class _Names:
    """Value name -> a unique Python identifier (``idx@S(0)`` -> ``idx_S0``)."""

    def __init__(self, program: DistProgram) -> None:
        self._map: dict[str, str] = {}
        taken: set[str] = set(RESERVED)
        every = list(program.graph.values) + [s.out for s in program.steps if isinstance(s, Redistribute)]
        for name in every:
            if name.isascii() and name.isidentifier() and name[0] != "_" and name[-1] != "_":
                base = name             # what the substitution below leaves as it is
            else:
                base = _NOT_WORD.sub("_", name.replace("@", "_")).strip("_") or "value"
            if base[0].isdigit() or keyword.iskeyword(base):
                base = f"v_{base}"
            ident, i = base, 1
            while ident in taken or BLOCK_FUNCTION.fullmatch(ident):
                i += 1
                ident = f"{base}_{i}"
            taken.add(ident)
            self._map[name] = ident

    def __getitem__(self, name: str) -> str:
        return self._map[name]


# ---- tables ----------------------------------------------------------------------------------

def _tables(program: DistProgram, names: _Names, model_name: str, model_kwargs: dict, optimizer: str,
            seed: int, cluster: Any, blocks: list[Block] = (), constants_sha256: str | None = None) -> str:
    graph = program.graph
    layouts = program.layouts()
    # Values and nodes of a block's later calls never appear in the program's text: the block
    # function is written with its first call's names, so only those are looked up.
    hidden_values, hidden_nodes = by_block.later_calls(program, blocks)
    order = _value_order(program)
    loss_layout = layouts[graph.output]
    lines = [
        f"MODEL_FILE = {model_name!r}",
        model_kwargs_line(model_kwargs),
        f"SEED = {seed!r}",
        f"OPTIMIZER = {optimizer!r}             # unless the model file defines optimizer(params)",
        f"WORLD = {program.world}",
        f"SHARES: tuple[float, ...] = {literal(tuple(round(s, 6) for s in program.shares))}   # each rank's share",
        f"HIERARCHICAL = {_uses_hierarchical(program, cluster)}",
        f"LOSS, LOSS_PARTIAL = {graph.output!r}, {isinstance(loss_layout, Partial)}",
        f"# The loss is {_describe(loss_layout)}.",
        "",
        "# Where the sources come from (program value -> module attribute). A sharded one",
        "# (listed in SHARDS) starts as this rank's piece of the initial tensor.",
        render_dict("PARAMS: dict[str, str]", [(p, graph.values[p].target) for p in graph.params]),
        render_dict("BUFFERS: dict[str, str]", [(b, graph.values[b].target) for b in graph.buffers]),
        render_dict("CONSTANTS: dict[str, str]", [(n, v.target) for n, v in graph.values.items() if v.kind == "constant"]),
        constants_hash_line(constants_sha256),
        f"INPUTS: tuple[str, ...] = {tuple(graph.inputs)!r}   # model inputs, in call order",
        "",
        "# Every sharded value: (dim, piece length on rank 0, 1, ...). Rank r holds",
        "# [offset_r, offset_r + length_r) of dim, offsets being running sums of the lengths.",
        render_dict("SHARDS: dict[str, tuple[int, tuple[int, ...]]]",
                    sorted([kv for kv in _shards(program, layouts).items() if kv[0] not in hidden_values],
                           key=lambda kv: order.get(kv[0], -1))),
        "",
        "# Local ops: node -> (aten op, values read, values written, global output shapes);",
        "# Rank.ctx turns a row into the RankCtx the op gets on this rank.",
        render_dict("LOCAL_CALLS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], tuple[tuple[int, ...], ...]]]",
                    [kv for kv in _local_calls(program).items() if kv[0] not in hidden_nodes]),
        "",
        "# Replicated trainable parameters, in the order their gradients become ready in",
        "# backward: their gradients are all-reduced in buckets in this order.",
        render_tuple("GRAD_SYNC_ORDER: tuple[str, ...]", list(grad_sync_order(program))),
        "# ZeRO: of those, the ones whose gradient and optimizer state are kept as rows each rank",
        "# owns (rows of the first dimension per rank); the optimizer steps those rows only.",
        render_dict("STATE_ROWS: dict[str, tuple[int, ...]]", state_rows(program)),
        "# ZeRO-3: weights gathered for low-precision products only travel in that dtype.",
        render_dict("LOW_GATHERS: dict[str, str]", low_gathers(program)),
        "",
        "# Ranks per node, in the cluster file's order (a multi-node launch is checked against it).",
        f"NODE_SIZES: tuple[int, ...] = {literal(_node_sizes(program, cluster))}",
    ]
    return "\n".join(lines)


def model_kwargs_line(model_kwargs: dict[str, Any] | None) -> str:
    """``MODEL_KWARGS``, keys sorted: plan.json stores them sorted, so a program emitted from a
    loaded plan and one written by ``hapc compile`` (``--set`` order) read the same."""
    return f"MODEL_KWARGS: dict[str, Any] = {dict(sorted((model_kwargs or {}).items()))!r}"


def _value_order(program: DistProgram) -> dict[str, int]:
    """Sources in graph order, then values in the order steps make them: a table in this order
    reads as the program runs, whatever order a loaded plan's dicts came in."""
    graph = program.graph
    order = graph.params + graph.buffers + [n for n, x in graph.values.items() if x.kind == "constant"] + graph.inputs
    nodes = {n.name: n for n in graph.nodes}
    for step in program.steps:
        order += [step.out] if isinstance(step, Redistribute) else list(nodes[step.node].outputs)
    return {name: i for i, name in enumerate(dict.fromkeys(order))}


def _node_sizes(program: DistProgram, cluster: Any) -> tuple[int, ...]:
    """Devices per node of the plan's cluster (the program prints one torchrun line per node)."""
    if cluster is None or cluster.world != program.world:
        return (program.world,)
    return tuple(len(h.devices) for h in cluster.nodes)


def constants_hash_line(sha256: str | None) -> str:
    return f"CONSTANTS_SHA256 = {sha256!r}   # of constants.pt, checked before it is read (None: no file)"


def _precision_tables(precision: Any, cluster: Any = None) -> str:
    """PRECISION and ALLOW_TF32 (see hapc.ir.precision; gradients stay in float32), and
    TRACED_FOR: the device type the model was traced for (the cluster's,
    :mod:`hapc.frontend.ondevice`), which the program names when it runs on another."""
    from hapc.codegen.launch import run_device
    from hapc.ir.precision import Precision

    p = precision if precision is not None else Precision()
    traced_for = run_device(cluster) if cluster is not None else "cpu"
    return "\n".join([
        "",
        "# The device type the model was traced for: model code that branches on the device took",
        "# its branch for this type, which a run with another --device keeps (it then may differ",
        "# from the model run there, which --verify compares with).",
        f"TRACED_FOR = {traced_for!r}",
        "",
        "# Numerics the plan was priced for: bf16 and fp16 run the forward under torch.autocast with",
        "# float32 master weights and optimizer state; ALLOW_TF32 (the cluster file's allow_tf32) lets",
        "# float32 products use TF32 units, overridable with --tf32 on|off. Gradients are",
        f"# all-reduced in {p.grad_reduce_dtype}. LOSS_SCALING (fp16): GradScaler's dynamic loss scaling,",
        "# its skip decision agreed by every rank (hapc_loss_scale.py).",
        f"PRECISION = {p.name!r}",
        f"ALLOW_TF32 = {p.allow_tf32!r}",
        f"LOSS_SCALING = {p.loss_scaling!r}",
    ])


def _dict(header: str, items: dict) -> str:
    if not items:
        return f"{header} = {{}}"
    body = "".join(f"    {k!r}: {v!r},\n" for k, v in items.items())
    return f"{header} = {{\n{body}}}"


def _tuple(header: str, items: tuple) -> str:
    if not items:
        return f"{header} = ()"
    return f"{header} = (\n" + "".join(f"    {x!r},\n" for x in items) + ")"


def _describe(layout: Layout) -> str:
    if isinstance(layout, Partial):
        return "Partial: every rank back-propagates its piece"
    if isinstance(layout, Replicate):
        return "Replicate: rank 0's copy is back-propagated"
    return repr(layout)


def _shards(program: DistProgram, layouts: dict[str, Layout]) -> dict[str, tuple[int, tuple[int, ...]]]:
    out = {}
    for name, lay in layouts.items():
        if isinstance(lay, Shard):
            d = program._dim(name, lay.dim)
            out[name] = (d, tuple(program.lengths(name, d)))
    return out


def _local_calls(program: DistProgram) -> dict:
    nodes = {n.name: n for n in program.graph.nodes}
    out = {}
    for step in program.steps:
        if isinstance(step, Compute) and step.strategy.local is not None:
            node = nodes[step.node]
            # The executor builds infos from the strategy's layouts; a value read or written in
            # a Shard layout is in SHARDS, so listing names reproduces them.
            ins = tuple(v if isinstance(lay, Shard) else "" for v, lay in zip(step.inputs, step.strategy.inputs))
            outs = tuple(v if isinstance(lay, Shard) else "" for v, lay in zip(node.outputs, step.strategy.outputs))
            shapes = tuple(tuple(program.graph.meta(o).shape) for o in node.outputs)
            out[step.node] = (node.op, ins, outs, shapes)
    return out


# ---- forward ---------------------------------------------------------------------------------

def _forward(program: DistProgram, names: _Names, cluster: Any, blocks: list[Block] = ()) -> str:
    graph = program.graph
    sources = graph.params + graph.buffers + [n for n, x in graph.values.items() if x.kind == "constant"] + \
        graph.inputs
    if blocks:
        return by_block.render(program, blocks, names, sources,
                               lambda steps, ctx=None: _step_lines(program, steps, names, cluster, ctx))
    lines = ["def forward(rt: Rank, v: dict[str, torch.Tensor]) -> torch.Tensor:",
             '    """One training forward on this rank\'s pieces; returns its piece of the loss."""']
    lines.append("    # sources: this rank's pieces of parameters, buffers and inputs")
    for name in sources:
        lines.append(f"    {names[name]} = v[{name!r}]")
    lines += _step_lines(program, program.steps, names, cluster)
    lines.append(f"    return {names[graph.output]}")
    return "\n".join(lines) + "\n"


def _step_lines(program: DistProgram, steps: list, names: _Names, cluster: Any, ctx: Any = None) -> list[str]:
    """One line per step, the user's source line above the ops it produced. ``ctx(node)``, when
    given, is the source that makes a local op's RankCtx (a block function passes the call's name)."""
    graph = program.graph
    nodes = {n.name: n for n in graph.nodes}
    lines: list[str] = []
    last_source = None
    for step in steps:
        if isinstance(step, Redistribute):
            lines += _redistribute(program, step, names, cluster)
            continue
        node = nodes[step.node]
        loc = node.source
        if loc is not None and (loc.file, loc.line) != last_source:
            code = f"  {loc.code}" if loc.code else ""
            lines.append(f"    # {os.path.basename(loc.file)}:{loc.line}{code}")
            last_source = (loc.file, loc.line)
        lines += _compute(program, node, step, names, ctx)
        if node.mutates and node.mutates in graph.values and graph.values[node.mutates].kind == "buffer" \
                and node.outputs:
            lines.append(f"    rt.write_back({names[node.mutates]}, {names[node.outputs[0]]})"
                         f"   # {node.op} ran in place on a buffer")
    return lines


def _compute(program: DistProgram, node: Node, step: Compute, names: _Names, ctx: Any = None) -> list[str]:
    strat = step.strategy
    facts = Facts(program.graph)
    reads = iter(step.inputs)
    args = [_literal(a, reads, names, facts) for a in node.args]
    kwargs = [f"{k}={_literal(a, reads, names, facts)}" for k, a in node.kwargs.items()]
    outs = [names[o] for o in node.outputs]
    layouts = ", ".join(map(repr, strat.outputs))
    if strat.local == "linear_sfb":
        bias = args[2] if len(args) > 2 else "None"
        call = f"rt.linear_sfb({args[0]}, {args[1]}, {bias}, {step.inputs[0]!r})"
        lhs = outs[0]
        note = f"   # -> {layouts}, weight gradient from gathered factors (no all-reduce)"
    elif strat.local is None:
        call = f"{_op_expr(node.op)}({', '.join(args + kwargs)})"
        lhs = _unpack(facts.op_results(node.op), outs)
        note = f"   # -> {layouts}" if not strat.is_replicated else ""
    else:
        made = ctx(node.name) if ctx is not None else f"rt.ctx({node.name!r})"
        call = f"{runtime_facts.local_op_module(strat.local)}.{strat.local}({', '.join([made] + args + kwargs)})"
        if runtime_facts.is_generator_local_op(strat.local):
            call = f"rt.drive({call})"
        lhs = outs[0] if len(outs) == 1 else ", ".join(outs)
        note = f"   # {node.op} -> {layouts}"
    lines = [f"    {lhs} = {call}{note}"]
    empty = empty_ranks(program, step)
    if empty:       # some ranks hold empty pieces, which several ops reject
        shapes = [program.local_shape(o, lay, empty[0]) for o, lay in zip(node.outputs, strat.outputs)]
        dtypes = [program.graph.meta(o).dtype for o in node.outputs]
        ins = ", ".join(names[r] for r in step.inputs)
        lines = [f"    if rt.rank in {tuple(empty)!r}:   # this rank's pieces are empty: zeros, tied to the inputs",
                 f"        {', '.join(outs)}, = L.empty_piece_result(({ins},), {shapes!r}, {dtypes!r})",
                 "    else:", "    " + lines[0]]
    if strat.rescale is not None:
        pos, _ = strat.rescale
        src = step.inputs[pos]
        if isinstance(strat.inputs[pos], Shard):
            for o in outs:
                lines.append(f"    {o} = rt.rescale({o}, {src!r})   # exact mean under uneven (even empty) pieces")
    return lines


def _unpack(returns: int | None, outs: list[str]) -> str:
    """Assignment target for an op returning ``returns`` results (None: a list): one name, or
    the first ``len(outs)`` of its results."""
    if len(outs) == 1 and returns == 1:
        return outs[0]
    if returns is not None and returns == len(outs):
        return ", ".join(outs)
    # A list result (split) or a prefix of several results.
    return f"{', '.join(outs)}, *_"


def _op_expr(op: str) -> str:
    parts = op.split(".")
    if len(parts) != 3:
        raise ValueError(f"cannot emit a call to {op!r}: not an 'aten.<op>.<overload>' name")
    if parts[0] == "aten":
        return op
    return f"torch.ops.{op}"


def _literal(a: Any, reads, names: _Names, facts: Facts) -> str:
    """A traced argument as Python source: value names for tensors, constants as themselves
    (dtype strings become torch dtypes, traced devices become this run's device)."""
    if isinstance(a, Ref):
        return names[next(reads)]
    if isinstance(a, list):
        return "[" + ", ".join(_literal(x, reads, names, facts) for x in a) + "]"
    if isinstance(a, tuple):
        inner = ", ".join(_literal(x, reads, names, facts) for x in a)
        return f"({inner},)" if len(a) == 1 else f"({inner})"
    if isinstance(a, float):
        if math.isnan(a):
            return "math.nan"
        if math.isinf(a):
            return "math.inf" if a > 0 else "-math.inf"
        return repr(a)
    if isinstance(a, str):
        named = facts.torch_name(a)
        if named is not None:
            return named
        if a.split(":")[0] in ("cpu", "cuda", "meta"):
            return "rt.device"
        return repr(a)
    return repr(a)


def _redistribute(program: DistProgram, step: Redistribute, names: _Names, cluster: Any) -> list[str]:
    src, dst = step.src_layout, step.dst_layout
    x, y = names[step.src], names[step.out]
    what = f"{step.src}: {src!r} -> {dst!r}"
    method = _method(program, step, cluster)
    form = runtime_facts.method_of(method)
    if src == dst:
        return [f"    {y} = {x}   # {what}, nothing moves"]
    if not reachable(src, dst):
        raise ValueError(f"cannot emit a redistribution {src!r} -> {dst!r}")
    if isinstance(src, Shard) and isinstance(dst, Replicate):
        return [f"    # {what}, all-gather ({form}); backward reduce-scatters",
                f"    {y} = rt.all_gather({x}, {step.src!r}, {method!r})"]
    if isinstance(src, Partial) and isinstance(dst, Replicate):
        return [f"    # {what}, all-reduce ({'hierarchical' if form == runtime_facts.hierarchical() else 'flat'}); backward all-reduces",
                f"    {y} = rt.all_reduce({x}, {method!r})"]
    if isinstance(src, Partial) and isinstance(dst, Shard):
        return [f"    # {what}, reduce-scatter ({form}); backward all-gathers",
                f"    {y} = rt.reduce_scatter({x}, {step.out!r}, {method!r})"]
    if isinstance(src, Shard) and isinstance(dst, Shard):
        return [f"    # {what}, all-to-all (split sizes); backward runs it in reverse",
                f"    {y} = rt.all_to_all({x}, {step.src!r}, {step.out!r}, {method!r})"]
    if isinstance(src, Replicate) and isinstance(dst, Shard):
        return [f"    {y} = rt.slice({x}, {step.out!r})   # {what}, a local slice (free)"]
    if isinstance(src, Shard) and isinstance(dst, Partial):
        return [f"    {y} = rt.pad_partial({x}, {step.src!r})   # {what}, zero padding (local)"]
    if isinstance(src, Replicate) and isinstance(dst, Partial):
        return [f"    {y} = rt.keep_on_rank0({x})   # {what}, rank 0 keeps it, the others hold zeros"]
    raise ValueError(f"cannot emit a redistribution {src!r} -> {dst!r}")


def _method(program: DistProgram, step: Redistribute, cluster: Any) -> str:
    """The collective variant to run: the step's own, or for "auto" the cost model's cheapest
    on ``cluster`` (when given), mapped to an implemented form by the runtime."""
    if step.method != "auto" or cluster is None:
        return step.method
    from costmodel.collectives import best_variant
    from costmodel.transfers import forward_move

    move = forward_move(program, step)
    if move is None or move.kind == "local":
        return "auto"
    variant, _ = best_variant(move.kind, move.piece_bytes, cluster, send_matrix=move.send_matrix)
    return variant


def _uses_hierarchical(program: DistProgram, cluster: Any) -> bool:
    hier = runtime_facts.hierarchical()
    return any(isinstance(s, Redistribute) and runtime_facts.method_of(_method(program, s, cluster)) == hier
               for s in program.steps)


# ---- docstring -------------------------------------------------------------------------------

_RANK_ROW = re.compile(r"^(\s*)(\d+)(\s+)(\d+)(\s.*)$")     # "  12    1 A100-80GB  0.004 ..."


def _same_ranks_once(lines: list[str]) -> list[str]:
    """The summary's per-rank rows, consecutive ranks that read the same after their rank and
    node numbers written once with the range they cover (256 devices, two kinds: two rows)."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        row = _RANK_ROW.match(lines[i])
        j = i
        while row and j + 1 < len(lines) and (nxt := _RANK_ROW.match(lines[j + 1])) and nxt.group(5) == row.group(5):
            j += 1
        out.append(lines[i])
        if j - i >= 2:
            last = _RANK_ROW.match(lines[j])
            nodes = f"node {row.group(4)}" if row.group(4) == last.group(4) else \
                f"nodes {row.group(4)}-{last.group(4)}"
            out.append(f"{row.group(1)}... ranks {row.group(2)}-{last.group(2)} ({nodes}) alike")
        elif j > i:
            out.append(lines[j])
        i = j + 1
    return out


def _docstring(program: DistProgram, model_name: str, plan_summary: str) -> str:
    n = program.world
    shares = " / ".join(f"{s:.3f}" for s in program.shares)
    collectives = sum(1 for s in program.steps if isinstance(s, Redistribute))
    summary = "\n".join(_same_ranks_once(plan_summary.strip().splitlines())) if plan_summary.strip() else \
        f"{len(program.steps)} steps ({collectives} redistributions), shares {shares}"
    summary = summary.replace('"""', "'''").replace("\\", "\\\\")
    return f'''"""Distributed training of {model_name} on {n} ranks: an SPMD program generated by hapc.

Plan: {summary}

Run (N = {n}; the rank's device comes from torchrun's LOCAL_RANK):

    torchrun --nproc_per_node={n} program.py [--steps K] [--device cpu|cuda] [--verify]
        [--save DIR [--save-every N]] [--load DIR]   # checkpoints load under any plan of the model
        [--timings]                                  # per-rank compute, comm and idle seconds
        [--measure-memory]                           # CPU: per-rank peak tensor bytes (GPUs: always)

Files beside this one: {model_name} (the model file), hapc_local_ops.py, hapc_random_ops.py,
hapc_collectives.py, hapc_loss_scale.py, hapc_zero.py, hapc_checkpoint.py, hapc_timings.py and
hapc_memory.py (the runtime). Only torch is needed. The plan is data (the tables below); ``forward`` is one
line per step of the plan, with the user's source line above the ops it produced; a block of steps
repeated layer after layer is one function (``block_<k>``) that ``forward`` calls once per layer.

Use it in your own loop (inside an initialised process group, every rank):

    import importlib.util, torch, torch.distributed as dist
    spec = importlib.util.spec_from_file_location("program", "OUT/program.py")
    program = importlib.util.module_from_spec(spec); spec.loader.exec_module(program)
    dist.init_process_group("gloo")                  # or "nccl"; torchrun sets rank/world
    params, step = program.build("cpu")              # this rank's pieces of the weights
    opt = torch.optim.AdamW(params.values(), lr=1e-3)
    for batch in loader:                             # the global batch, same on every rank
        loss = step(batch)                           # forward, backward, gradient sync
        opt.step(); opt.zero_grad()
"""
'''
