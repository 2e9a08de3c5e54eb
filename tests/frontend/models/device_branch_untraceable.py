"""A model whose CPU branch cannot be traced (it decides on a value's data): a plan for a CPU
cluster is refused in one line naming that line (issue 24)."""

import torch


class Untraceable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if h.device.type != "cuda":
            if h.sum() > 0:                        # data-dependent: no trace can decide it
                h = h * 3
        return h.square().mean()


def model():
    return Untraceable()


def inputs():
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),)
