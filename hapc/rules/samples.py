"""Small helpers for writing rule samples: random tensors of awkward (non-divisible) sizes."""

from __future__ import annotations

import torch

_gen = torch.Generator().manual_seed(1234)


def T(*shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A random float tensor (normal) of ``shape``."""
    return torch.randn(shape, generator=_gen, dtype=dtype)


def Pos(*shape: int) -> torch.Tensor:
    """A random positive tensor (for log, sqrt, division)."""
    return torch.rand(shape, generator=_gen, dtype=torch.float64) + 0.5


def Ids(high: int, *shape: int) -> torch.Tensor:
    """Random integer ids in ``[0, high)``."""
    return torch.randint(0, high, shape, generator=_gen)


def B(*shape: int) -> torch.Tensor:
    """A random boolean mask."""
    return torch.rand(shape, generator=_gen) > 0.5
