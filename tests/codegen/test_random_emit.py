"""Emitting programs with random ops: each draws through hapc_random_ops (R); a pipelined program
lists its drawing nodes in graph order (what --verify's reference replays, once each) and, per
stage, the batch dimension of each drawing node's output (where a micro-batch's rows of the whole
batch's draw lie)."""

from __future__ import annotations

import torch

import hapc
from hapc.codegen.pipeline_emit import drawing_nodes, micro_batch_dims


class _Noisy(torch.nn.Module):
    def __init__(self, draw: bool):
        super().__init__()
        self.lin, self.draw = torch.nn.Linear(4, 4), draw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if self.draw:
            h = h * (torch.rand(x.shape[0], 1) < 0.8).float()
        return h.sum()


def test_a_random_op_counts_as_dropout_for_pipelined_verify():
    x = torch.randn(6, 4)
    assert drawing_nodes(hapc.trace(_Noisy(True), (x,)).graph)
    assert not drawing_nodes(hapc.trace(_Noisy(False), (x,)).graph)


class _Drawing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.shared = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.dropout(self.lin(x), 0.2, True)
        noise = torch.rand(4)                                   # the same for every sample
        keep = (torch.rand(x.shape[0], 1) < 0.8).float()        # one draw per sample
        return (h * keep + noise).sum() + torch.nn.functional.dropout(x, 0.0, True).sum()


def test_drawing_nodes_and_where_each_holds_the_batch():
    whole = hapc.trace(_Drawing(), (torch.randn(6, 4),)).graph
    micro = hapc.trace(_Drawing(), (torch.randn(3, 4),)).graph
    drawn = drawing_nodes(whole)
    # The dropout of p = 0 draws nothing but is listed: the reference counts every F.dropout call.
    assert [op for op, _ in drawn] == ["aten.dropout.default", "aten.rand.default", "aten.rand.default",
                                       "aten.dropout.default"]
    dims = micro_batch_dims(whole, micro, 2)
    names = [name for _, name in drawn]
    assert dims == {names[0]: 0, names[2]: 0, names[3]: 0}  # the shared noise is drawn whole each time
