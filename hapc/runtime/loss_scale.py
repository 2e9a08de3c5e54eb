"""Dynamic loss scaling for fp16 programs, with one decision for every rank.

Under fp16 autocast, activation gradients smaller than fp16's smallest subnormal (6e-8) become
zero. The program multiplies the loss by a large scale before backward, so those gradients stay
representable, and divides the float32 gradients by it afterwards. A scale too large overflows
some gradient to inf (or NaN); that step is skipped and the scale halved; after
``growth_interval`` clean steps in a row the scale doubles. These are the semantics, and the
defaults, of ``torch.amp.GradScaler`` (initial scale 2**16, growth factor 2, backoff 0.5,
growth interval 2000).

**Why not GradScaler itself.** GradScaler looks for inf/NaN in the gradients of the optimizer
it is given, on this rank only. Here a rank holds only its pieces of sharded parameters (and a
pipeline stage only its stage's), so one rank can overflow where another does not: each would
decide alone, the replicas would part ways, and the scales too. (FSDP's ShardedGradScaler
all-reduces its flag for that reason, but is tied to FSDP's optimizer wrapping.) This scaler
all-reduces its found-inf flag over the whole world (every stage, idle ranks included), so
every rank skips or steps together and every rank's scale stays the same number.

**Where it acts.** The trainer back-propagates ``loss * scale``; the gradient all-reduce then
sums scaled float32 gradients (float32's range holds them); :meth:`LossScaler.finish` unscales
the *synchronised* gradients (a multiplication by a power of two: exact), checks them, agrees
on the verdict and updates the scale. Any clipping must come after it (the programs hapc emits
clip nothing). A skipped step leaves every gradient ``None``, so an optimizer stepped anyway
changes nothing.

This module depends on torch only: code generation copies it beside emitted programs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class StepVerdict:
    """What :meth:`LossScaler.finish` decided for one step."""

    skipped: bool              # some rank found an inf/NaN gradient: no optimizer step
    scale: float               # the scale this step's loss was multiplied by
    next_scale: float          # the scale of the next step

    def message(self, step: int) -> str:
        return (f"step {step} skipped: inf/nan gradients, loss scale {self.scale:g} -> {self.next_scale:g}")


class LossScaler:
    """GradScaler's dynamic loss scaling, agreed over the process group (see the module
    docstring). Disabled (``enabled=False``: fp32 and bf16 programs) it scales by 1 and finishes
    without looking at gradients or talking to other ranks."""

    def __init__(self, enabled: bool = True, *, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, device: Any = "cpu",
                 group: Any = None) -> None:
        if enabled and not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval > 0):
            raise ValueError("loss scaling wants init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                             f"growth_interval > 0; got {init_scale}, {growth_factor}, {backoff_factor}, "
                             f"{growth_interval}")
        self.enabled = enabled
        self.scale = float(init_scale) if enabled else 1.0
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.growth_tracker = 0            # clean steps in a row since the scale last changed
        self.device = torch.device(device)
        self.group = group                 # None: the default group (every rank)

    def before_first_step(self) -> StepVerdict:
        """A trainer's verdict before it has run a step: nothing skipped, the current scale."""
        return StepVerdict(False, self.scale, self.scale)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """What to back-propagate instead of ``loss``."""
        return loss * self.scale if self.enabled else loss

    def finish(self, params: Sequence[torch.Tensor]) -> StepVerdict:
        """After the gradients are synchronised: unscale this rank's gradients of ``params``,
        agree with every rank whether any is inf/NaN, then skip (gradients set to None, scale
        backed off) or keep (scale grown after ``growth_interval`` clean steps). Every rank of
        the group must call it once per step, in step."""
        scale = self.scale
        if not self.enabled:
            return StepVerdict(False, scale, scale)
        grads = [p.grad for p in params if p.grad is not None]
        found = unscale_and_check(grads, 1.0 / scale, self.device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(found, op=dist.ReduceOp.MAX, group=self.group)
        skipped = bool(found.item() > 0)
        if skipped:
            for p in params:
                p.grad = None
        self.update(skipped)
        return StepVerdict(skipped, scale, self.scale)

    def update(self, found_inf: bool) -> None:
        """GradScaler's rule: back off on inf/NaN, grow after ``growth_interval`` clean steps."""
        if found_inf:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.scale *= self.growth_factor
            self.growth_tracker = 0

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume a saved scale; a checkpoint without one (saved by an fp32 or bf16 program)
        leaves the initial scale."""
        if self.enabled and float(state.get("scale", 0.0)) > 0:
            self.scale = float(state["scale"])
            self.growth_tracker = int(state.get("growth_tracker", 0))


def unscale_and_check(grads: Sequence[torch.Tensor], inv_scale: float, device: Any) -> torch.Tensor:
    """Multiply ``grads`` in place by ``inv_scale``; returns a one-element float32 tensor on
    ``device``, 1.0 if any of them holds an inf or NaN (before or after), else 0.0."""
    found = torch.zeros(1, dtype=torch.float32, device=device)
    fused = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)   # GradScaler's kernel
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for g in grads:
        by_device.setdefault(g.device, []).append(g)
    for where, group in by_device.items():
        flag = torch.zeros(1, dtype=torch.float32, device=where)
        if fused is not None and all(g.dtype in (torch.float32, torch.float16, torch.bfloat16) for g in group):
            fused(group, flag, torch.full((1,), inv_scale, dtype=torch.float32, device=where))
        else:
            for g in group:
                g.mul_(inv_scale)
                flag = torch.maximum(flag, (~torch.isfinite(g)).any().float().reshape(1))
        found = torch.maximum(found, flag.to(device))
    return found


__all__ = ["LossScaler", "StepVerdict", "unscale_and_check"]
