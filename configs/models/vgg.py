"""VGG19 for 32x32 images (CIFAR-10 style): the convolutional model of the HAP benchmarks.

Sixteen 3x3 convolutions with ReLU in five stages separated by 2x2 max-pooling, as in the
original VGG19 (no BatchNorm), then a classifier of three linear layers over the 1x1x512
map left after the fifth pool. ``width`` scales every channel count (``width=1`` is the
standard 64..512 network, 20.6M parameters with this classifier); the tiny test config uses
``width=0.1`` so channel counts (6, 13, 26, 51) do not divide evenly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Tiny sizes for tests and the CPU demo.
SMALL = {"width": 0.1, "image": 32, "classes": 7, "batch": 5}

# Channels of each 3x3 convolution; "M" is a 2x2 max-pool.
VGG19 = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
         512, 512, 512, 512, "M"]


class VGG(nn.Module):
    def __init__(self, width: float, image: int, classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in VGG19:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                out = max(1, round(item * width))
                layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU()]
                channels = out
        self.features = nn.Sequential(*layers)
        side = image // 32                       # five halvings
        if side < 1:
            raise ValueError(f"image={image} is too small for five 2x2 pools (needs >= 32)")
        fc = max(1, round(512 * width))
        self.classifier = nn.Sequential(
            nn.Linear(channels * side * side, fc), nn.ReLU(),
            nn.Linear(fc, fc), nn.ReLU(),
            nn.Linear(fc, classes))

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.features(images).flatten(1)
        return F.cross_entropy(self.classifier(x), labels)


def model(width: float = 1.0, image: int = 32, classes: int = 10, batch: int = 64) -> nn.Module:
    return VGG(width, image, classes)


def inputs(width: float = 1.0, image: int = 32, classes: int = 10, batch: int = 64,
           **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images and labels from a fixed generator (every rank builds the same batch)."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, image, image, generator=gen)
    labels = torch.randint(0, classes, (batch,), generator=gen)
    return images, labels
