"""The CPU memory meter (hapc/runtime/memory_meter.py, ``program.py --measure-memory``): each
storage counted once, from when an op makes it until it is freed, and the peak kept. The
emitted program's measured peak against the plan's prediction is tests/e2e/test_memory_measured.py
(slow)."""

from __future__ import annotations

import torch

from hapc.runtime.memory_meter import LiveBytes


def test_storages_are_counted_once_until_freed_and_the_peak_is_kept():
    meter = LiveBytes()
    with meter:
        a = torch.ones(1000)                  # 4000 bytes
        view = a[:10]                         # the same storage: not again
        b = a * 2                             # 4000 more
        assert meter.live == 8000
        del b
        assert meter.live == 4000
        c = torch.zeros(250)                  # 1000
    assert (meter.live, meter.peak) == (5000, 8000)
    del a, view, c
    assert meter.live == 0 and meter.peak == 8000


def test_a_training_step_holds_weights_gradients_moments_and_activations():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters())
    weights = sum(p.numel() * 4 for p in model.parameters())
    meter = LiveBytes()
    meter.add(p.data for p in model.parameters())
    assert meter.live == weights
    x = torch.randn(32, 64)
    with meter:
        for _ in range(2):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert meter.live >= 3 * weights                        # weights and two moments stay
    assert meter.peak >= 4 * weights + 32 * 256 * 4          # and, at some point, gradients and activations
