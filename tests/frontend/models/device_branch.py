"""A model whose forward branches on the device type: doubled on a GPU, shifted by one
elsewhere (both differentiable, both visible to a trace). A plan must hold the branch of the
device its program runs on (issue 24)."""

import torch


class DeviceBranch(torch.nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if h.device.type == "cuda":
            h = h * 2
        else:
            h = h + 1
        return torch.nn.functional.mse_loss(self.out(torch.tanh(h)), y)


def model(width: int = 16):
    return DeviceBranch(width)


def inputs(width: int = 16, batch: int = 12):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(batch, width, generator=gen), torch.randn(batch, 1, generator=gen)
