"""A model that draws random numbers inside forward, as ViT-MAE and SegFormer do.

* MAE-style random masking: ``noise = torch.rand(B, L)``, the patches kept are the first
  ``keep`` of ``noise.argsort(dim=1)``, gathered;
* drop path (stochastic depth): ``x * (torch.rand(B, 1, 1) < keep).float() / keep``;
* timm's drop path, ``x.new_empty(B, 1, 1).bernoulli_(keep)``;
* ``randn_like`` noise on the features and a Bernoulli mask over their shape: these follow the
  batch-sharded activations, so a data-parallel plan draws them piece by piece.

Every draw must be the same on each rank as on one device, whatever piece a rank holds.
"""

import torch
from torch import nn

SMALL = {"batch": 7, "patches": 11, "dim": 12, "classes": 5}


class Net(nn.Module):
    def __init__(self, patches: int, dim: int, classes: int):
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        self.block = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)
        self.keep_patches = (patches * 2) // 3
        self.keep_path = 0.7

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        h = self.embed(x)
        noise = torch.rand(b, length)                                   # MAE's random masking
        ids = noise.argsort(dim=1)[:, :self.keep_patches]
        h = torch.gather(h, 1, ids.unsqueeze(-1).expand(-1, -1, d))
        h = h + 0.01 * torch.randn_like(h)
        drop = (torch.rand(b, 1, 1) < self.keep_path).float() / self.keep_path   # drop path
        h = h + self.block(torch.relu(h)) * drop
        timm = h.new_empty(b, 1, 1).bernoulli_(self.keep_path) / self.keep_path   # timm's drop path
        h = h + self.block(h) * timm
        h = h * torch.bernoulli(torch.full_like(h[..., :1], 0.9))
        return nn.functional.cross_entropy(self.head(h.mean(dim=1)), labels)


def model(batch: int = 7, patches: int = 11, dim: int = 12, classes: int = 5) -> nn.Module:
    return Net(patches, dim, classes)


def inputs(batch: int = 7, patches: int = 11, dim: int = 12, classes: int = 5, **_: object):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(batch, patches, dim, generator=gen), torch.randint(0, classes, (batch,), generator=gen)
