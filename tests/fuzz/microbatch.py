"""The micro-batching property, case by case: whatever :func:`synth.microbatching.loss_split`
accepts, running the batch as micro-batches and weighing their losses and gradients as it says
gives the whole batch's loss and gradients (in float64); what it refuses is refused in one line
naming an op. Never a silent difference."""

from __future__ import annotations

import torch

from hapc.frontend.tracer import trace
from synth.microbatching import COUNT, MEAN, SUM, MicroBatchingRefused, loss_split
from tests.fuzz.models import ModelSpec

COUPLED_HEADS = ("contrastive",)


def check_microbatching(spec: ModelSpec) -> str:
    """Check one case; returns what happened (``"refused"`` or the split's kind), for the
    fuzzer's statistics."""
    model, inputs = spec.build()
    m = next((d for d in range(2, spec.batch + 1) if spec.batch % d == 0), 1)
    if m == 1:
        return "one sample"
    graph = trace(model, inputs).graph
    try:
        split = loss_split(graph)
    except MicroBatchingRefused as exc:
        message = str(exc)
        assert "\n" not in message and ("aten." in message or "different counts" in message), message
        return "refused"
    assert spec.head not in COUPLED_HEADS, f"{spec.head} couples samples, yet micro-batching was accepted"
    model = model.double()
    inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    whole_loss, whole_grads = _loss_and_grads(model, inputs)
    rows = spec.batch // m
    slices = [tuple(x[k * rows:(k + 1) * rows] for x in inputs) for k in range(m)]
    if split.kind == COUNT:
        counts = [float((piece[-1] != -100).sum()) for piece in slices]       # the heads' targets are y
        if not sum(counts):          # nothing counted in the whole batch: its mean is 0/0 on one device too
            assert torch.isnan(whole_loss)
            return "nothing counted"
        weights = [c / sum(counts) for c in counts]
    else:
        weights = [1.0 / m if split.kind == MEAN else 1.0] * m
        assert split.kind in (MEAN, SUM)
    total = torch.zeros((), dtype=torch.float64)
    grads = {name: torch.zeros_like(p) for name, p in model.named_parameters() if p.requires_grad}
    for piece, weight in zip(slices, weights):
        if weight == 0:
            continue                # nothing counted: adds nothing (its mean is 0/0)
        loss, g = _loss_and_grads(model, piece)
        total += weight * loss
        for name in grads:
            grads[name] += weight * g[name]
    assert torch.allclose(total, whole_loss, rtol=1e-9, atol=1e-12), (split, float(total), float(whole_loss))
    for name, g in grads.items():
        assert torch.allclose(g, whole_grads[name], rtol=1e-7, atol=1e-10), (split, name)
    return split.kind


def _loss_and_grads(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]):
    model.zero_grad(set_to_none=True)
    loss = model(*inputs)
    loss.backward()
    return loss.detach(), {name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                           for name, p in model.named_parameters() if p.requires_grad}
