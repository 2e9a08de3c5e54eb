"""The simulator and memory model read byte counts through one remembered table per program
(costmodel.transfers.LocalBytes): the very floats local_bytes gives, and the same memory
report as the model worked out rank by rank from local_bytes."""

from __future__ import annotations

from tests.costmodel.cm_programs import chain_graph, data_parallel, zero3
from tests.costmodel.test_cm_simcache import MIXED, _programs

from costmodel.memory import PARTS, kept_for_backward, optimizer_copies, program_memory
from costmodel.opclass import op_class
from costmodel.transfers import LocalBytes, forward_move, local_bytes
from hapc.ir.graph import TensorMeta, Value
from hapc.ir.layout import P, R, Replicate, Shard
from hapc.ir.program import Compute, Redistribute


def _mixed_precision_program():
    """A bf16 chain with float32 weights: every product casts its weight (autocast copies)."""
    graph = chain_graph(batch=29, widths=(6, 12, 6), dtype="bfloat16")
    for w in graph.params:
        v = graph.values[w]
        graph.values[w] = Value(w, TensorMeta(v.meta.shape, "float32"), "param", v.target, True)
    return data_parallel(graph, MIXED.flops_shares())


def _programs_with_every_part():
    return _programs() + [_mixed_precision_program(), zero3(chain_graph(batch=29, widths=(6, 12, 6)),
                                                            (0.5, 0.25, 0.125, 0.0625, 0.03125, 0.03125))]


def _memory_rank_by_rank(program, cluster, optimizer="adamw") -> list[dict[str, float]]:
    """The memory model without classes or remembered byte counts (its definition, spelled out)."""
    graph, world = program.graph, program.world
    copies = optimizer_copies(optimizer)
    parts = [dict.fromkeys(PARTS, 0.0) for _ in range(world)]

    def add(part, amounts, times=None):
        for r in range(world):
            parts[r][part] += amounts[r] if times is None else times * amounts[r]

    for name in graph.params + graph.buffers:
        piece = local_bytes(program, name, program.source_layouts.get(name, R))
        add("params_bytes", piece)
        if graph.values[name].requires_grad:
            add("grads_bytes", piece)
            add("optimizer_bytes", piece, copies)
    for name in graph.inputs:
        add("activations_bytes", local_bytes(program, name, program.source_layouts.get(name, R)))
    nodes = {n.name: n for n in graph.nodes}
    cast: set[str] = set()
    for step in program.steps:
        if isinstance(step, Compute):
            node = nodes[step.node]
            if op_class(node.op) == "view":
                continue
            for out, layout, times in kept_for_backward(program, node, step):
                add("activations_bytes", local_bytes(program, out, layout), times)
            if graph.meta(node.outputs[0]).dtype in ("bfloat16", "float16"):
                for ref, layout in zip(node.input_refs(), step.strategy.inputs):
                    v = graph.values[ref]
                    gathered = isinstance(program.source_layouts.get(ref), Shard) and not isinstance(layout, Shard)
                    if v.kind == "param" and v.meta.dtype == "float32" and ref not in cast and not gathered:
                        cast.add(ref)
                        add("activations_bytes", local_bytes(program, ref, layout), 0.5)
        elif isinstance(step, Redistribute):
            move = forward_move(program, step)
            if move is None:
                continue
            out = local_bytes(program, step.out, step.dst_layout)
            weight = step.src in graph.values and graph.values[step.src].kind == "param"
            regathered = weight and isinstance(step.src_layout, Shard) and isinstance(step.dst_layout, Replicate)
            if graph.values[step.src.split("@", 1)[0]].requires_grad and not regathered:
                add("activations_bytes", out)       # a weight gathered from shards is gathered again
            if move.kind == "local":
                continue
            buffer = list(out)
            if move.kind == "all_gather" and isinstance(step.src_layout, Shard):
                buffer = [max(b, max(move.piece_bytes) * world) for b in buffer]
            for r in range(world):
                parts[r]["comm_buffer_bytes"] = max(parts[r]["comm_buffer_bytes"], buffer[r])
    return parts


def test_remembered_byte_counts_are_local_bytes_exactly():
    for program in _programs_with_every_part():
        pieces = LocalBytes(program)
        names = list(program.graph.values) + [s.out for s in program.steps if isinstance(s, Redistribute)]
        for name in names:
            rank = len(program.shape(name))
            layouts = [R, P] + [Shard(d) for d in range(-rank, rank)]
            for layout in layouts:
                assert pieces(name, layout) == local_bytes(program, name, layout), (name, layout)


def test_memory_equals_the_model_worked_out_rank_by_rank():
    for program in _programs_with_every_part():
        got = program_memory(program, MIXED)
        assert [vars(d) for d in got.devices] == _memory_rank_by_rank(program, MIXED)
    assert any(d.activations_bytes for d in program_memory(_mixed_precision_program(), MIXED).devices)
