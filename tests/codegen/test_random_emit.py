"""Emitting programs with random ops: each draws through hapc_random_ops (R), and a pipelined
program, whose per-micro-batch draws --verify's one-device reference cannot replay, says so."""

from __future__ import annotations

import torch

import hapc
from hapc.codegen.pipeline_emit import uses_dropout


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
    assert uses_dropout(hapc.trace(_Noisy(True), (x,)).graph)
    assert not uses_dropout(hapc.trace(_Noisy(False), (x,)).graph)
