"""Tracer: ``nn.Module`` + example inputs -> :class:`hapc.ir.Graph`, through ``torch.export``.

``torch.export`` already does the hard part: it captures real models (Hugging Face GPT-2,
BERT) unmodified, keeps composite ops such as ``linear``, ``layer_norm`` and
``scaled_dot_product_attention`` whole, records the user's source line of every node and
works on meta-device models. This module only lifts its graph into our plain IR and adds
what the later stages need: FLOPs (from ``FlopCounterMode``, forward and backward separately)
and bytes moved per node, which values need gradients, and the ops that have no sharding rule.
"""

from __future__ import annotations

import functools
import operator
import os
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from hapc.frontend.blocktrace import trace_repeated
from hapc.frontend.canonical import canonicalize
from hapc.errors import UserError
from hapc.frontend.functionalize import functionalize
from hapc.frontend.ondevice import is_fake
from hapc.frontend.quiet import quiet_torch
from hapc.frontend.saved import record_saved
from hapc.frontend.torchfacts import record as record_torch_facts, resolve_op
from hapc.ir.graph import Cost, Graph, Node, Ref, SourceLoc, TensorMeta, Value
from hapc.rules.expert_rows import GROUPED_MM_OPS
from hapc.rules.ops_grouped_mm import grouped_mm_flops
from hapc.runtime.random_ops import RANDOM_OPS

# Ops that only reinterpret memory: they move no bytes.
VIEW_OPS = {
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.transpose.int",
    "aten.permute.default", "aten.t.default", "aten.unsqueeze.default", "aten.squeeze.dim",
    "aten.squeeze.default", "aten.squeeze.dims", "aten.expand.default", "aten.flatten.using_ints",
    "aten.unflatten.int", "aten.slice.Tensor", "aten.select.int", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.chunk.default", "aten.unbind.int", "aten.alias.default",
    "aten.detach.default", "aten.contiguous.default", "aten.view_as.default", "aten.narrow.default",
    "aten.unsafe_split.Tensor", "aten.movedim.int", "aten.swapaxes.default",
}

# Ops with no tensor result that only check things at run time.
DROPPED_OPS = {"aten.sym_constrain_range_for_size.default", "aten._assert_scalar.default"}

# Ops whose results carry no gradient whatever their inputs.
NON_DIFFERENTIABLE_OPS = {
    "aten.argmax.default", "aten.argmin.default", "aten.eq.Tensor", "aten.eq.Scalar", "aten.ne.Scalar",
    "aten.ne.Tensor", "aten.lt.Scalar", "aten.gt.Scalar", "aten.le.Scalar", "aten.ge.Scalar",
    "aten.lt.Tensor", "aten.gt.Tensor", "aten.arange.default", "aten.arange.start",
    "aten.zeros.default", "aten.ones.default", "aten.full.default", "aten.zeros_like.default",
    "aten.ones_like.default", "aten.full_like.default", "aten.empty.memory_format",
    "aten.bitwise_not.default", "aten.logical_not.default", "aten.scalar_tensor.default",
    "aten.detach.default",
} | RANDOM_OPS            # random draws: torch's gradients of them are zeros


@dataclass
class Traced:
    """A traced model: the IR plus what executing it needs (parameter tensors, constants)."""

    graph: Graph
    module: torch.nn.Module
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    seconds: float = 0.0

    def dataless_constants(self) -> list[str]:
        """Constants the graph reads that were traced on the meta device (or as fakes) and so
        carry no data (Falcon's ``x[..., [-2], :]`` index list): a program must re-derive them."""
        return sorted(v.target for v in self.graph.values.values()
                      if v.kind == "constant" and v.target in self.constants and is_fake(self.constants[v.target]))

    def tensor(self, name: str) -> torch.Tensor:
        """The real tensor behind a parameter, buffer or lifted constant."""
        v = self.graph.values[name]
        if v.kind == "param":
            return self.module.get_parameter(v.target)
        if v.kind == "buffer":
            return self.module.get_buffer(v.target)
        if v.kind == "constant":
            return self.constants[v.target]
        raise KeyError(f"{name} is a {v.kind}, not a stored tensor")


def trace(model: torch.nn.Module, inputs: Sequence[Any], *, has_rule=None, replicate_blocks: bool = True,
          trainable: Mapping[str, bool] | None = None) -> Traced:
    """Trace ``model(*inputs)`` (which must return a scalar loss) into the IR.

    ``replicate_blocks=False`` traces every layer even when :mod:`hapc.frontend.blocktrace` could
    trace one and replicate it (the result is the same; tests compare the two).

    ``has_rule(op) -> bool`` tells which ops have a sharding rule; ops without one are
    recorded in ``graph.unsupported`` with their source lines (they still run, replicated).

    ``trainable`` (parameter name -> whether it trains) overrides what the traced parameters'
    ``requires_grad`` says: fakes on a CUDA device without CUDA cannot carry it
    (:mod:`hapc.frontend.ondevice`).
    """
    if has_rule is None:
        from hapc.rules import has_rule
    start = time.perf_counter()
    inputs = tuple(inputs)
    costs: dict[tuple, Cost] = {}

    def meanwhile(short: Graph) -> None:
        """While the other short trace runs: price the short graph's distinct nodes (the full
        graph's nodes have the same cost keys, so they are then looked up) and load the rules."""
        if not any(n.mutates for n in short.nodes):        # else functionalize changes the nodes
            copy = Graph(dict(short.values), short.nodes, short.inputs, short.params, short.buffers, short.output)
            _mark_requires_grad(copy)
            _node_costs(copy, costs)
        has_rule("aten.mm.default")

    # Repeated blocks are traced once and replicated (hapc.frontend.blocktrace); the same IR, faster.
    lift = functools.partial(_lift, trainable=trainable)
    repeated = trace_repeated(model, inputs, _export, lift, meanwhile) if replicate_blocks else None
    if repeated is not None:
        lifted, exported_constants = repeated
    else:
        ep = _export(model, inputs)
        lifted, exported_constants = lift(ep), ep.constants
    graph = canonicalize(functionalize(lifted))
    _mark_requires_grad(graph)
    _annotate_costs(graph, costs)
    graph.unsupported = _unsupported(graph, has_rule)
    graph.torch_facts = record_torch_facts(graph)     # so that emitting a program needs no torch
    graph.torch_facts.saved = record_saved(graph)     # ... and pricing its memory neither
    constants = {k: _stored(v) for k, v in exported_constants.items() if isinstance(v, torch.Tensor)}
    return Traced(graph, model, constants, time.perf_counter() - start)


def _stored(constant: torch.Tensor) -> torch.Tensor:
    """A lifted constant as the plan keeps it: a fake one (traced on a device without data) as a
    meta tensor, which every later stage knows as dataless; one with data on the CPU (a program
    traced for a GPU may run on CPUs, and loads it to its own device)."""
    if is_fake(constant):
        return torch.empty_strided(constant.shape, constant.stride(), dtype=constant.dtype, device="meta")
    return constant.detach().cpu()


def _export(model: torch.nn.Module, inputs: tuple) -> torch.export.ExportedProgram:
    try:
        with quiet_torch():
            return torch.export.export(model, inputs, strict=False)
    except UserError:
        raise
    except Exception as exc:  # torch's own message names the construct it cannot trace
        raise UserError(f"torch.export could not trace the model: {_export_error(exc)}") from exc


def _export_error(exc: Exception) -> str:
    """torch.export's first line, and the user's line that raised it when torch names one."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "The following call raised this error:" and i + 1 < len(lines):
            frame = lines[i + 1].strip()
            if frame.startswith('File "') and ", line " in frame:
                file = os.path.basename(frame.split('"')[1])
                lineno = frame.split(", line ")[1].split(",")[0]
                code = lines[i + 2].strip() if i + 2 < len(lines) else ""
                return f"{first} (at {file}:{lineno}: {code})" if code else f"{first} (at {file}:{lineno})"
    frame = _user_frame(exc)
    if frame is not None:
        code = f": {frame.line.strip()}" if frame.line else ""
        return f"{first} (at {os.path.basename(frame.filename)}:{frame.lineno}{code})"
    return first


def _user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the user's code (neither torch's, hapc's nor Python's) in the
    traceback of ``exc``: where an op torch refused was called (``w.detach_()`` on a view)."""
    skip = tuple(os.path.dirname(m.__file__) for m in (torch, os, sys.modules["hapc"]))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(skip)
              and not f.filename.startswith("<")]
    return frames[-1] if frames else None


def _meta_of(val: Any) -> TensorMeta | None:
    if isinstance(val, torch.Tensor):
        return TensorMeta(tuple(int(s) for s in val.shape), str(val.dtype).removeprefix("torch."))
    return None


def _lift(ep: torch.export.ExportedProgram, trainable: Mapping[str, bool] | None = None) -> Graph:
    sig = ep.graph_signature
    kinds: dict[str, tuple[str, str | None]] = {}
    for spec in sig.input_specs:
        kind = spec.kind.name
        name = spec.arg.name
        if kind == "PARAMETER":
            kinds[name] = ("param", spec.target)
        elif kind == "BUFFER":
            kinds[name] = ("buffer", spec.target)
        elif kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
            kinds[name] = ("constant", spec.target)
        else:
            kinds[name] = ("input", None)

    values: dict[str, Value] = {}
    nodes: list[Node] = []
    inputs, params, buffers = [], [], []
    alias: dict[str, Any] = {}      # fx node name -> Ref, or a list of Refs for multi-output ops
    output = None

    def lift_arg(a: Any, prefix: str) -> Any:
        if isinstance(a, torch.fx.Node):
            return alias[prefix + a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(lift_arg(x, prefix) for x in a)
        if isinstance(a, torch.dtype):
            return str(a).removeprefix("torch.")
        if isinstance(a, torch.device):
            # Whatever device the trace was made for: the program passes its own (the emitter
            # writes rt.device), so one graph (and its hash) serves every --device.
            return "meta"
        if isinstance(a, (torch.layout, torch.memory_format)):
            return str(a)
        return a

    def lift_call(fx: torch.fx.Node, prefix: str) -> None:
        name = prefix + fx.name
        if isinstance(fx.target, torch._ops.HigherOrderOperator):
            alias[name] = _inline_hop(fx, prefix, ep.graph_module, lift_graph, lift_arg, values, nodes)
            return
        val = fx.meta.get("val")
        if isinstance(val, (list, tuple)):
            metas = [_meta_of(v) for v in val]
            outs = [f"{name}_{i}" for i in range(len(val))]
            # Prefer the names of the getitem nodes that read the outputs.
            for user in fx.users:
                if user.target is operator.getitem and isinstance(user.args[1], int):
                    outs[user.args[1]] = prefix + user.name
            alias[name] = [Ref(o) for o in outs]
        else:
            metas, outs = [_meta_of(val)], [name]
            alias[name] = Ref(name)
        for o, m in zip(outs, metas):
            if m is not None:
                values[o] = Value(o, m, "activation")
        kept = tuple(o for o, m in zip(outs, metas) if m is not None)
        op, in_place = _functional(_op_name(fx.target))
        op = _DEFINED.get(op, op)
        if op.startswith("aten._assert") or (not kept and op in DROPPED_OPS):
            return
        args = tuple(lift_arg(a, prefix) for a in fx.args)
        if op == "aten.bernoulli.p" and len(args) == 1 and "p" not in fx.kwargs:
            args += (0.5,)              # bernoulli_.float's default; bernoulli.p has none
        mutates = args[0].name if in_place and args and isinstance(args[0], Ref) else None
        nodes.append(Node(name=name, op=op, args=args, kwargs={k: lift_arg(v, prefix) for k, v in fx.kwargs.items()},
                          outputs=kept, source=_source(fx), mutates=mutates))

    def lift_graph(fx_graph: torch.fx.Graph, prefix: str, operands: Sequence[Any] = ()) -> list[Any]:
        """Lift one fx graph; a higher-order op's body (``prefix`` set) takes ``operands`` for
        its placeholders and returns what its output node lists."""
        operand = iter(operands)
        result: list[Any] = []
        for fx in fx_graph.nodes:
            if fx.op == "placeholder" and prefix:
                alias[prefix + fx.name] = next(operand)
            elif fx.op == "placeholder":
                meta = _meta_of(fx.meta.get("val"))
                if meta is None:
                    continue
                kind, target = kinds.get(fx.name, ("input", None))
                # A frozen parameter (``requires_grad=False``) is data: no gradient, no sync.
                trains = kind == "param" and (bool(getattr(fx.meta.get("val"), "requires_grad", True))
                                              if trainable is None else trainable.get(target, True))
                values[fx.name] = Value(fx.name, meta, kind, target, requires_grad=trains)
                {"param": params, "buffer": buffers, "input": inputs}.get(kind, []).append(fx.name)
                alias[fx.name] = Ref(fx.name)
            elif fx.op == "call_function" and fx.target is operator.getitem:
                alias[prefix + fx.name] = alias[prefix + fx.args[0].name][fx.args[1]]
            elif fx.op == "call_function":
                lift_call(fx, prefix)
            elif fx.op == "output":
                result = list(fx.args[0]) if isinstance(fx.args[0], (list, tuple)) else [fx.args[0]]
        return result

    outs = [a for a in lift_graph(ep.graph, "") if isinstance(a, torch.fx.Node)]
    user_outputs = [s.arg.name for s in sig.output_specs if s.kind.name == "USER_OUTPUT"]
    chosen = [o for o in outs if o.name in user_outputs] or outs
    if len(chosen) != 1:
        raise UserError(f"forward must return one scalar loss, got {len(chosen)} outputs")
    output = alias[chosen[0].name].name
    if output is None:
        raise UserError("forward returned no tensor")
    if values[output].meta.numel != 1:
        raise UserError(f"forward must return a scalar loss, got a tensor of shape "
                        f"{list(values[output].meta.shape)}")
    # torch.export lists every name of a tied parameter but reads only one; drop the others
    # so that memory is not counted twice and every listed parameter has a gradient.
    used = {r for n in nodes for r in n.input_refs()}
    for name in [p for p in params + buffers if p not in used]:
        del values[name]
    params = [p for p in params if p in used]
    buffers = [b for b in buffers if b in used]
    return Graph(values, nodes, inputs, params, buffers, output)


# In-place ops whose functional twin is not the name without the underscore (there is no
# ``normal.default``, no ``bernoulli.float``): timm's drop path is ``x.new_empty(s).bernoulli_(p)``.
_FUNCTIONAL_TWINS = {"aten.normal_.default": "aten.normal_functional.default",
                     "aten.bernoulli_.float": "aten.bernoulli.p"}


# Uninitialised tensors, as zeros: any contents are what ``empty`` promises, and zeros have rules
# (each rank makes its piece) where undefined values could not be checked. Models fill them at
# once (timm's drop path: ``x.new_empty(b, 1, 1).bernoulli_(keep)``).
_DEFINED = {"aten.new_empty.default": "aten.new_zeros.default", "aten.empty_like.default": "aten.zeros_like.default"}


def _functional(op: str) -> tuple[str, bool]:
    """``aten.add_.Tensor`` -> (``aten.add.Tensor``, True): the op wrote its first argument.

    Every later stage then sees pure ops: a replicated value shared by simulated ranks is
    never mutated N times, and rules need no in-place twins (:mod:`hapc.frontend.functionalize` makes
    later readers see the written value).
    """
    if op in _FUNCTIONAL_TWINS:
        return _FUNCTIONAL_TWINS[op], True
    parts = op.split(".")
    if len(parts) == 3 and parts[1].endswith("_") and not parts[1].startswith("_"):
        functional = f"{parts[0]}.{parts[1][:-1]}.{parts[2]}"
        if resolve_op(functional) is not None:
            return functional, True
    return op, False


# Higher-order ops whose body is plain code the program can run inline (export wraps autocast
# and grad-mode regions, activation checkpointing and repeated subgraphs in them).
INLINED_HOPS = {"wrap_with_autocast", "wrap_with_set_grad_enabled", "wrap", "tag_activation_checkpoint",
                "invoke_subgraph"}


def _inline_hop(fx: torch.fx.Node, prefix: str, root: torch.fx.GraphModule, lift_graph, lift_arg,
                values: dict[str, Value], nodes: list[Node]) -> list[Ref]:
    """Lift a higher-order op's body in its place; returns the Refs of its results.

    * ``wrap_with_autocast(device, dtype, enabled=False, ...)`` (Llama's rotary embedding):
      the program runs without autocast anyway, so the region's ops run as traced. An
      *enabled* autocast region would compute in another dtype than its traced ops say: refused.
    * ``wrap_with_set_grad_enabled(False, ...)`` (``torch.no_grad()``): inlined, and its
      results are detached so that no gradient flows back through them, as in the model.
    * ``wrap``, ``tag_activation_checkpoint``, ``invoke_subgraph``: the same values as inline code.
    """
    hop = fx.target.name()
    body_at = next((i for i, a in enumerate(fx.args) if isinstance(a, torch.fx.Node) and a.op == "get_attr"), None)
    body = root
    for part in fx.args[body_at].target.split(".") if body_at is not None else ():
        body = getattr(body, part)
    # The op itself carries no stack trace; the first op of its body names the user's line.
    located = [_source(n) for n in ([fx] + list(getattr(body, "graph", root.graph).nodes)) if n.op == "call_function"]
    where = next((f" at {loc}" for loc in located if loc is not None), "")
    if hop not in INLINED_HOPS:
        raise UserError(f"torch.export produced the higher-order op {hop}{where}, which hapc cannot "
                        "run yet; rewrite that region without it")
    if body_at is None:
        raise UserError(f"the higher-order op {hop}{where} has no body to inline")
    if hop == "wrap_with_autocast" and fx.args[2]:
        raise UserError(f"an enabled torch.autocast region inside forward{where} is not supported; "
                        "choose the precision with hapc compile --precision instead")
    inner = f"{prefix}{fx.name}__"
    operands = [lift_arg(a, prefix) for a in fx.args[body_at + 1:]]
    results = [lift_arg(a, inner) for a in lift_graph(body.graph, inner, operands)]
    if hop == "wrap_with_set_grad_enabled" and not fx.args[0]:
        detached = []
        for i, ref in enumerate(results):
            if not isinstance(ref, Ref) or not values[ref.name].meta.is_float:
                detached.append(ref)
                continue
            out = f"{prefix}{fx.name}_nograd_{i}"
            values[out] = Value(out, values[ref.name].meta, "activation")
            nodes.append(Node(name=out, op="aten.detach.default", args=(ref,), kwargs={}, outputs=(out,),
                              source=_source(fx)))
            detached.append(Ref(out))
        results = detached
    return results


def _op_name(target: Any) -> str:
    """``namespace.op.overload`` for any operator overload (``aten.mm.default``, a library's
    ``transformers.grouped_mm_fallback.default``); a plain callable's own name otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}.{target._overloadname}"
    name = str(target)
    return name if name.startswith("aten.") else getattr(target, "__name__", name)


def _source(fx: torch.fx.Node) -> SourceLoc | None:
    """The innermost frame of the user's code (not torch's) that created this node."""
    trace_text = fx.meta.get("stack_trace") or ""
    frames = []
    lines = trace_text.splitlines()
    for i, line in enumerate(lines):
        line = line.strip()
        if line.startswith('File "'):
            try:
                file = line.split('"')[1]
                lineno = int(line.split(", line ")[1].split(",")[0])
            except (IndexError, ValueError):
                continue
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            frames.append(SourceLoc(file, lineno, code))
    torch_dir = os.path.dirname(torch.__file__)
    user = [f for f in frames if not f.file.startswith(torch_dir)] or frames
    if not user:
        return None
    return replace(user[-1], callers=tuple((f.file, f.line) for f in user[:-1]))


def _mark_requires_grad(graph: Graph) -> None:
    """A value needs a gradient when it is a float result of a differentiable op on values that do."""
    for node in graph.nodes:
        needs = node.op not in NON_DIFFERENTIABLE_OPS and any(
            graph.values[r].requires_grad for r in node.input_refs())
        for out in node.outputs:
            v = graph.values[out]
            if needs and v.meta.is_float:
                graph.values[out] = Value(v.name, v.meta, v.kind, v.target, True)


def _annotate_costs(graph: Graph, cache: dict[tuple, Cost] | None = None) -> None:
    """Set every node's cost; ``cache`` (by :func:`_cost_key`) may hold costs priced already."""
    cache = {} if cache is None else cache
    for node, c in zip(graph.nodes, _node_costs(graph, cache)):
        node.cost = Cost(c.fwd_flops, c.bwd_flops, c.fwd_bytes, c.bwd_bytes)


def _node_costs(graph: Graph, cache: dict[tuple, Cost]) -> list[Cost]:
    """Each node's cost, from ``cache`` or priced and added to it; the graph is not changed."""
    costs = []
    for node in graph.nodes:
        key = _cost_key(graph, node)
        if key not in cache:
            cache[key] = _node_cost(graph, node)
        costs.append(cache[key])
    return costs


def _cost_key(graph: Graph, node: Node) -> tuple:
    """Same op, constants and input metas give the same cost, so repeated layers are counted once.

    Value names are replaced by their first-use slot: the names differ in every layer, and
    ``mul(x, x)`` must stay apart from ``mul(x, y)`` (it reads fewer bytes).
    """
    slot = {r: i for i, r in enumerate(dict.fromkeys(node.input_refs()))}

    def anon(a: Any) -> Any:
        if isinstance(a, Ref):
            return ("%", slot[a.name])
        if isinstance(a, (list, tuple)):
            return tuple(anon(x) for x in a)
        return repr(a)

    return (node.op, anon(node.args), tuple((k, anon(v)) for k, v in node.kwargs.items()),
            tuple((graph.meta(r), graph.values[r].requires_grad) for r in slot))


def _node_cost(graph: Graph, node: Node) -> Cost:
    """FLOPs from torch's own counter on meta tensors; bytes from the tensors touched."""
    in_vals = [graph.values[r] for r in dict.fromkeys(node.input_refs())]
    out_vals = [graph.values[o] for o in node.outputs]
    out_bytes = sum(v.meta.nbytes for v in out_vals)
    in_bytes = sum(v.meta.nbytes for v in in_vals)
    grad_in_bytes = sum(v.meta.nbytes for v in in_vals if v.requires_grad)
    differentiable = any(v.requires_grad for v in out_vals)

    fwd_flops, bwd_flops = _counted_flops(graph, node)
    out_numel = sum(v.meta.numel for v in out_vals)
    if node.op in VIEW_OPS:
        return Cost(0.0, 0.0, 0.0, 0.0)
    if fwd_flops == 0:  # elementwise and reductions: one op per element touched
        fwd_flops = float(max(out_numel, sum(v.meta.numel for v in in_vals)))
        bwd_flops = 2.0 * fwd_flops if differentiable else 0.0
    cost = Cost(fwd_flops, bwd_flops if differentiable else 0.0, float(in_bytes + out_bytes), 0.0)
    if differentiable:
        # Read the output gradient and the saved inputs, write one gradient per input needing it.
        cost.bwd_bytes = float(out_bytes + in_bytes + grad_in_bytes)
    return cost


def _counted_flops(graph: Graph, node: Node) -> tuple[float, float]:
    if node.op in GROUPED_MM_OPS:      # a library's op: torch's counter does not know it
        (rows, inner), (_, _, cols) = (graph.meta(r).shape for r in node.input_refs()[:2])
        return grouped_mm_flops(rows, inner, cols)
    op = resolve_op(node.op)
    if op is None:
        return 0.0, 0.0
    tensors: dict[str, torch.Tensor] = {}
    for r in dict.fromkeys(node.input_refs()):
        v = graph.values[r]
        t = torch.empty(v.meta.shape, dtype=getattr(torch, v.meta.dtype), device="meta")
        tensors[r] = t.requires_grad_(v.requires_grad)

    def real(a: Any) -> Any:
        if isinstance(a, Ref):
            return tensors[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(real(x) for x in a)
        if isinstance(a, str) and hasattr(torch, a) and isinstance(getattr(torch, a), torch.dtype):
            return getattr(torch, a)
        return a

    try:
        with FlopCounterMode(display=False) as counter:
            out = op(*real(node.args), **{k: real(v) for k, v in node.kwargs.items()})
            fwd = counter.get_total_flops()
            outs = [o for o in (out if isinstance(out, (list, tuple)) else [out])
                    if isinstance(o, torch.Tensor) and o.requires_grad]
            wrt = [t for t in tensors.values() if t.requires_grad]
            if outs and wrt:
                torch.autograd.grad(outs, wrt, [torch.empty_like(o) for o in outs], allow_unused=True)
            bwd = counter.get_total_flops() - fwd
    except Exception:  # an op meta tensors cannot run: fall back to the elementwise estimate
        return 0.0, 0.0
    return float(fwd), float(bwd)


def _unsupported(graph: Graph, has_rule) -> dict[str, list[str]]:
    missing: dict[str, list[str]] = {}
    for node in graph.nodes:
        if not has_rule(node.op):
            missing.setdefault(node.op, []).append(str(node.source) if node.source else "?")
    return missing
