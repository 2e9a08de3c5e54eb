"""A pipelined plan's graph at one micro-batch, and what its micro-batches need to agree with
the whole batch: how their losses add up (:mod:`synth.microbatching`) and where their random
draws lie in the whole batch's draw.

A pipeline runs its stages on ``batch / m`` samples at a time. The model is traced again at that
size (its views, masks and positions are rebuilt there) and checked node for node against the
plan's whole-batch graph; what the trace changes is recorded in plan.json, so that emitting the
plan again needs no torch (:func:`micro_batch_graph`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hapc.codegen import runtime_facts
from hapc.errors import UserError
from hapc.ir.graph import Graph, Node, TensorMeta, TorchFacts, Value, _from_jsonable, _jsonable

if TYPE_CHECKING:
    from hapc.plan.plan import Plan


@dataclass
class MicroTrace:
    """The plan's graph at one micro-batch, what the program's loss reduces with, and the
    constants the micro-batch trace lifted (none when rebuilt from plan.json's record)."""

    graph: Graph
    constants: dict
    loss_reduction: str = "mean"
    rows: int = 0                 # samples per micro-batch
    record: dict[str, Any] = field(default_factory=dict)    # see micro_batch_record
    loss_node: str | None = None    # the loss whose counted targets weigh micro-batches ("count")


def micro_batch_graph(plan: Plan) -> MicroTrace:
    """The plan's graph at one micro-batch: rebuilt from the plan's record when it holds one
    for this micro-batch, else the model traced at one micro-batch (precision applied),
    checked node for node against the plan's whole-batch graph."""
    rows = _micro_batch_rows(plan)
    record = plan.microbatch_record
    # A record without "loss_node" predates exact micro-batch weighing (synth.microbatching): traced again.
    if record is not None and record.get("rows") == rows and "loss_node" in record:
        return MicroTrace(_graph_from_record(plan.graph, record), {}, record["loss_reduction"], rows, record,
                          record["loss_node"])
    return _traced_micro_batch(plan, rows)


def _micro_batch_rows(plan: Plan) -> int:
    from synth.stagespace import batch_size

    m = plan.pipeline.microbatches
    batch = batch_size(plan.graph)
    if batch % m:
        raise UserError(f"--microbatches {m} does not divide the batch of {batch} samples")
    return batch // m


def _traced_micro_batch(plan: Plan, rows: int) -> MicroTrace:
    from hapc.ir.precision import autocast_graph
    from hapc.codegen.launch import run_device
    from hapc.frontend.modelfile import load_model_file
    from synth.stagespace import batch_size

    batch = batch_size(plan.graph)
    mf = load_model_file(plan.model["file"], plan.model.get("kwargs") or {})
    inputs = tuple(x.narrow(0, 0, rows) if x.dim() and x.shape[0] == batch else x for x in mf.build_inputs())
    traced = _trace(mf, inputs, run_device(plan.cluster))
    graph = autocast_graph(traced.graph, plan.precision.name)
    _check_same_structure(plan.graph, graph, batch, rows)
    split = loss_split_of(plan.graph, plan.pipeline.microbatches)    # the same nodes in both graphs
    if plan.pipeline.microbatches > 1:
        from synth.microbatching import check_batch_constants

        check_batch_constants(plan.graph, graph, split)
    return MicroTrace(graph, traced.constants, split.kind, rows,
                      _record(plan.graph, graph, rows, split.kind, split.node), split.node)


def _record(whole: Graph, micro: Graph, rows: int, reduction: str, loss_node: str | None) -> dict[str, Any]:
    """What ``micro`` changes of ``whole`` (same structure), JSON-ready: values with other
    metadata, nodes with other arguments, torch's facts when they differ."""
    values = {name: [list(v.meta.shape), v.meta.dtype, v.kind, v.target, v.requires_grad]
              for name, v in micro.values.items() if v != whole.values[name]}
    nodes = {b.name: [_jsonable(b.args), _jsonable(b.kwargs), b.mutates]
             for a, b in zip(whole.nodes, micro.nodes)
             if (a.args, a.kwargs, a.mutates) != (b.args, b.kwargs, b.mutates)}
    out: dict[str, Any] = {"rows": rows, "loss_reduction": reduction, "loss_node": loss_node, "values": values,
                           "nodes": nodes}
    if micro.torch_facts != whole.torch_facts and micro.torch_facts is not None:
        out["torch_facts"] = micro.torch_facts.to_dict()
    return out


def _graph_from_record(whole: Graph, record: dict[str, Any]) -> Graph:
    """``whole`` with the record's changes (see :func:`_record`)."""
    values = dict(whole.values)
    for name, (shape, dtype, kind, target, requires_grad) in record["values"].items():
        values[name] = Value(name, TensorMeta(tuple(shape), dtype), kind, target, requires_grad)
    changed = record["nodes"]
    nodes = []
    for node in whole.nodes:
        if node.name in changed:
            args, kwargs, mutates = changed[node.name]
            node = replace(node, args=tuple(_from_jsonable(a) for a in args),
                           kwargs={k: _from_jsonable(v) for k, v in kwargs.items()}, mutates=mutates)
        nodes.append(node)
    facts = TorchFacts.from_dict(record["torch_facts"]) if "torch_facts" in record else whole.torch_facts
    return Graph(values, nodes, list(whole.inputs), list(whole.params), list(whole.buffers), whole.output,
                 dict(whole.unsupported), facts)


def _trace(mf: Any, inputs: tuple, device: str):
    """Trace for ``device`` as the whole batch was (:func:`hapc.frontend.modelfile.trace_for_device`),
    on ``inputs`` (a micro-batch) instead of the model file's own; a fallback to the meta device
    was said once already, for the whole batch."""
    from hapc.frontend.modelfile import trace_for_device
    from hapc.frontend.tracer import trace

    return trace_for_device(mf, trace, device, inputs=inputs, warn=False)


def _check_same_structure(whole: Graph, micro: Graph, batch: int, rows: int) -> None:
    """One-line error where the micro-batch graph is not the whole-batch graph node for node."""
    def fail(what: str) -> None:
        raise UserError(f"the model traced at a micro-batch of {rows} samples has another graph than at its "
                        f"batch of {batch} ({what}); pipelining needs a graph that does not depend on the batch size")

    if len(whole.nodes) != len(micro.nodes):
        fail(f"{len(micro.nodes)} nodes instead of {len(whole.nodes)}")
    for i, (a, b) in enumerate(zip(whole.nodes, micro.nodes)):
        if (a.name, a.op, a.outputs, list(a.input_refs())) != (b.name, b.op, b.outputs, list(b.input_refs())):
            fail(f"node {i}: {_node_difference(a, whole, b, micro)}")
    if set(whole.values) != set(micro.values) or whole.inputs != micro.inputs or whole.output != micro.output:
        fail("other values")


def _node_difference(a: Node, whole: Graph, b: Node, micro: Graph) -> str:
    """What differs between node ``a`` of ``whole`` and ``b`` of ``micro`` (name, op, results,
    or what it reads: by name, op and shape), said so that the two sides never read the same."""
    where = f" at {b.source}" if b.source else ""
    if (a.name, a.op) != (b.name, b.op):
        return f"{b.name} ({b.op}){where} instead of {a.name} ({a.op})"
    if a.outputs != b.outputs:
        return f"{a.name} ({a.op}){where} makes {', '.join(b.outputs)} instead of {', '.join(a.outputs)}"
    ra, rb = a.input_refs(), b.input_refs()
    if len(ra) != len(rb):
        return f"{a.name} ({a.op}){where} reads {len(rb)} values instead of {len(ra)}"
    k = next(k for k, (x, y) in enumerate(zip(ra, rb)) if x != y)
    return (f"{a.name} ({a.op}){where} reads {_described(rb[k], micro)} as its input {k} "
            f"instead of {_described(ra[k], whole)}")


def _described(name: str, graph: Graph) -> str:
    """A value as a reader can tell it apart: its name, the op that made it, its shape."""
    if name not in graph.values:
        return name
    made = next((n.op for n in graph.nodes if name in n.outputs), graph.values[name].kind)
    return f"{name} ({made}, {graph.values[name].meta})"


def drawing_nodes(graph: Graph) -> list[tuple[str, str]]:
    """(op, node) of every node that draws random numbers, in graph order: random ops, every
    dropout, attention with dropout; what ``--verify``'s one-device reference replays, one call
    each (a pipeline's ranks run them once per micro-batch). A dropout of p = 0 (or out of
    training) draws nothing but is listed all the same: the reference takes the k-th node for
    its k-th ``F.dropout`` call whatever its p, as a one-stage program's ``Rank.ran`` lists every
    dropout it ran; leaving it out gave every later dropout of a pipeline's reference the mask
    of the next node (Pegasus, whose activation dropout is 0: ``verify: FAILED``)."""
    return [(node.op, node.name) for node in graph.nodes if _draws(node)]


def _draws(node: Node) -> bool:
    if node.op == "aten.dropout.default":
        return True
    if node.op == "aten.scaled_dot_product_attention.default":
        return bool(node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0))
    return node.op in runtime_facts.random_ops()


def micro_batch_dims(whole: Graph, micro: Graph, m: int) -> dict[str, int]:
    """Per drawing node whose output holds the batch: the dimension it holds it on (where the
    whole batch's shape is ``m`` times the micro-batch's). Its micro-batches draw their rows of
    the whole batch's draw; a node without the batch draws the same in every micro-batch."""
    out = {}
    for node in micro.nodes:
        if _draws(node):
            small, big = micro.meta(node.outputs[0]).shape, whole.meta(node.outputs[0]).shape
            dims = [d for d, (a, b) in enumerate(zip(small, big)) if a != b and a * m == b]
            if dims:
                out[node.name] = dims[0]
    return out


def loss_split_of(graph: Graph, microbatches: int) -> Any:
    """How the step adds up its micro-batches' losses (:func:`synth.microbatching.loss_split`):
    a mean (each weighs 1/m), a sum (each 1) or a mean over counted targets (each its count, the
    total divided by theirs); a model whose samples are coupled is refused (one line naming the
    op). One micro-batch is the whole batch: its loss is the model's."""
    from synth.microbatching import LossSplit, loss_split

    return LossSplit("mean") if microbatches == 1 else loss_split(graph)
