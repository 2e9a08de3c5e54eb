"""Grouped matmuls over expert-sorted rows: how Hugging Face runs mixture-of-experts layers.

``grouped_mm(x[S, K], w[E, K, N], offs[E])`` multiplies the rows ``offs[e-1]:offs[e]`` of ``x``
(tokens sorted by the expert they were routed to) by expert ``e``'s matrix. transformers 5
traces it as its custom op ``transformers::grouped_mm_fallback`` (Mixtral, Qwen2/3-MoE,
DeepSeek, GraniteMoE and GPT-OSS all route through it), between a sort of the routed tokens
and the inverse permutation that puts them back.

Strategies:

* **expert parallel**: each rank holds some experts' matrices (``w`` sharded on experts) and
  multiplies only the rows routed to them. Its output is ``ExpertRows`` (just those rows,
  ``grouped_mm_experts``), so the gated activation between the up and the down projection
  (``silu(gate) * up``) runs on those rows alone (:mod:`hapc.rules.expert_rows`), or a
  ``Partial`` (the rows in their places, zeros elsewhere: ``grouped_mm_experts_padded``),
  which one reduction after the layer completes, as Megatron-Core's all-gather token
  dispatcher does. Its input is whole, or ``ExpertRows`` of the same routing;
* **rows**: each rank multiplies a stretch of the sorted rows by whole experts
  (``grouped_mm_rows`` shifts the offsets to the stretch);
* **tensor parallel inside every expert**: ``w`` split on its output columns (the output
  sharded alike) or on its inner dimension with ``x`` (a ``Partial`` output);
* a ``Partial`` input with whole experts gives a ``Partial`` output (the product is linear).
"""

from __future__ import annotations

import torch

from hapc.ir.graph import Graph, Node
from hapc.ir.layout import E, P, R, Shard
from hapc.ir.program import Strategy
from hapc.rules.expert_rows import GROUPED_MM_OPS, expert_row_values
from hapc.rules.registry import Sample, register
from hapc.rules.samples import T


def grouped_mm_flops(rows: int, inner: int, cols: int) -> tuple[float, float]:
    """(forward, backward) FLOPs: one product of every row with its expert's matrix, and two
    in backward (the input's gradient and the expert's)."""
    fwd = 2.0 * rows * inner * cols
    return fwd, 2.0 * fwd


def _samples() -> list[Sample]:
    try:
        import transformers.integrations.moe  # noqa: F401  (registers the op)
    except ImportError:
        return []
    # Five experts over shares 0.5/0.3/0.2 are cut 3/1/1 (or 2/2/1): one expert has no rows,
    # so a rank may own only empty experts.
    counts = [(3, 0, 4, 2, 1), (0, 2, 2, 5, 1), (4, 1, 0, 0, 5)]
    found = []
    for c in counts:
        offs = torch.tensor(c, dtype=torch.int32).cumsum(0).to(torch.int32)
        found.append(Sample((T(sum(c), 6), T(len(c), 6, 7), offs), owners="experts"))
    return found


@register(sorted(GROUPED_MM_OPS), samples=_samples)
def grouped_mm_rule(node: Node, graph: Graph) -> list[Strategy]:
    x, w, offs = node.input_refs()[:3]
    rows, inner = graph.meta(x).shape
    experts, _, cols = graph.meta(w).shape
    rows_held = expert_row_values(graph)
    found = []
    if experts > 1:
        for x_layout in (R, E) if x in rows_held else (R,):
            if node.outputs[0] in rows_held:
                found.append(Strategy((x_layout, Shard(0), R), (E,), local="grouped_mm_experts"))
            found.append(Strategy((x_layout, Shard(0), R), (P,), local="grouped_mm_experts_padded"))
    if rows > 1:
        found.append(Strategy((Shard(0), R, R), (Shard(0),), local="grouped_mm_rows"))
    if cols > 1:
        found.append(Strategy((R, Shard(2), R), (Shard(1),)))
    if inner > 1:
        found.append(Strategy((Shard(1), Shard(1), R), (P,)))
    found.append(Strategy((P, R, R), (P,)))
    return found
