"""Refusals of in-place writes name the op that writes and the line of the write (the line to
change), not only the view it writes through."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hapc.errors import UserError
from hapc.frontend.tracer import trace


class _WritesThroughView(nn.Module):
    """Writes in place into an ``unfold`` view, whose write-back hapc does not know."""

    def __init__(self, write: str):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.write = write

    def forward(self, x):
        h = self.lin(x).clone()
        w = h.unfold(1, 2, 2)
        y = w * 2
        if self.write == "mul_":
            w.mul_(2)
        else:
            w.detach_()
        return h.sum() + y.sum()


def _line(marker: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(_WritesThroughView)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def test_a_write_through_a_view_names_the_in_place_op_and_its_line():
    with pytest.raises(UserError) as err:
        trace(_WritesThroughView("mul_"), (torch.randn(4, 8), ))
    msg = str(err.value)
    assert msg.startswith(f"the in-place aten.mul_.Tensor at {__file__}:{_line('w.mul_(2)')} (w.mul_(2)) "
                          "writes into a view made by aten.unfold.default"), msg
    assert f"aten.unfold.default at {__file__}:{_line('h.unfold')}" in msg, msg


def test_an_in_place_detach_of_a_view_names_its_line():
    """torch.export itself refuses ``detach_`` on a view, without the user's line: hapc adds it."""
    with pytest.raises(UserError) as err:
        trace(_WritesThroughView("detach_"), (torch.randn(4, 8), ))
    msg = str(err.value)
    assert "detach" in msg and f"(at test_refusals.py:{_line('w.detach_()')}: w.detach_()" in msg, msg
