"""Random ops as the tracer records them: in-place draws become their functional twins (there
is no ``normal.default`` nor ``bernoulli.float``), and no random result needs a gradient."""

from __future__ import annotations

import torch

import hapc


class _Draws(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        a = torch.empty_like(h).normal_(0.0, 2.0)
        b = h.new_empty(4, 1).bernoulli_()           # timm's drop path, default p
        c = torch.zeros_like(h).uniform_(-1, 1)
        d = torch.bernoulli(torch.sigmoid(h))        # p needs a gradient; the draw has none
        return (h * (a + b + c + d + torch.rand_like(h))).sum()


def test_in_place_draws_become_functional_twins_without_gradients():
    graph = hapc.trace(_Draws(), (torch.randn(4, 5),)).graph
    ops = {n.op: n for n in graph.nodes}
    assert "aten.normal_.default" not in ops and "aten.bernoulli_.float" not in ops
    assert ops["aten.normal_functional.default"].args[1:] == (0.0, 2.0)
    assert ops["aten.bernoulli.p"].args[1:] == (0.5,)
    assert "aten.uniform.default" in ops and "aten.bernoulli.default" in ops
    for op in ("aten.normal_functional.default", "aten.bernoulli.p", "aten.uniform.default",
               "aten.bernoulli.default", "aten.rand_like.default"):
        assert not graph.values[ops[op].outputs[0]].requires_grad, op
    assert not graph.unsupported.keys() - {"aten.empty_like.default", "aten.new_empty.default"}
