"""The instruction IR: a traced training forward as an ordered list of aten-level nodes.

The graph is plain data (no torch objects), so every later stage — costs, search, code
generation — can be tested without tracing, and a graph can be hashed and serialised.

* A **value** is one tensor: a parameter, a buffer, a user input or a node result.
* A **node** applies one aten op (``"aten.linear.default"``) to arguments that are value
  references or constants, producing one or more values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Union

ValueKind = Literal["param", "buffer", "input", "activation", "constant"]

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "complex64": 8, "complex128": 16,
}


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith(("float", "bfloat", "complex"))

    def __repr__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Value:
    name: str
    meta: TensorMeta
    kind: ValueKind
    # For parameters and buffers: the attribute path in the module (``"h.0.attn.weight"``).
    target: str | None = None
    requires_grad: bool = False


@dataclass(frozen=True)
class Ref:
    """An argument that refers to a value by name."""

    name: str

    def __repr__(self) -> str:
        return f"%{self.name}"


# Constants as exported: numbers, bools, None, strings, dtypes (as strings) and nested lists.
Arg = Union[Ref, int, float, bool, str, None, tuple, list]


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int
    code: str = ""
    # The user's frames that led to this line, outermost first, as (file, line). Recorded at
    # trace time only, to put independent nodes in program order canonically
    # (hapc.frontend.canonical); not serialised, and not part of equality.
    callers: tuple[tuple[str, int], ...] = field(default=(), compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Cost:
    """Work of one node: FLOPs and bytes moved, forward and backward, unsharded."""

    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0


@dataclass
class Node:
    name: str
    op: str
    args: tuple[Arg, ...]
    kwargs: dict[str, Arg]
    outputs: tuple[str, ...]
    cost: Cost = field(default_factory=Cost)
    source: SourceLoc | None = None
    # In-place ops are recorded in functional form; this names the input they overwrote
    # (a buffer such as BatchNorm's ``num_batches_tracked``), so a program can write it back.
    mutates: str | None = None

    def input_refs(self) -> list[str]:
        """Names of the values this node reads, in argument order (nested lists flattened)."""
        return [r.name for r in _iter_refs((self.args, tuple(self.kwargs.values())))]

    def __repr__(self) -> str:
        args = ", ".join(map(repr, self.args))
        kw = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"{', '.join(self.outputs)} = {self.op}({args}{kw})"


def _iter_refs(obj: Any) -> Iterator[Ref]:
    if isinstance(obj, Ref):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _iter_refs(o)


@dataclass
class TorchFacts:
    """What writing a program needs to know about torch, recorded while torch is loaded (at
    trace time, :mod:`hapc.frontend.torchfacts`) so that emitting a program from a plan never imports
    it (``hapc replan``, a cached trace: torch's import alone is seconds).

    Kept out of :meth:`Graph.to_json` (and so out of the graph's hash): they describe the torch
    that traced the graph, not the model."""

    # aten overload -> how many results its schema returns; None for a ``Tensor[]`` (a list of
    # any length) or an op torch could not resolve.
    op_results: dict[str, int | None] = field(default_factory=dict)
    # Every string constant among the nodes' arguments -> the torch object it names, as code
    # (``"float32"`` -> ``"torch.float32"``, ``"torch.strided"`` as itself), or None for a plain string.
    torch_names: dict[str, str | None] = field(default_factory=dict)
    # Node name -> what autograd saves for its backward: (flat input positions, output
    # indices, other bytes), found by running the op on meta (hapc.frontend.saved); a node
    # without an entry is priced by the memory model's older rule. None: not recorded.
    saved: dict[str, tuple[tuple[int, ...], tuple[int, ...], int]] | None = None

    def to_dict(self) -> dict:
        d = {"op_results": dict(sorted(self.op_results.items())),
             "torch_names": dict(sorted(self.torch_names.items()))}
        if self.saved is not None:      # "inputs/outputs/bytes", e.g. "0,1//0": one short line a node
            d["saved"] = {name: f"{_ints(i)}/{_ints(o)}/{extra}" for name, (i, o, extra) in sorted(self.saved.items())}
        return d

    @staticmethod
    def from_dict(d: dict) -> TorchFacts:
        saved = None
        if "saved" in d:
            saved = {}
            for name, text in d["saved"].items():
                ins, outs, extra = text.split("/")
                saved[name] = (_parse_ints(ins), _parse_ints(outs), int(extra))
        return TorchFacts(dict(d.get("op_results", {})), dict(d.get("torch_names", {})), saved)


def _ints(xs: tuple[int, ...]) -> str:
    return ",".join(str(x) for x in xs)


def _parse_ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text else ()


@dataclass
class Graph:
    values: dict[str, Value]
    nodes: list[Node]
    inputs: list[str]          # user inputs, in call order
    params: list[str]          # parameters, in module order
    buffers: list[str]
    output: str                # the scalar loss
    unsupported: dict[str, list[str]] = field(default_factory=dict)  # op -> source lines
    torch_facts: TorchFacts | None = None      # None: not recorded (a graph built by hand)

    def meta(self, name: str) -> TensorMeta:
        return self.values[name].meta

    def producer(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs}

    def users(self) -> dict[str, list[Node]]:
        uses: dict[str, list[Node]] = {name: [] for name in self.values}
        for n in self.nodes:
            for ref in dict.fromkeys(n.input_refs()):
                uses[ref].append(n)
        return uses

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def total_cost(self) -> Cost:
        c = Cost()
        for n in self.nodes:
            c.fwd_flops += n.cost.fwd_flops
            c.bwd_flops += n.cost.bwd_flops
            c.fwd_bytes += n.cost.fwd_bytes
            c.bwd_bytes += n.cost.bwd_bytes
        return c

    def to_json(self) -> dict:
        """A canonical, JSON-ready form (source locations excluded: they do not change meaning)."""
        return {
            "values": [[v.name, list(v.meta.shape), v.meta.dtype, v.kind, v.target, v.requires_grad]
                       for v in self.values.values()],
            "nodes": [[n.name, n.op, _jsonable(n.args), _jsonable(n.kwargs), list(n.outputs)]
                      for n in self.nodes],
            "inputs": self.inputs, "params": self.params, "buffers": self.buffers,
            "output": self.output,
        }

    def to_dict(self) -> dict:
        """Everything needed to rebuild the graph (costs and source lines included)."""
        d = self.to_json()
        d["costs"] = {n.name: [n.cost.fwd_flops, n.cost.bwd_flops, n.cost.fwd_bytes, n.cost.bwd_bytes]
                      for n in self.nodes}
        d["sources"] = {n.name: [n.source.file, n.source.line, n.source.code]
                        for n in self.nodes if n.source is not None}
        d["mutates"] = {n.name: n.mutates for n in self.nodes if n.mutates}
        d["unsupported"] = self.unsupported
        if self.torch_facts is not None:
            d["torch_facts"] = self.torch_facts.to_dict()
        return d

    @staticmethod
    def from_dict(d: dict) -> Graph:
        # Frozen metadata and source lines repeat (a 48-layer GPT: 1,840 values of 17 shapes,
        # 1,066 nodes from 13 source lines): one object each, not one per value or node.
        metas: dict[tuple, TensorMeta] = {}
        locs: dict[tuple, SourceLoc] = {}
        values = {}
        for name, shape, dtype, kind, target, rg in d["values"]:
            key = (tuple(shape), dtype)
            meta = metas.get(key) or metas.setdefault(key, TensorMeta(*key))
            values[name] = Value(name, meta, kind, target, rg)
        costs, sources, mutates = d.get("costs", {}), d.get("sources", {}), d.get("mutates", {})
        nodes = []
        for name, op, args, kwargs, outs in d["nodes"]:
            src = sources.get(name)
            loc = None
            if src:
                loc = locs.get(key := tuple(src)) or locs.setdefault(key, SourceLoc(*src))
            nodes.append(Node(name, op, tuple(_from_jsonable(a) for a in args),
                              {k: _from_jsonable(v) for k, v in kwargs.items()}, tuple(outs),
                              Cost(*costs[name]) if name in costs else Cost(), loc, mutates.get(name)))
        facts = TorchFacts.from_dict(d["torch_facts"]) if "torch_facts" in d else None
        return Graph(values, nodes, list(d["inputs"]), list(d["params"]), list(d["buffers"]), d["output"],
                     dict(d.get("unsupported", {})), facts)

    def hash(self) -> str:
        """Stable across runs and processes: depends only on structure, shapes and dtypes."""
        return hash_of_json(self.to_json())

    def ops(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def __repr__(self) -> str:
        return (f"Graph({len(self.nodes)} nodes, {len(self.params)} params, "
                f"{len(self.inputs)} inputs, hash={self.hash()})")


# The entries of Graph.to_json (a subset of Graph.to_dict's).
JSON_KEYS = ("values", "nodes", "inputs", "params", "buffers", "output")


def hash_of_json(d: dict) -> str:
    """:meth:`Graph.hash` from the graph's :meth:`~Graph.to_json` or :meth:`~Graph.to_dict`
    form, for a caller that has one already (plan.json holds both the graph and its hash)."""
    blob = json.dumps({k: d[k] for k in JSON_KEYS}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Ref):
        return {"ref": obj.name}
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(o) for o in obj]
    if isinstance(obj, float) and obj != obj:
        return "nan"
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return str(obj)
    return obj


def _from_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict) and set(obj) == {"ref"}:
        return Ref(obj["ref"])
    if isinstance(obj, list):
        return [_from_jsonable(o) for o in obj]
    if obj == "nan":
        return float("nan")
    if obj in ("inf", "-inf"):
        return float(obj)
    return obj
