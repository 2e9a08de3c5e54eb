"""Functionalization of the traced IR: every in-place write becomes a pure op whose result
later readers see, views included.

``torch.export`` (non-strict, training IR) keeps the model's mutations: ``shifted[:, 1:] =
x`` is ``copy_(slice(shifted, 1, 1), x)`` and every later reader of ``shifted`` refers to the
*old* node, relying on memory being shared. Our IR is pure data flow, so taken literally the
write is lost (the Hugging Face T5/BART/Whisper decoder input then stays all zeros and the
loss differs from the model's). This pass does what torch's functionalization does, on our IR:

* an in-place op ``op_(x, ...)`` (already recorded as the functional ``op`` with
  ``Node.mutates``) produces the new content of ``x``;
* when ``x`` is a view of a base tensor, the new content is scattered back into the base
  through the inverse of each view op on the way (``slice`` -> ``slice_scatter``, ``select``
  -> ``select_scatter``, ``view`` -> ``reshape`` back, ``transpose`` -> ``transpose`` ...);
* every later read of the base, or of any view of it, sees the new content: a view taken
  before the write is re-derived from the updated base when it is next read.

Views are recognised from the op's schema (a result that aliases an input, ``Tensor(a)``), so
no list of view ops has to be kept in step with torch. A write through a view whose inverse
is unknown is refused with a clear error rather than traced wrongly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from hapc.errors import UserError
from hapc.ir.graph import Graph, Node, Ref, Value


@functools.cache
def is_view_op(op: str) -> bool:
    """True when the aten overload's first result aliases its first input (schema ``Tensor(a)``)
    without writing it: a view such as ``slice``, ``select``, ``view`` or ``transpose``."""
    if not op.startswith("aten."):
        return False
    _, packet, overload = op.split(".", 2)
    try:
        schema = getattr(getattr(torch.ops.aten, packet), overload)._schema
    except (AttributeError, RuntimeError):
        return False
    if not schema.returns or not schema.arguments:
        return False
    out_alias = schema.returns[0].alias_info
    in_alias = schema.arguments[0].alias_info
    return (out_alias is not None and in_alias is not None and not out_alias.is_write
            and not in_alias.is_write and set(out_alias.before_set) & set(in_alias.before_set) != set())


@dataclass
class _View:
    """How a view value was made: ``node`` applied to ``parent``; ``index`` picks the result of
    a multi-result view (``split``, ``unbind``)."""

    node: Node
    parent: str
    index: int


def functionalize(graph: Graph) -> Graph:
    """Rewrite ``graph`` in place so that it has no in-place writes left; returns it.

    A graph without writes into activations (every example model) comes back unchanged.
    """
    if not any(n.mutates for n in graph.nodes):
        return graph
    return _Functionalizer(graph).run()


class _Functionalizer:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[Node] = []
        self.current: dict[str, str] = {}       # value as traced -> value holding its content now
        self.base: dict[str, str] = {}          # value -> the tensor whose memory it shares
        self.view: dict[str, _View] = {}        # view value -> how it was made
        self.version: dict[str, int] = {}       # base -> number of writes into it so far
        self.seen: dict[str, int] = {}          # value -> base version its current content reflects
        self.fresh_count = 0

    def run(self) -> Graph:
        g = self.graph
        for name in g.values:
            self.current[name] = name
            self.base[name] = name
            self.version[name] = 0
            self.seen[name] = 0
        for traced in g.nodes:
            target = traced.mutates
            node = replace(traced, args=self._read(traced.args), kwargs=self._read(traced.kwargs))
            if target is not None and node.outputs:
                node = replace(node, mutates=None)
                self.nodes.append(self._copy_as_clone(node) if node.op == "aten.copy.default" else node)
                self._write(target, node.outputs[0], node)
                # The in-place op's own result is the written tensor itself.
                for out in node.outputs[:1]:
                    self._alias(out, target)
            else:
                self.nodes.append(node)
                if is_view_op(node.op) and traced.args and isinstance(traced.args[0], Ref):
                    parent = traced.args[0].name
                    for i, out in enumerate(node.outputs):
                        self.base[out] = self.base[parent]
                        self.view[out] = _View(node, parent, i)
                        self.seen[out] = self.version[self.base[parent]]
        g.nodes = self.nodes
        g.output = self._fresh(g.output)
        return g

    # -- reading: every argument names the current content of what it referred to
    def _read(self, obj):
        if isinstance(obj, Ref):
            return Ref(self._fresh(obj.name))
        if isinstance(obj, dict):
            return {k: self._read(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._read(x) for x in obj)
        return obj

    def _stale(self, name: str) -> bool:
        return self.seen[name] != self.version[self.base[name]]

    def _fresh(self, name: str) -> str:
        """The value holding ``name``'s content now, re-deriving a view whose base was written."""
        if not self._stale(name):
            return self.current[name]
        v = self.view[name]
        parent = self._fresh(v.parent)
        outs = tuple(self._new_name(o) for o in v.node.outputs)
        args = (Ref(parent),) + tuple(v.node.args[1:])
        node = replace(v.node, name=outs[0], args=args, outputs=outs, mutates=None)
        self.nodes.append(node)
        for old, new in zip(v.node.outputs, outs):
            self.graph.values[new] = replace(self.graph.values[old], name=new)
            self.current[old] = new
            self.seen[old] = self.version[self.base[old]]
        return self.current[name]

    # -- writing: new content for ``target``, scattered back through its views into the base
    def _write(self, target: str, content: str, at: Node) -> None:
        chain = [target]
        while chain[-1] in self.view:
            chain.append(self.view[chain[-1]].parent)
        for child, parent in zip(chain, chain[1:]):
            self.current[child] = content
            content = self._scatter(self.view[child], self._fresh(parent), content, at)
        base = chain[-1]
        self.current[base] = content
        self.version[base] += 1
        for name in chain:
            self.seen[name] = self.version[base]
        if self.graph.values[base].kind == "buffer":
            # The emitted program writes a buffer's new value back for the next step.
            at_ = next((i for i in range(len(self.nodes) - 1, -1, -1) if content in self.nodes[i].outputs), None)
            if at_ is not None:
                self.nodes[at_] = replace(self.nodes[at_], mutates=base)

    def _alias(self, out: str, target: str) -> None:
        """``out`` (the result of an in-place op on ``target``) shares ``target``'s memory."""
        alias_node = Node(name=out, op="aten.alias.default", args=(Ref(target),), kwargs={},
                          outputs=(out,), source=None)
        self.base[out] = self.base[target]
        self.view[out] = _View(alias_node, target, 0)
        self.current[out] = self.current[target]
        self.seen[out] = self.version[self.base[target]]

    def _scatter(self, v: _View, parent: str, content: str, at: Node) -> str:
        """The parent's new content when its view ``v`` now holds ``content``."""
        op, args = v.node.op, v.node.args
        pmeta = self.graph.values[parent].meta
        cmeta = self.graph.values[content].meta
        name = op.split(".")[1]
        dim = _arg(v.node, 1, "dim", 0)
        if name in ("alias", "detach", "contiguous", "lift_fresh") or (
                name in ("view", "reshape", "_unsafe_view", "flatten", "unflatten", "unsqueeze", "squeeze",
                         "view_as", "expand") and cmeta.shape == pmeta.shape):
            return content
        if name in ("view", "reshape", "_unsafe_view", "flatten", "unflatten", "unsqueeze", "squeeze", "view_as"):
            return self._emit(at, "aten.reshape.default", (Ref(content), list(pmeta.shape)), pmeta)
        if name == "slice":
            start, end, step = _arg(v.node, 2, "start", None), _arg(v.node, 3, "end", None), _arg(v.node, 4, "step", 1)
            return self._emit(at, "aten.slice_scatter.default", (Ref(parent), Ref(content), dim, start, end, step),
                              pmeta)
        if name == "narrow":
            start, length = args[2], args[3]
            return self._emit(at, "aten.slice_scatter.default",
                              (Ref(parent), Ref(content), dim, start, start + length, 1), pmeta)
        if name == "select":
            return self._emit(at, "aten.select_scatter.default", (Ref(parent), Ref(content), dim, args[2]), pmeta)
        if name == "diagonal":
            offset, d1, d2 = _arg(v.node, 1, "offset", 0), _arg(v.node, 2, "dim1", 0), _arg(v.node, 3, "dim2", 1)
            return self._emit(at, "aten.diagonal_scatter.default", (Ref(parent), Ref(content), offset, d1, d2), pmeta)
        if name in ("transpose", "swapaxes", "swapdims"):
            return self._emit(at, "aten.transpose.int", (Ref(content), args[1], args[2]), pmeta)
        if name == "t":
            return self._emit(at, "aten.t.default", (Ref(content),), pmeta)
        if name == "permute":
            dims = [d % len(pmeta.shape) for d in args[1]]
            inverse = [dims.index(i) for i in range(len(dims))]
            return self._emit(at, "aten.permute.default", (Ref(content), inverse), pmeta)
        if name in ("split", "split_with_sizes", "chunk", "unsafe_split", "tensor_split"):
            dim = _arg(v.node, 2, "dim", 0)
            if name == "tensor_split":
                raise self._unsupported(v, at)
            d = dim % len(pmeta.shape)
            outs = [self.graph.values[o].meta.shape[d] for o in v.node.outputs]
            start = sum(outs[:v.index])
            return self._emit(at, "aten.slice_scatter.default",
                              (Ref(parent), Ref(content), d, start, start + outs[v.index], 1), pmeta)
        if name == "unbind":
            return self._emit(at, "aten.select_scatter.default", (Ref(parent), Ref(content), dim, v.index), pmeta)
        if name == "as_strided":
            offset = _arg(v.node, 3, "storage_offset", None)
            return self._emit(at, "aten.as_strided_scatter.default",
                              (Ref(parent), Ref(content), args[1], args[2], offset), pmeta)
        raise self._unsupported(v, at)

    def _copy_as_clone(self, node: Node) -> Node:
        """``copy_(dst, src)`` as ops autograd can differentiate (``aten.copy`` has no
        derivative): ``src`` cast to ``dst``'s dtype, broadcast to its shape, cloned."""
        dst, src = node.args[0], node.args[1]
        want, have = self.graph.values[dst.name].meta, self.graph.values[src.name].meta
        value = src
        if have.dtype != want.dtype:
            meta = type(have)(have.shape, want.dtype)
            value = Ref(self._emit(node, "aten._to_copy.default", (value,), meta, {"dtype": want.dtype}))
        if have.shape != want.shape:
            value = Ref(self._emit(node, "aten.expand.default", (value, list(want.shape)), want))
        return replace(node, op="aten.clone.default", args=(value,), kwargs={})

    def _unsupported(self, v: _View, at: Node) -> UserError:
        """The refusal names the op that writes, as the model called it (``aten.add_.Tensor``),
        and its line first: that is the line to change; the view's line comes after."""
        where = f" at {at.source}" + (f" ({at.source.code})" if at.source.code else "") if at.source else ""
        made = f" at {v.node.source}" if v.node.source and v.node.source != at.source else ""
        return UserError(f"the in-place {in_place_name(at.op)}{where} writes into a view made by "
                         f"{v.node.op}{made}, which hapc cannot write back; write into a fresh tensor "
                         "(torch.cat, torch.where) instead")

    def _emit(self, at: Node, op: str, args: tuple, meta, kwargs: dict | None = None) -> str:
        out = self._new_name(f"{at.name}_into")
        self.graph.values[out] = Value(out, meta, "activation")
        self.nodes.append(Node(name=out, op=op, args=args, kwargs=kwargs or {}, outputs=(out,), source=at.source))
        return out

    def _new_name(self, stem: str) -> str:
        while True:
            self.fresh_count += 1
            name = f"{stem}_{self.fresh_count}"
            if name not in self.graph.values:
                return name


def in_place_name(op: str) -> str:
    """``aten.add.Tensor`` -> ``aten.add_.Tensor``: the in-place op a functional node was traced
    as (:func:`hapc.frontend.tracer._functional` recorded it without the underscore)."""
    parts = op.split(".")
    return f"{parts[0]}.{parts[1]}_.{parts[2]}" if len(parts) == 3 else op


def _arg(node: Node, pos: int, key: str, default):
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(key, default)
