"""``hapc profile --model``: time every distinct op signature of a model on this device.

Each distinct signature (:func:`costmodel.optable.signature`: op, constants, input shapes and
dtypes) is run forward and backward on random inputs on the device, at the whole size and at
pieces of 1/2 and 1/4 of its leading dimension (the sizes a rank's shard takes), and the
median times go into a :class:`costmodel.optable.OpTable`. A transformer's repeated layers
share signatures, so GPT-2 small is a few dozen ops, not hundreds. Signatures already in the
table (same device, same torch) are kept, not re-timed: the table is a cache across runs and
models. A bf16 graph (:func:`hapc.ir.precision.autocast_graph`) is timed under autocast, as
the emitted program runs it.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from costmodel.opclass import op_class
from costmodel.optable import FRACTIONS, OpTable, signature, table_path
from hapc.ir.graph import Graph, Node, Ref

Say = Callable[[str], None]


def device_label(device: torch.device) -> str:
    """What torch calls the device: ``NVIDIA H200``, or ``cpu (N threads)``."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def profile_ops(graph: Graph, cluster_file: str | Path, cluster_device: str, device: torch.device, *,
                autocast: torch.dtype | None = None, allow_tf32: bool = False, min_seconds: float = 0.05,
                say: Say = lambda m: None) -> OpTable:
    """Time ``graph``'s distinct op signatures on ``device``; merge them into the table beside
    ``cluster_file`` (made when missing, replaced when from another device or torch) and save it.
    On CUDA, float32 products run with TF32 as ``allow_tf32`` says (the cluster's setting, which
    the emitted program applies)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allow_tf32
    path = table_path(cluster_file)
    table = _existing(path, cluster_device)
    nodes: dict[str, Node] = {}
    for node in graph.nodes:
        if op_class(node.op) != "view" and node.outputs and node.op.startswith("aten."):
            nodes.setdefault(signature(node, graph), node)
    todo = {k: n for k, n in nodes.items() if k not in table.entries}
    say(f"{len(nodes)} distinct op signatures, {len(nodes) - len(todo)} already measured; timing {len(todo)}")
    started = time.perf_counter()
    for i, (key, node) in enumerate(todo.items()):
        points = []
        for fraction in FRACTIONS:
            timed = _time_node(node, graph, device, fraction, autocast, min_seconds)
            if timed is not None:
                points.append((fraction, *timed))
        if points:
            table.entries[key] = points
        if (i + 1) % 10 == 0:
            say(f"{i + 1}/{len(todo)} signatures in {time.perf_counter() - started:.0f} s")
    table.device_name = device_label(device)
    table.save(path)
    return table


def _existing(path: Path, cluster_device: str) -> OpTable:
    fresh = OpTable(cluster_device, "", torch.__version__, {}, str(path))
    if not path.exists():
        return fresh
    try:
        old = OpTable.from_dict(json.loads(path.read_text()), str(path))
    except (ValueError, KeyError, TypeError):
        return fresh
    same = old.device == cluster_device and old.torch_version == torch.__version__
    return old if same else fresh


def _time_node(node: Node, graph: Graph, device: torch.device, fraction: float, autocast: torch.dtype | None,
               min_seconds: float) -> tuple[float, float] | None:
    """Median (forward, backward) seconds of ``node`` on inputs cut to ``fraction`` of their
    leading dimension, or None when the op cannot run at that size."""
    op = _resolve(node.op)
    if op is None:
        return None
    try:
        tensors = _inputs(node, graph, device, fraction)
    except ValueError:
        return None
    if tensors is None:
        return None
    wrt = [t for t in tensors.values() if t.requires_grad]
    cast = torch.autocast(device.type, dtype=autocast) if autocast is not None else contextlib.nullcontext()
    fwd_times: list[float] = []
    bwd_times: list[float] = []
    spent, runs = 0.0, 0
    try:
        while runs < 2 or (spent < min_seconds and runs < 20):
            _sync(device)
            t0 = time.perf_counter()
            with cast:
                out = op(*_args(node.args, tensors, device), **{k: _args(v, tensors, device) for k, v in node.kwargs.items()})
            _sync(device)
            t1 = time.perf_counter()
            outs = [o for o in (out if isinstance(out, (list, tuple)) else [out])
                    if isinstance(o, torch.Tensor) and o.requires_grad]
            if outs and wrt:
                torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs], allow_unused=True)
            _sync(device)
            t2 = time.perf_counter()
            if runs > 0:                      # the first run warms caches and allocators
                fwd_times.append(t1 - t0)
                bwd_times.append(t2 - t1 if outs and wrt else 0.0)
            spent += t2 - t0
            runs += 1
    except (RuntimeError, ValueError, TypeError, IndexError):
        return None
    return statistics.median(fwd_times), statistics.median(bwd_times)


def _inputs(node: Node, graph: Graph, device: torch.device, fraction: float) -> dict[str, torch.Tensor] | None:
    """Random tensors for the values ``node`` reads; activations and inputs sharing the first
    one's leading size are cut to ``fraction`` of it (parameters stay whole)."""
    refs = list(dict.fromkeys(node.input_refs()))
    lead = next((graph.meta(r).shape[0] for r in refs
                 if graph.values[r].kind != "param" and graph.meta(r).shape), None)
    if fraction < 1 and (lead is None or int(lead * fraction) < 1):
        raise ValueError("nothing to cut")
    out = {}
    for r in refs:
        v = graph.values[r]
        shape = list(v.meta.shape)
        if fraction < 1 and v.kind != "param" and shape and shape[0] == lead:
            shape[0] = int(lead * fraction)
        dtype = getattr(torch, v.meta.dtype, None)
        if dtype is None:
            return None
        if dtype.is_floating_point:           # drawn on the device: a GPU's logits are GBs
            out[r] = torch.randn(shape, device=device, dtype=dtype).requires_grad_(v.requires_grad)
        elif dtype == torch.bool:
            out[r] = torch.ones(shape, dtype=dtype, device=device)
        else:                                  # ids, targets, indices: 0 is valid for every op
            out[r] = torch.zeros(shape, dtype=dtype, device=device)
    return out


def _args(a: Any, tensors: dict[str, torch.Tensor], device: torch.device) -> Any:
    """A node argument as the op takes it: tensors for references, torch dtypes, this device."""
    if isinstance(a, Ref):
        return tensors[a.name]
    if isinstance(a, (list, tuple)):
        return type(a)(_args(x, tensors, device) for x in a)
    if isinstance(a, str) and hasattr(torch, a) and isinstance(getattr(torch, a), torch.dtype):
        return getattr(torch, a)
    if isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda", "meta"):
        return device
    return a


def _resolve(name: str):
    _, packet, overload = name.split(".", 2)
    try:
        return getattr(getattr(torch.ops.aten, packet), overload)
    except AttributeError:
        return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
