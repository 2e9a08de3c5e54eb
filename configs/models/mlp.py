"""A small multi-layer perceptron classifier: the demo's smallest model.

Dense layers with ReLU between them and a cross-entropy loss over ``classes`` labels. It is
the quickest model to trace, plan and run, so the demo and the first end-to-end tests use it;
every op in it (linear, relu, cross-entropy) is one the planner must handle for larger models.

Model-file contract (design.md section 3): ``model(**cfg)`` returns a module whose
``forward(x, labels)`` returns the scalar loss; ``inputs(**cfg)`` returns ``(x, labels)``
for one global batch. Both take the same keyword arguments.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

# Tiny sizes for tests and the CPU demo; chosen not to divide by 3 so uneven shards are exercised.
SMALL = {"layers": 3, "features": 20, "hidden": 64, "classes": 7, "batch": 5}


class MLP(nn.Module):
    def __init__(self, layers: int, features: int, hidden: int, classes: int):
        super().__init__()
        widths = [features] + [hidden] * (layers - 1) + [classes]
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        for i, linear in enumerate(self.linears):
            x = linear(x)
            if i < len(self.linears) - 1:
                x = F.relu(x)
        return F.cross_entropy(x, labels)


def model(layers: int = 4, features: int = 1024, hidden: int = 4096, classes: int = 1000,
          batch: int = 64) -> nn.Module:
    """``layers`` linear layers (``layers - 1`` hidden ones of width ``hidden``)."""
    return MLP(layers, features, hidden, classes)


def inputs(layers: int = 4, features: int = 1024, hidden: int = 4096, classes: int = 1000,
           batch: int = 64, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features and labels from a fixed generator, so every rank builds the same batch."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, features, generator=gen)
    labels = torch.randint(0, classes, (batch,), generator=gen)
    return x, labels
