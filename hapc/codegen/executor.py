"""In-process N-rank executor: runs a :class:`DistProgram` for simulated ranks in one process.

Every rank's tensors live in one autograd graph, so collectives are plain differentiable
tensor ops over the list of rank pieces (all-gather is a ``cat``, all-reduce a ``sum``).
Autograd then derives exactly the backward a correct SPMD program must perform, and the
gradient of each parameter arrives at its single global leaf. Checking a plan against the
single-device run therefore takes milliseconds and needs no processes.

The loss of the program is the sum over ranks of each rank's ``Partial`` piece (or rank 0's
copy of a ``Replicate`` loss), matching what the emitted program back-propagates.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hapc.ir.graph import Node, Ref
from hapc.ir.layout import Layout, Partial, Replicate, Shard, reachable
from hapc.ir.program import Compute, DistProgram, Redistribute, Strategy, empty_ranks
from hapc.runtime import random_ops
from hapc.runtime.local_ops import (LOCAL_OPS, Collective, RankCtx, ShardInfo, empty_piece_result,
                                    rescale_to_global)
from hapc.frontend.tracer import Traced

Pieces = list[torch.Tensor]


@dataclass
class RunResult:
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]   # parameter value name -> gradient


def replicated_program(graph, world: int = 1) -> DistProgram:
    """The plan every rank runs in full: the reference for checks."""
    from hapc.rules.registry import strategies

    prog = DistProgram(graph, tuple([1.0] * world),
                       {n: Replicate() for n in graph.params + graph.buffers + graph.inputs +
                        [v.name for v in graph.values.values() if v.kind == "constant"]})
    for node in graph.nodes:
        strat = next(s for s in strategies(node, graph) if s.is_replicated)
        prog.steps.append(Compute(node.name, strat, tuple(node.input_refs())))
    return prog


def run(program: DistProgram, traced: Traced, inputs: Sequence[torch.Tensor], *,
        dtype: torch.dtype | None = None, seed: int = 0, backward: bool = True,
        autocast: torch.dtype | None = None) -> RunResult:
    """Execute ``program`` on ``len(program.shares)`` simulated ranks; return loss and grads.
    ``autocast`` (``torch.bfloat16``) runs the forward under CPU autocast, as a bf16 plan's
    emitted program does; parameters stay in their own dtype (master weights)."""
    graph = program.graph
    leaves: dict[str, torch.Tensor] = {}
    for name in graph.params:
        t = traced.tensor(name).detach().clone()
        t = t.to(dtype) if dtype is not None and t.is_floating_point() else t
        leaves[name] = t.requires_grad_(graph.values[name].requires_grad)
    for v in graph.values.values():
        if v.kind in ("buffer", "constant"):
            t = traced.tensor(v.name).detach().clone()
            leaves[v.name] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
    for name, x in zip(graph.inputs, inputs):
        leaves[name] = x.to(dtype) if dtype is not None and x.is_floating_point() else x

    env: dict[str, Pieces] = {}
    for name, layout in program.source_layouts.items():
        env[name] = _scatter(program, name, leaves[name], layout)

    nodes = {n.name: n for n in graph.nodes}
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        for step in program.steps:
            if isinstance(step, Redistribute):
                env[step.out] = redistribute(program, step, env[step.src])
            else:
                node = nodes[step.node]
                outs = _compute(program, node, step, env, seed, dtype)
                for name, pieces in zip(node.outputs, outs):
                    env[name] = pieces

    out_layout = program.layouts()[graph.output]
    pieces = env[graph.output]
    loss = sum(pieces) if isinstance(out_layout, Partial) else pieces[0]
    loss = loss.reshape(())
    grads: dict[str, torch.Tensor] = {}
    if backward and loss.requires_grad:
        trainable = [p for p in graph.params if leaves[p].requires_grad]
        got = torch.autograd.grad(loss, [leaves[p] for p in trainable], allow_unused=True)
        found = dict(zip(trainable, got))
        grads = {p: (g if (g := found.get(p)) is not None else torch.zeros_like(leaves[p])) for p in graph.params}
    return RunResult(loss.detach(), grads)


def _scatter(program: DistProgram, name: str, full: torch.Tensor, layout: Layout) -> Pieces:
    if isinstance(layout, Replicate):
        return [full] * program.world
    if isinstance(layout, Shard):
        return _split(program, name, full, layout.dim)
    raise ValueError(f"a source value cannot start Partial: {name}")


def _split(program: DistProgram, name: str, full: torch.Tensor, dim: int) -> Pieces:
    lengths = program.lengths(name, dim)
    return list(torch.split(full, lengths, dim=dim))


def redistribute(program: DistProgram, step: Redistribute, pieces: Pieces) -> Pieces:
    """Collectives as differentiable ops on the list of rank pieces."""
    src, dst = step.src_layout, step.dst_layout
    world = program.world
    if src == dst:
        return list(pieces)
    if not reachable(src, dst):
        raise ValueError(f"cannot redistribute {src} -> {dst}")
    if isinstance(src, Shard):
        full = torch.cat(pieces, dim=src.dim)
    elif isinstance(src, Partial):
        full = torch.stack(pieces).sum(0)
    else:
        full = None
    if isinstance(dst, Replicate):
        return [full] * world
    if isinstance(dst, Shard):
        if isinstance(src, Replicate):   # a free local slice of this rank's own copy
            lengths = program.lengths(step.out, dst.dim)
            offs = program.offsets(step.out, dst.dim)
            return [p.narrow(dst.dim, o, n) for p, o, n in zip(pieces, offs, lengths)]
        return _split(program, step.out, full, dst.dim)
    if isinstance(dst, Partial):
        if isinstance(src, Replicate):   # rank 0 keeps the value, the others hold zeros
            return [pieces[0]] + [torch.zeros_like(p) for p in pieces[1:]]
        # Shard -> Partial: each rank pads its piece with zeros to the full shape.
        offs = program.offsets(step.src, src.dim)
        total = full.shape[src.dim]
        dims_after = full.dim() - 1 - (src.dim % full.dim())
        return [torch.nn.functional.pad(p, [0, 0] * dims_after + [o, total - o - p.shape[src.dim]])
                for p, o in zip(pieces, offs)]
    raise ValueError(f"cannot redistribute {src} -> {dst}")


def _infos(program: DistProgram, names: Sequence[str], layouts: Sequence[Layout], rank: int):
    infos = []
    for name, lay in zip(names, layouts):
        if isinstance(lay, Shard):
            d = program._dim(name, lay.dim)
            lengths = program.lengths(name, d)
            infos.append(ShardInfo(d, sum(lengths[:rank]), lengths[rank], program.shape(name)[d]))
        else:
            infos.append(None)
    return tuple(infos)


def _compute(program: DistProgram, node: Node, step: Compute, env: dict[str, Pieces], seed: int,
             dtype: torch.dtype | None = None):
    strat: Strategy = step.strategy
    world = program.world
    fn = _resolve(node.op) if strat.local is None else _local_op(strat.local)
    out_shapes = tuple(program.graph.meta(o).shape for o in node.outputs)
    results: list[Any] = []
    gens = {}
    for rank in range(world):
        # input_refs may repeat a name with different layouts: substitute by position.
        args, kwargs = _substitute(node, [env[v][rank] for v in step.inputs], dtype)
        if strat.local is None and _empty_here(program, step, rank):
            res = empty_piece_result([env[v][rank] for v in step.inputs], _local_out_shapes(program, node, strat, rank),
                                     [program.graph.meta(o).dtype for o in node.outputs])
        elif strat.local is None:
            res = fn(*args, **kwargs)
        else:
            ctx = RankCtx(rank, world, node.name, node.op,
                          _infos(program, step.inputs, strat.inputs, rank),
                          _infos(program, node.outputs, strat.outputs, rank), out_shapes, seed)
            res = fn(ctx, *args, **kwargs)
            if inspect.isgenerator(res):
                gens[rank] = res
        results.append(res)
    if gens:
        results = _drive_lockstep([results[r] for r in range(world)])
    outs: list[Pieces] = [[] for _ in node.outputs]
    for rank, res in enumerate(results):
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        if strat.rescale is not None:
            pos = strat.rescale[0]
            info = _infos(program, [step.inputs[pos]], [strat.inputs[pos]], rank)[0]
            if info is not None:
                res = [rescale_to_global(r, info.length, info.global_length) for r in res]
        for i in range(len(node.outputs)):
            outs[i].append(res[i])
    return outs


def _local_op(name: str):
    """A local op by name, from either runtime file that defines them (looked up at each call,
    so a test may swap one in)."""
    return LOCAL_OPS[name] if name in LOCAL_OPS else random_ops.LOCAL_OPS[name]


def _empty_here(program: DistProgram, step: Compute, rank: int) -> bool:
    return rank in empty_ranks(program, step)


def _local_out_shapes(program: DistProgram, node: Node, strat: Strategy, rank: int) -> list[tuple[int, ...]]:
    return [program.local_shape(o, lay, rank) for o, lay in zip(node.outputs, strat.outputs)]


def _drive_lockstep(gens: list) -> list[Any]:
    """Advance every rank's generator together, answering each yielded Collective."""
    results: list[Any] = [None] * len(gens)
    sends: list[Any] = [None] * len(gens)
    live = set(range(len(gens)))
    while live:
        requests = {}
        for r in sorted(live):
            try:
                requests[r] = gens[r].send(sends[r])
            except StopIteration as stop:
                results[r] = stop.value
        done = set(range(len(gens))) - set(requests)
        live -= done
        if not requests:
            break
        if done & set(requests):
            raise RuntimeError("ranks disagree on the number of collectives")
        if len(requests) != len(gens):
            raise RuntimeError("some ranks finished while others wait in a collective")
        reqs = [requests[r] for r in range(len(gens))]
        kinds = {q.kind for q in reqs}
        if len(kinds) != 1 or not all(isinstance(q, Collective) for q in reqs):
            raise RuntimeError(f"mismatched collectives across ranks: {kinds}")
        stacked = torch.stack([q.tensor for q in reqs])
        value = stacked.sum(0) if reqs[0].kind == "sum" else stacked.amax(0)
        sends = [value] * len(gens)
    return results


def _substitute(node: Node, tensors: list[torch.Tensor], dtype: torch.dtype | None = None):
    """Constants back to torch objects; with ``dtype`` (a run in another precision) every float
    dtype constant, such as the target of a traced ``.to(torch.float32)``, becomes ``dtype``."""
    it = iter(tensors)

    def sub(a: Any) -> Any:
        if isinstance(a, Ref):
            return next(it)
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x) for x in a)
        if isinstance(a, str) and hasattr(torch, a) and isinstance(getattr(torch, a), torch.dtype):
            found = getattr(torch, a)
            return dtype if dtype is not None and found.is_floating_point else found
        if isinstance(a, str) and a.startswith("torch."):
            return getattr(torch, a.removeprefix("torch."))
        if isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda", "meta"):
            return torch.device("cpu")   # traced on any device (even meta), executed here on CPU
        return a

    args = sub(node.args)
    kwargs = {k: sub(v) for k, v in node.kwargs.items()}
    return args, kwargs


def _resolve(op: str):
    """``aten.mm.default`` or any library's ``namespace.op.overload`` (registered when the model
    file was imported) -> the callable operator."""
    namespace, packet, overload = op.split(".", 2)
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
