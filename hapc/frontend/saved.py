"""What autograd saves for backward, per node, found by running each op once on the meta device.

The memory model (:mod:`costmodel.memory`) must know which tensors a training step keeps alive
until backward. Counting every node output that needs a gradient, as a first model did, is
wrong both ways: ``add`` and ``view`` save nothing, ``mean`` and ``to`` nothing, while ``mul``
saves both its inputs, ``embedding`` its integer indices and a fused attention its
log-sum-exp. Rather than a hand-written table per op, each distinct op signature (op, argument
shapes, dtypes, which inputs need a gradient, the other arguments) is run once on meta tensors
under :func:`torch.autograd.graph.saved_tensors_hooks`, and what the hook receives is matched
to the node's inputs and outputs by identity (or as a view of one); anything else it saves
(LayerNorm's mean and rstd, dropout's mask, cross-entropy's log-probabilities) is counted in
bytes, as the node's own. Meta tensors have no data, so this costs microseconds per signature.

One exception: ``scaled_dot_product_attention`` on meta takes the math path, which saves the
``S x S`` attention probabilities; GPUs (flash, memory-efficient) and CPUs (flash for CPU) save
the query, key, value, output and a log-sum-exp row per query instead, so that is what is
recorded for it.

Recorded at trace time (:func:`record_saved`, into :class:`hapc.ir.graph.TorchFacts`), so that
planning from a cached trace or a plan needs no torch. An op that cannot run on meta gets no
record and the memory model's older rule.
"""

from __future__ import annotations

from typing import Any

from hapc.frontend.torchfacts import resolve_op, torch_name
from hapc.ir.graph import Graph, Node, Ref

# node name -> (flat input positions saved, output indices saved, other bytes saved)
SavedSpec = tuple[tuple[int, ...], tuple[int, ...], int]

_ATTENTION = "aten.scaled_dot_product_attention.default"


def record_saved(graph: Graph) -> dict[str, SavedSpec]:
    """Per node of ``graph`` (call where torch is loaded: the tracer), what autograd saves."""
    known: dict[tuple, SavedSpec | None] = {}
    out: dict[str, SavedSpec] = {}
    for node in graph.nodes:
        key = _signature(graph, node)
        if key not in known:
            known[key] = _attention(graph, node) if node.op == _ATTENTION else _probe(graph, node)
        if known[key] is not None:
            out[node.name] = known[key]
    return out


def _signature(graph: Graph, node: Node) -> tuple:
    def arg(a: Any) -> Any:
        if isinstance(a, Ref):
            v = graph.values[a.name]
            return ("%", v.meta.shape, v.meta.dtype, v.requires_grad)
        if isinstance(a, (list, tuple)):
            return tuple(arg(x) for x in a)
        return repr(a)
    return (node.op, arg(node.args), tuple(sorted((k, arg(v)) for k, v in node.kwargs.items())))


def _probe(graph: Graph, node: Node) -> SavedSpec | None:
    import torch

    op = resolve_op(node.op)
    if op is None:
        return None
    inputs: list[torch.Tensor] = []

    def build(a: Any) -> Any:
        if isinstance(a, Ref):
            v = graph.values[a.name]
            dtype = getattr(torch, v.meta.dtype)
            t = torch.empty(v.meta.shape, dtype=dtype, device="meta",
                            requires_grad=bool(v.requires_grad) and (dtype.is_floating_point or dtype.is_complex))
            inputs.append(t)
            return t
        if isinstance(a, list):
            return [build(x) for x in a]
        if isinstance(a, tuple):
            return tuple(build(x) for x in a)
        if isinstance(a, str):
            return _torch_object(a)
        return a

    packed: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t

    try:
        args = build(node.args)
        kwargs = {k: build(v) for k, v in node.kwargs.items()}
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = op(*args, **kwargs)
    except Exception:           # noqa: BLE001 - an op meta cannot run keeps the older rule
        return None
    results = [r for r in (result if isinstance(result, (tuple, list)) else (result,))]
    saved_in: set[int] = set()
    saved_out: set[int] = set()
    extra = 0
    others: set[int] = set()          # one storage saved twice (log_softmax's result by nll_loss) counts once
    for t in packed:
        at_in = _index_of(t, inputs)
        at_out = _index_of(t, [r if isinstance(r, torch.Tensor) else None for r in results])
        if at_in is not None:
            saved_in.add(at_in)
        elif at_out is not None:
            saved_out.add(at_out)
        elif id(t._base if t._base is not None else t) not in others:
            others.add(id(t._base if t._base is not None else t))
            base = t._base if t._base is not None else t
            extra += base.numel() * base.element_size()
    return tuple(sorted(saved_in)), tuple(sorted(saved_out)), int(extra)


def _index_of(t: Any, candidates: list[Any]) -> int | None:
    """Where ``t`` is among ``candidates``: the tensor itself, or a view of it (or of its base)."""
    for i, c in enumerate(candidates):
        if c is None:
            continue
        base = c._base if c._base is not None else c
        if t is c or t._base is c or (t._base is not None and t._base is base):
            return i
    return None


def _attention(graph: Graph, node: Node) -> SavedSpec:
    """The fused kernels' saved tensors: query, key, value (and a mask), the output, and a
    float32 log-sum-exp per query row (``B x H x S_q``)."""
    refs = node.input_refs()
    saved = tuple(range(min(len(refs), 4)))      # q, k, v and the mask when one is passed
    q = graph.values[refs[0]].meta.shape
    rows = 1
    for d in q[:-1]:
        rows *= d
    return saved, (0,), 4 * rows


def _torch_object(text: str) -> Any:
    """A traced string constant as torch takes it (``"float32"`` -> ``torch.float32``)."""
    import torch

    name = torch_name(text)
    return text if name is None else getattr(torch, name.removeprefix("torch."))
