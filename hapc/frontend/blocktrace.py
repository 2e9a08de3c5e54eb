"""Tracing one instance of a repeated block and replicating it: deep models in the time of shallow ones.

``torch.export`` spends its time per traced op, so a 48-layer GPT takes about 15x as long as a
3-layer one, and its layers are all the same. When a model holds its layers in one
``nn.ModuleList`` (or ``nn.Sequential``) of structurally identical blocks, we export the model
twice with that list cut to 2 and to 3 blocks (a shallow copy; the user's model is untouched),
learn from the two graphs how a layer repeats, and build the graph of all layers from them.
The two exports do not depend on each other: the one of 3 runs in a forked child on a spare
core (:mod:`hapc.process.fork`) while this process exports 2.

What the full trace would give is reproduced exactly, names included: torch.export names each
node after its op with a running counter (``linear``, ``linear_1``, ...), so the counters in
one layer are those of the layer before plus a constant per name, and those after the layers
move by a constant per layer. Both constants are read off the two short traces.

Nothing is taken on faith. The copy is used only when

* the blocks are provably interchangeable: same class, same parameter and buffer names,
  shapes, dtypes and ``requires_grad``, equal plain attributes in every submodule, no parameter
  or buffer shared with anything else, no hooks, the same training mode. The one attribute
  allowed to differ is an integer counting up with the position (Hugging Face's ``layer_idx``,
  read only by the generation cache): during the short traces it is replaced by an object that
  raises when used, so a trace that completes shows that the forward did not read it;
* the graph of 3 blocks is exactly the one predicted from the graph of 2 (every node, argument,
  shape, source line and name): this catches a first or last block that behaves differently,
  blocks alternating in kind, and a forward that reads the number of layers;
* a layer's nodes read only the layer before, values made before the layers, and their own
  parameters (no lifted constants, no regions of higher-order ops whose names we cannot map).

Otherwise :func:`trace_repeated` returns None and the caller traces the whole model. What the
test cannot see is a forward whose behaviour changes at an index beyond the third block other
than the last one (``if i >= 5``); such a model is unusual, and ``--verify`` would catch it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from hapc.process.collector import gc_frozen
from hapc.process.fork import Beside, single_threaded, spare_core
from hapc.ir.graph import Graph, Node, Ref, Value

# Below this many blocks two short traces cost about what the full one does.
MIN_BLOCKS = 5

# Module attributes that hold structure or state handled separately (parameters, buffers,
# children) or that carry no behaviour (state-dict and load hooks).
_STRUCTURAL = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}
_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


@dataclass(frozen=True)
class RepeatedBlocks:
    """The list of interchangeable blocks: its qualified name in the model, its length, and the
    integer attributes that hold each block's position (Hugging Face's ``layer_idx``), as
    (submodule name within the block, attribute) pairs."""

    path: str
    count: int
    index_attributes: tuple[tuple[str, str], ...] = ()


def find_repeated_blocks(model: nn.Module) -> RepeatedBlocks | None:
    """The largest list of interchangeable blocks in ``model`` (by parameter count), or None."""
    if _global_hooks():
        return None
    owners = _parameter_owners(model)
    best, best_size = None, 0
    for path, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < MIN_BLOCKS:
            continue
        blocks = list(module)
        index_attributes = _interchangeable(blocks, owners)
        if index_attributes is None:
            continue
        size = sum(p.numel() for p in module.parameters())
        if size > best_size:
            best, best_size = RepeatedBlocks(path, len(blocks), index_attributes), size
    return best


def trace_repeated(model: nn.Module, inputs: Sequence[Any],
                   export: Callable[[nn.Module, tuple], torch.export.ExportedProgram],
                   lift: Callable[[torch.export.ExportedProgram], Graph],
                   meanwhile: Callable[[Graph], None] | None = None) -> tuple[Graph, dict] | None:
    """The lifted IR of ``model(*inputs)`` built from short traces, and the exported constants;
    None when the model has no provably repeated blocks (trace it whole then).

    ``export``/``lift`` are the tracer's own steps, so the short graphs are made exactly as the
    full one would be. ``meanwhile(graph)`` is called with the graph of 2 blocks (which it must
    not change) while the child still traces 3: work the full graph will need anyway.
    """
    blocks = find_repeated_blocks(model)
    if blocks is None:
        return None

    def short_graph(count: int) -> tuple[Graph, _Layout | None, dict]:
        ep = export(_shortened(model, blocks.path, count), tuple(inputs))
        graph = lift(ep)
        return graph, _layout(graph, ep, blocks.path, count), dict(ep.constants)

    three = None
    try:
        with _positions_hidden(_module_at(model, blocks.path), blocks.index_attributes):
            # The two short traces are independent: the one of 3 runs in a forked child on the
            # other core while this process traces 2 (hapc.process.fork; here, when there is no
            # spare core or the child fails). Only the child's small graph comes back.
            with gc_frozen():        # a collection would copy the memory the fork shares
                if may_fork():
                    three = Beside(_reads_announced(lambda: short_graph(3)[:2]))
                g2, layout2, constants = short_graph(2)
                if meanwhile is not None and three is not None and three.forked:
                    meanwhile(g2)
                g3, layout3 = _announce_reads(three.result()) if three is not None else short_graph(3)[:2]
    except BaseException as exc:
        if three is not None:
            three.cancel()          # also on Ctrl-C: the child is stopped and reaped, not left behind
        if not isinstance(exc, Exception):
            raise
        return None                 # a position was used, or the full trace reports the error in the user's terms
    if layout2 is None or layout3 is None:
        return None
    try:
        repeat = _Repeat(g2, layout2, g3, layout3, blocks.path)
        predicted = repeat.graph(3)
        if predicted != g3 or list(predicted.values) != list(g3.values):
            return None
        return repeat.graph(blocks.count), constants
    except _NotRepeated:
        return None


def may_fork() -> bool:
    """Whether the trace of 3 blocks should run in a forked child: there is a spare core
    (:func:`hapc.process.fork.spare_core`), no other Python thread runs (a lock one of them held
    would never be released in the child, :func:`hapc.process.fork.single_threaded`), and the
    child would not need the parent's CUDA context, which it cannot use (a model file that built
    on the GPU)."""
    return spare_core() and single_threaded() and not torch.cuda.is_initialized()


def _reads_announced(job: Callable[[], Any]) -> Callable[[], tuple[Any, list[str]]]:
    """``job`` that also returns the files it read when it runs in a forked child (the sources
    of modules it imported, and every file opened for reading), for :func:`_announce_reads`."""
    parent = os.getpid()

    def run() -> tuple[Any, list[str]]:
        if os.getpid() == parent:            # run here: the reads were seen as they happened
            return job(), []
        opened: list[str] = []

        def record(event: str, args: tuple) -> None:        # the child's own hook: gone with it
            if event == "open" and len(args) >= 3 and isinstance(args[0], str) and _reading(*args[1:3]):
                opened.append(args[0])

        sys.addaudithook(record)
        before = set(sys.modules)
        result = job()
        files = [getattr(sys.modules[m], "__file__", None) for m in set(sys.modules) - before]
        return result, opened + [f for f in files if isinstance(f, str)]

    return run


def _reading(mode: Any, flags: Any) -> bool:
    """Whether an ``open`` audit event is a read (``open()`` gives a mode, ``os.open`` flags)."""
    if isinstance(mode, str):
        return not any(c in mode for c in "wax+")
    return isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) == 0


def _announce_reads(done: tuple[Any, list[str]]) -> Any:
    """Raise here the ``open`` audit events of the files a forked child read, so that whoever
    records what a trace depended on (hapc.frontend.cache.sources) sees them as if read in this process."""
    result, reads = done
    for path in reads:
        sys.audit("open", path, "r", os.O_RDONLY)
    return result


# --- which blocks are interchangeable ---------------------------------------------------------

def _global_hooks() -> bool:
    from torch.nn.modules import module as m

    return any(len(getattr(m, name, {})) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks", "_global_module_registration_hooks",
        "_global_parameter_registration_hooks", "_global_buffer_registration_hooks"))


def _parameter_owners(model: nn.Module) -> dict[int, int]:
    """How many names in the model reach each parameter or buffer (by identity)."""
    seen: dict[int, int] = {}
    for _, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        seen[id(t)] = seen.get(id(t), 0) + 1
    return seen


def _interchangeable(blocks: list[nn.Module], owners: dict[int, int]) -> tuple[tuple[str, str], ...] | None:
    """None unless the blocks are interchangeable; else the attributes in which they differ,
    each an integer that counts up with the block's position (a layer index)."""
    first = _signature(blocks[0])
    if first is None:
        return None
    for block in blocks:
        if any(owners.get(id(t), 0) != 1 for t in list(block.parameters()) + list(block.buffers())):
            return None          # shared (tied) weights: one layer's names stand for another's
    positional: set[tuple[str, str]] = set()
    for j, block in enumerate(blocks[1:], start=1):
        sig = _signature(block)
        if sig is None or len(sig) != len(first):
            return None
        for part0, part in zip(first, sig):
            if part0 == part:
                continue
            if part0[:2] != part[:2] or part0[3:] != part[3:] or [k for k, _ in part0[2]] != [k for k, _ in part[2]]:
                return None
            for (key, a), (_, b) in zip(part0[2], part[2]):
                if a != b and not (a[0] is int and b[0] is int and b[1] - a[1] == j):
                    return None
                if a != b:
                    positional.add((part0[0], key))
    return tuple(sorted(positional))


class _PositionUsed(Exception):
    pass


class _Opaque:
    """Stands in for a block's layer index during the short traces: any use of it (a comparison,
    arithmetic, indexing, hashing, printing) raises, so a trace that completes did not read it."""

    __slots__ = ()

    def _used(self, *_: Any) -> Any:
        raise _PositionUsed("the block's forward reads its layer index")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __bool__ = __index__ = __int__ = _used
    __float__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __mod__ = __rmod__ = _used
    __floordiv__ = __truediv__ = __pow__ = __neg__ = __format__ = __str__ = __repr__ = __iter__ = _used
    __len__ = __contains__ = __getitem__ = __call__ = __deepcopy__ = __copy__ = __reduce_ex__ = _used

    def __getattr__(self, name: str) -> Any:
        raise _PositionUsed("the block's forward reads its layer index")


def _module_at(model: nn.Module, path: str) -> nn.Module:
    return model.get_submodule(path) if path else model


@contextlib.contextmanager
def _positions_hidden(blocks: nn.Module, attributes: tuple[tuple[str, str], ...]):
    """Replace each block's layer-index attributes by :class:`_Opaque` while the short copies
    are traced (the copies share the user's block objects), and put them back after."""
    saved = []
    try:
        for block in list(blocks)[:3]:
            for where, key in attributes:
                owner = block.get_submodule(where) if where else block
                saved.append((owner, key, owner.__dict__[key]))
                owner.__dict__[key] = _Opaque()
        yield
    finally:
        for owner, key, value in saved:
            owner.__dict__[key] = value


def _signature(block: nn.Module) -> tuple | None:
    """Everything a block's forward may depend on besides tensor values; None when a part
    cannot be compared (a hook, an attribute that is not plain data)."""
    parts = []
    for name, mod in block.named_modules():
        attrs = []
        for key, val in sorted(vars(mod).items()):
            if key in _STRUCTURAL:
                continue
            if "hook" in key:
                if ("forward" in key or "backward" in key) and val:
                    return None
                continue
            plain = _plain(val)
            if plain is _NOT_PLAIN:
                return None
            attrs.append((key, plain))
        tensors = [(n, tuple(t.shape), t.dtype, t.requires_grad, type(t))
                   for n, t in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False))]
        parts.append((name, type(mod), tuple(attrs), tuple(tensors), tuple(sorted(mod._non_persistent_buffers_set))))
    return tuple(parts)


_NOT_PLAIN = object()


def _plain(val: Any) -> Any:
    """A comparable form of an attribute; objects shared by all blocks (a config) compare by
    identity, anything else that is not plain data cannot be compared."""
    if isinstance(val, _PLAIN):
        return (type(val), val)
    if isinstance(val, (tuple, list, frozenset, set)):
        items = [_plain(v) for v in (sorted(val, key=repr) if isinstance(val, (set, frozenset)) else val)]
        return _NOT_PLAIN if any(i is _NOT_PLAIN for i in items) else (type(val), tuple(items))
    if isinstance(val, dict):
        items = [(k, _plain(v)) for k, v in val.items()]
        return _NOT_PLAIN if any(i is _NOT_PLAIN for _, i in items) else (dict, tuple(items))
    if isinstance(val, nn.Module) and not (val._parameters or val._buffers or val._modules):
        # A stateless module kept outside the module tree, one per block (transformers 5 keeps a
        # function wrapped as a Module in a dict of kernels on each attention): alike blocks
        # hold one of the same class with the same plain attributes.
        own = _signature(val)
        return _NOT_PLAIN if own is None else ("stateless module", type(val), own)
    if callable(val) and not isinstance(val, nn.Module) and hasattr(val, "__qualname__"):
        return ("callable", id(val))     # a function chosen in __init__ (an activation)
    if isinstance(val, torch.Tensor):
        return _NOT_PLAIN                # an unregistered tensor: each block's own data
    return ("object", id(val))           # shared by identity, or unequal


def _shortened(model: nn.Module, path: str, count: int) -> nn.Module:
    """A shallow copy of ``model`` whose list at ``path`` holds only its first ``count``
    blocks; every other module, parameter and buffer is the model's own."""
    def cut(module: nn.Module, parts: list[str]) -> nn.Module:
        clone = object.__new__(type(module))
        clone.__dict__.update(module.__dict__)
        clone.__dict__["_modules"] = dict(module._modules)
        head = parts[0]
        child = module._modules[head]
        clone._modules[head] = child[:count] if len(parts) == 1 else cut(child, parts[1:])
        return clone

    return cut(model, path.split(".")) if path else model[:count]


# --- where the layers are in a short graph ----------------------------------------------------

@dataclass
class _Layout:
    """Node positions: the prefix ends at ``start``, layer j spans ``start + j*span`` onwards."""

    start: int
    span: int
    count: int

    @property
    def end(self) -> int:
        return self.start + self.span * self.count


class _NotRepeated(Exception):
    pass


def _layout(graph: Graph, ep: torch.export.ExportedProgram, path: str, count: int) -> _Layout | None:
    """Where each block's nodes sit in ``graph``; None unless they form ``count`` equal, ordered
    runs (a run may end with the forward's own code between two block calls)."""
    block_of = {}
    pattern = re.compile(rf"^{re.escape(path)}\.(\d+)(\.|$)" if path else r"^(\d+)(\.|$)")
    for fx in ep.graph.nodes:
        for entry in (fx.meta.get("nn_module_stack") or {}).values():
            found = pattern.match(entry[0]) if isinstance(entry, tuple) and entry else None
            if found:
                block_of[fx.name] = int(found.group(1))
                break
    where = [block_of.get(n.name) for n in graph.nodes]
    firsts = []
    for j in range(count):
        if j not in where:
            return None
        firsts.append(where.index(j))
    spans = {b - a for a, b in zip(firsts, firsts[1:])}
    if len(spans) != 1 or any(b <= a for a, b in zip(firsts, firsts[1:])):
        return None
    layout = _Layout(firsts[0], spans.pop(), count)
    for i, j in enumerate(where):
        inside = layout.start <= i < layout.end
        if j is not None and (not inside or (i - layout.start) // layout.span != j):
            return None
    if layout.end > len(graph.nodes):
        return None
    return layout


# --- names that count up by layer --------------------------------------------------------------

_DIGITS = re.compile(r"(\d+)")


def _step(before: str, after: str) -> tuple[list[str], list[int], list[int]]:
    """How the numbers in a name move between two positions: the name's text pieces, the
    numbers in ``after`` and their step. ``linear`` -> ``linear_6`` is ``linear_0`` -> ``linear_6``."""
    a, b = _DIGITS.split(before), _DIGITS.split(after)
    if a[0::2] != b[0::2] and _DIGITS.split(before + "_0")[0::2] == b[0::2] and after.startswith(before + "_"):
        a = _DIGITS.split(before + "_0")
    if a[0::2] != b[0::2]:
        raise _NotRepeated(f"{before} and {after} are not one name counting up")
    numbers_a, numbers_b = [int(x) for x in a[1::2]], [int(x) for x in b[1::2]]
    return b[0::2], numbers_b, [y - x for x, y in zip(numbers_a, numbers_b)]


def _moved(text: list[str], numbers: list[int], steps: list[int], times: int) -> str:
    moved = [n + s * times for n, s in zip(numbers, steps)]
    out = [text[0]]
    for n, t in zip(moved, text[1:]):
        out += [str(n), t]
    return "".join(out)


class _Repeat:
    """The graph of any number of layers, from the graphs of 2 and 3."""

    def __init__(self, g2: Graph, at2: _Layout, g3: Graph, at3: _Layout, path: str) -> None:
        if at2.span != at3.span or at2.start != at3.start or len(g3.nodes) - len(g2.nodes) != at2.span:
            raise _NotRepeated("the layers do not repeat")
        self.g = g2
        nodes = g2.nodes
        self.prefix = nodes[:at2.start]
        self.layer0 = nodes[at2.start:at2.start + at2.span]
        self.layer1 = nodes[at2.start + at2.span:at2.end]
        self.suffix = nodes[at2.end:]
        self.suffix3 = g3.nodes[at3.end:]
        # One layer's names, paired with the layer before: node names, results, own parameters.
        self.layer_names: dict[str, tuple[list[str], list[int], list[int]]] = {}
        self.previous: dict[str, str] = {}     # a name in layer 0 -> its place in layer 1
        for n0, n1 in zip(self.layer0, self.layer1):
            if n0.op != n1.op or len(n0.outputs) != len(n1.outputs):
                raise _NotRepeated("layers 0 and 1 differ")
            for a, b in [(n0.name, n1.name)] + list(zip(n0.outputs, n1.outputs)):
                self.layer_names[b] = _step(a, b)
                self.previous[a] = b
        self.block_values = {j: [v for v in g2.values.values() if _in_block(v, path, j)] for j in (0, 1)}
        if len(self.block_values[0]) != len(self.block_values[1]):
            raise _NotRepeated("blocks 0 and 1 hold different tensors")
        self.target_step: dict[str, tuple] = {}
        for v0, v1 in zip(*self.block_values.values()):
            self.layer_names[v1.name] = _step(v0.name, v1.name)
            self.target_step[v1.name] = _step(v0.target, v1.target)
            self.previous[v0.name] = v1.name
        # Names made after the layers count on by a fixed step per layer.
        self.suffix_names: dict[str, tuple] = {}
        if len(self.suffix) != len(self.suffix3):
            raise _NotRepeated("the code after the layers depends on their number")
        for n2, n3 in zip(self.suffix, self.suffix3):
            for a, b in [(n2.name, n3.name)] + list(zip(n2.outputs, n3.outputs)):
                self.suffix_names[a] = _step(a, b)
        constants = {v.name for v in g2.values.values() if v.kind == "constant"}
        for node in self.layer0 + self.layer1:
            if "__" in node.name or constants & set(node.input_refs()):
                raise _NotRepeated("a layer reads a lifted constant or inlines a higher-order op")

    def name(self, name: str, layer: int, count: int) -> str:
        """``name`` (a name of layer 1, of the suffix, or from before the layers) as it is in the
        graph of ``count`` layers when read in ``layer`` (a suffix name: ``layer`` is ignored)."""
        if name in self.layer_names:
            text, numbers, steps = self.layer_names[name]
            return _moved(text, numbers, steps, layer - 1)
        if name in self.suffix_names:
            text, numbers, steps = self.suffix_names[name]       # numbers as in the graph of 3
            return _moved(text, numbers, steps, count - 3)
        return name

    def graph(self, count: int) -> Graph:
        g = self.g
        of_layer1 = set(self.layer_names)

        def in_layer(layer: int) -> Callable[[str], str]:
            def rename(name: str) -> str:
                if name in of_layer1:
                    return self.name(name, layer, count)
                if name in self.previous:                 # read from the layer before
                    return name if layer == 1 else self.name(self.previous[name], layer - 1, count)
                return name
            return rename

        def in_suffix(name: str) -> str:
            if name in of_layer1:
                return self.name(name, count - 1, count)
            return self.name(name, 0, count)

        nodes = list(self.prefix) + list(self.layer0)
        for layer in range(1, count):
            nodes += [_renamed(n, in_layer(layer)) for n in self.layer1]
        nodes += [_renamed(n, in_suffix) for n in self.suffix]

        # Values in the order the full trace lists them: each of layer 1's groups (its
        # parameters, its buffers, its results) stands where layers 1..count-1 go.
        groups = [[v for v in self.block_values[1] if v.kind == kind] for kind in ("param", "buffer")]
        groups.append([g.values[o] for n in self.layer1 for o in n.outputs])
        group_of = {v.name: i for i, group in enumerate(groups) for v in group}
        values: dict[str, Value] = {}
        done: set[int] = set()
        for v in g.values.values():
            if v.name in group_of:
                i = group_of[v.name]
                if i not in done:
                    done.add(i)
                    for layer in range(1, count):
                        for w in groups[i]:
                            values[self.name(w.name, layer, count)] = self._value(w, layer, count)
                continue
            if v.name in self.suffix_names:
                v = replace(v, name=self.name(v.name, 0, count))
            values[v.name] = v
        return Graph(values, nodes, list(g.inputs), self._listed(g.params, count), self._listed(g.buffers, count),
                     in_suffix(g.output))

    def _value(self, v: Value, layer: int, count: int) -> Value:
        target = v.target
        if v.name in self.target_step:
            text, numbers, steps = self.target_step[v.name]
            target = _moved(text, numbers, steps, layer - 1)
        return replace(v, name=self.name(v.name, layer, count), target=target)

    def _listed(self, names: list[str], count: int) -> list[str]:
        block1 = [n for n in names if n in self.target_step]
        if not block1:
            return list(names)
        at = names.index(block1[0])
        rest = [n for n in names[at:] if n not in self.target_step]
        return names[:at] + [self.name(n, layer, count) for layer in range(1, count) for n in block1] + rest


def _in_block(v: Value, path: str, j: int) -> bool:
    prefix = f"{path}.{j}." if path else f"{j}."
    return v.kind in ("param", "buffer") and v.target is not None and v.target.startswith(prefix)


def _renamed(node: Node, rename: Callable[[str], str]) -> Node:
    def arg(a: Any) -> Any:
        if isinstance(a, Ref):
            return Ref(rename(a.name))
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return a

    return Node(name=rename(node.name), op=node.op, args=arg(node.args),
                kwargs={k: arg(v) for k, v in node.kwargs.items()},
                outputs=tuple(rename(o) for o in node.outputs), cost=node.cost, source=node.source,
                mutates=rename(node.mutates) if node.mutates else None)
