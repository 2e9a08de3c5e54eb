"""Convolutions, pooling and the batch statistics norms of convolutional networks.

A convolution is a product summed over input channels and kernel taps, so the channel
dimensions behave like a matrix product's: sharding the batch shards the output (data
parallel), sharding the weight's output channels shards the output channels, and sharding
the input channels (input and weight together) gives a ``Partial`` sum, whose bias must then
be ``Partial`` too. Spatial dimensions couple neighbouring positions through the kernel; a
spatial shard is exact only when windows do not overlap and pieces hold whole windows (1x1
convolutions, a ViT patch embedding with kernel == stride), because there is no halo
exchange. Pooling is the same with channels acting as a batch dimension.

Batch norm in training mode normalises with statistics over every dimension but the
channel: sharding a channel is local, sharding anything else needs the *global* statistics,
which :func:`hapc.runtime.local_ops.batch_norm_sync` assembles with one all-reduce (sync
batch norm, exact for uneven pieces).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd
from typing import Any

from hapc.ir.graph import Graph, Node, Ref
from hapc.ir.layout import Layout, P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.ops_matmul import _with_bias_partial
from hapc.rules.ops_index import untouched_strategies
from hapc.rules.registry import Sample, register, register_spec
from hapc.rules.samples import Pos, T
from hapc.rules.spec import einsum_strategies, partial_strategies


def arg(node: Node, pos: int | None, name: str, default: Any = None) -> Any:
    """An op argument given by position or keyword, else its schema default."""
    if pos is not None and len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


def per_dim(value: Any, n: int, default: int) -> list[int]:
    """An int-or-list conv/pool argument as one int per spatial dim (``[]`` means default)."""
    if value is None or value == [] or value == ():
        return [default] * n
    if isinstance(value, int):
        return [value] * n
    value = list(value)
    return value * n if len(value) == 1 else value


def window_shardable(in_len: int, out_len: int, kernel: int, stride: int, padding: int,
                     dilation: int = 1) -> bool:
    """True when output position i reads only inside input block i of ``stride`` positions
    (windows that tile the input, or skip part of it: a strided 1x1 shortcut).

    Then a piece of whole blocks computes its own outputs with no neighbour's data; the
    program's block count (the gcd of linked dimension lengths) is ``out_len`` or a divisor
    of it, so pieces are always whole windows.
    """
    span = (kernel - 1) * dilation + 1
    return padding == 0 and span <= stride and in_len % stride == 0 and out_len == in_len // stride > 1


# --- convolution ---------------------------------------------------------------------------

# Overload -> (spatial dims, transposed). conv{n}d.padding takes padding as "same"/"valid";
# convolution.default (below) says whether it is transposed in an argument.
_CONV = {f"aten.conv{n}d.{o}": (n, False) for n in (1, 2, 3) for o in ("default", "padding")}
_CONV |= {"aten.conv_transpose1d.default": (1, True), "aten.conv_transpose2d.input": (2, True),
          "aten.conv_transpose3d.input": (3, True)}


def _conv_params(node: Node) -> tuple[bool, int, Any, Any, Any]:
    """(transposed, groups, stride, padding, dilation) of any convolution overload."""
    if node.op == "aten.convolution.default":
        transposed = bool(arg(node, 6, "transposed", False))
        groups = arg(node, 8, "groups", 1)
        dilation = arg(node, 5, "dilation", 1)
    elif _CONV[node.op][1]:
        transposed, groups, dilation = True, arg(node, 6, "groups", 1), arg(node, 7, "dilation", 1)
    else:
        transposed, groups, dilation = False, arg(node, 6, "groups", 1), arg(node, 5, "dilation", 1)
    return transposed, groups, arg(node, 3, "stride", 1), arg(node, 4, "padding", 0), dilation


def conv_rule(node: Node, graph: Graph) -> list[Strategy]:
    refs = node.input_refs()
    x, w = graph.meta(refs[0]).shape, graph.meta(refs[1]).shape
    out = graph.meta(node.outputs[0]).shape
    has_bias = len(refs) == 3
    n_spatial = len(w) - 2
    batched = len(x) == len(w)
    lead = 2 if batched else 1          # input dims before the spatial ones
    cdim = lead - 1
    transposed, groups, stride, padding, dilation = _conv_params(node)

    found: list[Strategy] = []
    if groups == 1:
        # Letters: n batch, i input channels (summed), o output channels, s/k spatial/kernel.
        sp = " ".join(f"s{i}^" for i in range(n_spatial))
        kern = " ".join(f"k{i}^" for i in range(n_spatial))
        weight = f"i+ o {kern}" if transposed else f"o i+ {kern}"
        batch = "n " if batched else ""
        spec = f"{batch}i+ {sp}, {weight}{', o' if has_bias else ''} -> {batch}o {sp}"
        found = einsum_strategies(node, graph, spec, "multilinear")
        if has_bias:
            # Linear in (x, w) separately; the bias is added: it is Partial only with the sum.
            found = [s for s in found if not (s.inputs[2] == P and s.inputs.count(P) == 1)]
            found = _with_bias_partial(found, 2)
    else:
        if batched and x[0] > 1:
            found.append(Strategy((Shard(0), R) + ((R,) if has_bias else ()), (Shard(0),)))
        partials = partial_strategies(2, "multilinear")
        found += [Strategy(s.inputs + ((P,) if has_bias else ()), s.outputs) for s in partials]
        found += _group_strategies(x, w, cdim, transposed, groups, has_bias)
    if not transposed:
        found += _spatial_strategies(node, x, w, out, lead, stride, padding, dilation, has_bias)
    return found


def _group_strategies(x: Sequence[int], w: Sequence[int], cdim: int, transposed: bool, groups: int,
                      has_bias: bool) -> list[Strategy]:
    """Shard whole groups: input channels, weight rows and output channels together.

    The pieces are whole groups only if the program's block count for the linked channel
    dimensions (their gcd, ``groups * gcd(in_per_group, out_per_group)``) equals ``groups``,
    i.e. when a group's input and output channel counts are coprime. Depthwise convolutions
    (one input channel per group) always qualify; others get no channel strategy rather
    than a wrong one.
    """
    if transposed or groups <= 1:
        return []
    in_per_group, out_per_group = w[1], w[0] // groups
    if gcd(in_per_group, out_per_group) != 1 or x[cdim] != groups * in_per_group:
        return []
    ins: tuple[Layout, ...] = (Shard(cdim), Shard(0)) + ((Shard(0),) if has_bias else ())
    return [Strategy(ins, (Shard(cdim),), local="conv_groups_local")]


def _spatial_strategies(node: Node, x, w, out, lead: int, stride, padding, dilation,
                        has_bias: bool) -> list[Strategy]:
    """Spatial shards for kernels whose windows tile the input (1x1, kernel == stride)."""
    n = len(w) - 2
    if isinstance(padding, str):
        if padding == "same" and any(k != 1 for k in w[2:]):
            return []
        padding = 0
    strides, pads, dils = per_dim(stride, n, 1), per_dim(padding, n, 0), per_dim(dilation, n, 1)
    found = []
    for i in range(n):
        d = lead + i
        if window_shardable(x[d], out[d], w[2 + i], strides[i], pads[i], dils[i]):
            found.append(Strategy((Shard(d), R) + ((R,) if has_bias else ()), (Shard(d),)))
    return found


def _conv_samples(n: int, transposed: bool = False, padding_str: bool = False):
    sp = {1: (7,), 2: (7, 5), 3: (5, 4, 3)}[n]          # small: float64 conv3d is slow on CPU

    def samples() -> list[Sample]:
        if transposed:
            return [Sample((T(5, 7, *sp), T(7, 4, *[2] * n), T(4), [2] * n)),
                    Sample((T(5, 7, *sp), T(7, 5, *[3] * n))),
                    Sample((T(5, 10, *sp), T(10, 1, *[2] * n), None, [1] * n, [0] * n, [0] * n, 5))]
        if padding_str:
            return [Sample((T(5, 7, *sp), T(4, 7, *[3] * n), T(4), [1] * n, "same")),
                    Sample((T(5, 7, *sp), T(4, 7, *[1] * n), T(4), [1] * n, "valid"))]
        shape = {1: (10,), 2: (10, 5), 3: (10, 6, 2)}[n]   # patchify by 2: >= 3 whole patches
        return [
            Sample((T(5, 7, *sp), T(4, 7, *[3] * n), T(4), [1] * n, [1] * n)),       # plain, padded
            Sample((T(5, 7, *sp), T(5, 7, *[3] * n))),                                # no bias
            Sample((T(7, *sp), T(4, 7, *[3] * n), T(4))),                              # unbatched
            Sample((T(5, 7, *sp), T(5, 7, *[1] * n), T(5))),                           # 1x1: spatial
            Sample((T(5, 7, *shape), T(4, 7, *[2] * n), T(4), [2] * n)),               # patchify
            Sample((T(5, 7, *shape), T(4, 7, *[1] * n), None, [2] * n)),               # strided 1x1
            Sample((T(4, 5, *sp), T(5, 1, *[3] * n), T(5), [1] * n, [1] * n, [1] * n, 5)),   # depthwise
            Sample((T(4, 10, *sp), T(15, 2, *[3] * n), None, [1] * n, [0] * n, [1] * n, 5)),  # 2 -> 3 / group
            Sample((T(4, 8, *sp), T(4, 4, *[3] * n), T(4), [1] * n, [0] * n, [1] * n, 2)),   # not coprime
        ]
    return samples


for _op, (_n, _tr) in _CONV.items():
    register_spec(_op, conv_rule, samples=_conv_samples(_n, _tr, _op.endswith(".padding")))
register_spec("aten.convolution.default", conv_rule, samples=lambda: [
    Sample((T(5, 7, 7, 5), T(4, 7, 3, 3), T(4), [1, 1], [1, 1], [1, 1], False, [0, 0], 1)),
    Sample((T(5, 7, 7, 5), T(7, 4, 2, 2), T(4), [2, 2], [0, 0], [1, 1], True, [0, 0], 1)),
    Sample((T(4, 5, 7, 5), T(5, 1, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 5)),
])


# --- pooling -------------------------------------------------------------------------------

def _pool_rule(n_spatial: int, kind: str):
    """kind: "max" (window args kernel, stride, padding, dilation), "avg" (kernel, stride,
    padding; linear), "max_idx" (also returns indices), "adaptive_avg", "adaptive_max"."""

    def rule(node: Node, graph: Graph) -> list[Strategy]:
        x = graph.meta(node.input_refs()[0]).shape
        out = graph.meta(node.outputs[0]).shape
        lead = len(x) - n_spatial
        n_out = len(node.outputs)
        # Batch and channel dims are independent images: any of them shards freely.
        found = [Strategy((Shard(d),), tuple(Shard(d) for _ in range(n_out)))
                 for d in range(lead) if x[d] > 1]
        if kind in ("avg", "adaptive_avg"):
            found.append(Strategy((P,), (P,)))
        for i in range(n_spatial):
            d = lead + i
            if kind in ("max", "avg"):
                kernel = per_dim(arg(node, 1, "kernel_size"), n_spatial, 1)
                stride = per_dim(arg(node, 2, "stride"), n_spatial, 0)
                stride = [s or k for s, k in zip(stride, kernel)]
                pad = per_dim(arg(node, 3, "padding", 0), n_spatial, 0)
                dil = per_dim(arg(node, 4, "dilation", 1), n_spatial, 1) if kind == "max" else [1] * n_spatial
                if window_shardable(x[d], out[d], kernel[i], stride[i], pad[i], dil[i]):
                    found.append(Strategy((Shard(d),), (Shard(d),)))
            elif kind == "adaptive_avg":
                if out[d] == 1 and x[d] > 1:
                    # The mean of a piece, scaled by its share of the length, sums to the mean.
                    found.append(Strategy((Shard(d),), (P,), rescale=(0, d)))
                elif out[d] > 1 and x[d] % out[d] == 0:
                    found.append(Strategy((Shard(d),), (Shard(d),), local="adaptive_avg_pool_local"))
        return found

    return rule


def _pool_samples(n: int, kind: str):
    tiled = (10, 8, 6)[:n]       # even: windows of 2 tile it, in at least 3 blocks
    odd = (7, 5, 5)[:n]

    def samples() -> list[Sample]:
        ones, zeros = [1] * n, [0] * n
        if kind.startswith("adaptive"):
            return [Sample((T(5, 7, *tiled), [s // 2 for s in tiled])), Sample((T(5, 7, *odd), [3] * n)),
                    Sample((T(7, *tiled), ones))]
        if kind == "avg":   # kernel, stride, padding, ceil_mode, count_include_pad
            overlap, ceil = (ones, ones, False, False), ([2] * n, zeros, True)
        else:               # kernel, stride, padding, dilation, ceil_mode
            overlap, ceil = (ones, ones, ones), ([2] * n, zeros, ones, True)
        return [Sample((T(5, 7, *tiled), [2] * n)),                 # stride = kernel: tiles
                Sample((T(5, 7, *tiled), [1] * n, [2] * n)),        # kernel < stride: skips
                Sample((T(5, 7, *odd), [3] * n) + overlap),         # overlapping, padded windows
                Sample((T(7, *odd), [2] * n) + ceil)]               # unbatched, ceil_mode
    return samples


for _n in (1, 2, 3):
    register_spec(f"aten.max_pool{_n}d.default", _pool_rule(_n, "max"), samples=_pool_samples(_n, "max"))
    register_spec(f"aten.avg_pool{_n}d.default", _pool_rule(_n, "avg"), samples=_pool_samples(_n, "avg"))
    register_spec(f"aten.adaptive_avg_pool{_n}d.default", _pool_rule(_n, "adaptive_avg"),
                  samples=_pool_samples(_n, "adaptive_avg"))
    register_spec(f"aten.adaptive_max_pool{_n}d.default", _pool_rule(_n, "adaptive_max"),
                  samples=_pool_samples(_n, "adaptive_max"))
for _n in (2, 3):
    register_spec(f"aten.max_pool{_n}d_with_indices.default", _pool_rule(_n, "max_idx"),
                  samples=_pool_samples(_n, "max_idx"))
    register_spec(f"aten._adaptive_avg_pool{_n}d.default", _pool_rule(_n, "adaptive_avg"),
                  samples=_pool_samples(_n, "adaptive_avg"))


# --- batch, instance and group norm --------------------------------------------------------

def _optional_refs(node: Node, positions: Sequence[int]) -> list[bool]:
    """Which of the optional tensor arguments at ``positions`` are present."""
    return [isinstance(node.args[p] if len(node.args) > p else None, Ref) for p in positions]


def _norm_layouts(x_layout: Layout, present: Sequence[bool], per_channel: Layout) -> tuple[Layout, ...]:
    return (x_layout,) + tuple(per_channel for p in present if p)


@register("aten.batch_norm.default", samples=lambda: [
    Sample((T(5, 7, 4, 5), T(7), T(7), T(7), Pos(7), True, 0.1, 1e-5, False), frozen=(3, 4)),
    Sample((T(5, 7, 4, 5), T(7), T(7), T(7), Pos(7), False, 0.1, 1e-5, False), frozen=(3, 4)),
    Sample((T(7, 5), None, None, T(5), Pos(5), True, 0.3, 1e-5, False), frozen=(1, 2)),
    Sample((T(5, 7, 4), T(7), T(7), None, None, True, 0.1, 1e-5, False)),
])
def batch_norm_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Channel shards are local; other shards need global statistics when the op uses batch
    statistics (training, or no running statistics): ``batch_norm_sync``.

    Running statistics (when present) are side effects: with a channel shard each rank
    updates its slice in place (they are sharded like the weight); with ``batch_norm_sync``
    they stay replicated and every rank writes the same update from the global statistics.
    """
    x = graph.meta(node.input_refs()[0]).shape
    present = _optional_refs(node, (1, 2, 3, 4))
    batch_stats = bool(arg(node, 5, "training", False)) or not present[2]
    found = []
    if len(x) >= 2 and x[1] > 1:
        found.append(Strategy(_norm_layouts(Shard(1), present, Shard(0)), (Shard(1),)))
    for d, size in enumerate(x):
        if d != 1 and size > 1:
            found.append(Strategy(_norm_layouts(Shard(d), present, R), (Shard(d),),
                                  local="batch_norm_sync" if batch_stats else None))
    return found


@register("aten.instance_norm.default", samples=lambda: [
    Sample((T(5, 7, 4, 5), T(7), T(7), None, None, True, 0.1, 1e-5, False)),
    Sample((T(5, 7, 4), T(7), T(7), T(7), Pos(7), True, 0.1, 1e-5, False), frozen=(3, 4)),
    Sample((T(5, 7, 4), None, None, T(7), Pos(7), False, 0.1, 1e-5, False), frozen=(1, 2)),
])
def instance_norm_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Statistics per (sample, channel): both shard freely, except that running statistics
    updated from instance statistics average over the batch, so a batch shard would update
    them from a local average; spatial dims shard only when no statistics are computed."""
    x = graph.meta(node.input_refs()[0]).shape
    present = _optional_refs(node, (1, 2, 3, 4))
    input_stats = bool(arg(node, 5, "use_input_stats", True))
    found = []
    if x[1] > 1:
        found.append(Strategy(_norm_layouts(Shard(1), present, Shard(0)), (Shard(1),)))
    for d, size in enumerate(x):
        if d == 1 or size <= 1:
            continue
        if not input_stats or (d == 0 and not present[2]):
            found.append(Strategy(_norm_layouts(Shard(d), present, R), (Shard(d),)))
    return found


@register("aten.group_norm.default", samples=lambda: [
    Sample((T(5, 6, 4, 5), 2, T(6), T(6), 1e-5, False)), Sample((T(7, 4, 5), 4))])
def group_norm_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Statistics per (sample, group): the batch shards freely. Channel shards would have to
    hold whole groups, which block counts (gcds of lengths) cannot promise: not offered."""
    x = graph.meta(node.input_refs()[0]).shape
    present = _optional_refs(node, (2, 3))
    if x[0] <= 1:
        return []
    return [Strategy(_norm_layouts(Shard(0), present, R), (Shard(0),))]


# --- interpolation ---------------------------------------------------------------------------------

def _upsample_rule(node: Node, graph: Graph) -> list[Strategy]:
    """Each (sample, channel) plane is resized on its own, so those dims shard freely; the
    resize is linear in the input (nearest picks, the others weigh neighbours), so a
    ``Partial`` passes through."""
    rank = len(graph.meta(node.input_refs()[0]).shape)
    return untouched_strategies(node, graph, list(range(2, rank)))


for _op, _samples in {
    "aten.upsample_bilinear2d.vec": lambda: [Sample((T(2, 3, 5, 7), [10, 14], False, None)),
                                            Sample((T(3, 2, 4, 4), None, True, [2.0, 1.5]))],
    "aten.upsample_bicubic2d.vec": lambda: [Sample((T(2, 3, 5, 7), [6, 9], False, None))],
    "aten.upsample_nearest2d.vec": lambda: [Sample((T(2, 3, 5, 7), [10, 14], None)),
                                           Sample((T(3, 2, 4, 4), None, [2.0, 3.0]))],
    "aten._upsample_nearest_exact2d.vec": lambda: [Sample((T(2, 3, 5, 7), [9, 11], None))],
    "aten.upsample_linear1d.vec": lambda: [Sample((T(2, 3, 7), [12], True, None))],
    "aten.upsample_nearest1d.vec": lambda: [Sample((T(2, 3, 7), [14], None))],
    "aten.upsample_trilinear3d.vec": lambda: [Sample((T(2, 3, 3, 4, 5), [6, 8, 7], False, None))],
    "aten.upsample_nearest3d.vec": lambda: [Sample((T(2, 3, 3, 4, 5), [6, 8, 10], None))],
}.items():
    register_spec(_op, _upsample_rule, samples=_samples)
