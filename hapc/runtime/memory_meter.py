"""A rank's peak tensor memory on CPU (``program.py --measure-memory``).

On a GPU the caching allocator keeps the peak (``torch.cuda.max_memory_allocated``); on CPU
nothing does, and the plan's predicted peak per device is the figure a memory model must be
held against (one that under-predicts turns a plan that "fits" into an out-of-memory crash).
:class:`LiveBytes` counts it the allocator's way: every tensor storage that exists, once,
from when an op makes it until Python frees it. The parameters, buffers and inputs made before
are added by hand; everything the step makes (activations, gradients, the collectives'
buffers, the optimizer's state and its temporaries) passes through the dispatcher, which a
``TorchDispatchMode`` sees, backward included (CPU autograd runs on the calling thread).

What it counts is the tensors' bytes, not the process's: no allocator rounding, no Python
objects, no gloo's own buffers. It slows each op by a Python call, so it is off unless asked.

This module depends on torch only: code generation copies it beside emitted programs.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages alive, and their peak, while the mode is on (and of those
    added with :meth:`add`)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._alive: dict[int, weakref.ref] = {}

    def add(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count ``tensors``' storages (each once) from now until they are freed."""
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._count(t.untyped_storage())

    def _count(self, storage: Any) -> None:
        key = id(storage)
        if key in self._alive:
            return
        nbytes = storage.nbytes()

        def freed(_: weakref.ref, key: int = key, nbytes: int = nbytes) -> None:
            if self._alive.pop(key, None) is not None:
                self.live -= nbytes

        self._alive[key] = weakref.ref(storage, freed)
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.add(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        return out
