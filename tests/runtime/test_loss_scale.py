"""fp16's dynamic loss scaling (hapc/runtime/loss_scale.py): GradScaler's grow/backoff/skip
rules, exact unscaling, and one verdict for every rank (the flag all-reduced with MAX)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hapc.runtime.loss_scale import LossScaler, unscale_and_check


def _param(*values: float) -> torch.Tensor:
    p = torch.zeros(len(values), requires_grad=True)
    p.grad = torch.tensor(values)
    return p


def test_defaults_are_grad_scalers():
    s = LossScaler()
    ref = torch.amp.GradScaler("cpu")
    assert (s.scale, s.growth_factor, s.backoff_factor, s.growth_interval) == (
        ref.get_scale(), ref.get_growth_factor(), ref.get_backoff_factor(), ref.get_growth_interval())


def test_clean_steps_unscale_exactly_and_grow_after_the_interval():
    s = LossScaler(init_scale=8.0, growth_interval=3)
    for step in range(1, 4):
        p = _param(8.0, -24.0)
        verdict = s.finish([p])
        assert not verdict.skipped and verdict.scale == 8.0
        assert torch.equal(p.grad, torch.tensor([1.0, -3.0]))        # divided by the scale, exactly
    assert s.scale == 16.0 and s.growth_tracker == 0 and verdict.next_scale == 16.0


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_an_overflow_skips_the_step_backs_off_and_restarts_the_interval(bad):
    s = LossScaler(init_scale=1024.0, growth_interval=2)
    s.finish([_param(1.0)])                        # one clean step counted
    p, q = _param(1.0, bad), _param(2.0)
    verdict = s.finish([p, q])
    assert verdict.skipped and (verdict.scale, verdict.next_scale) == (1024.0, 512.0)
    assert p.grad is None and q.grad is None      # an optimizer stepped anyway changes nothing
    assert s.growth_tracker == 0
    assert "skipped: inf/nan gradients, loss scale 1024 -> 512" in verdict.message(3)
    s.finish([_param(1.0)])
    assert s.scale == 512.0                        # the interval starts again after a skip
    s.finish([_param(1.0)])
    assert s.scale == 1024.0


def test_disabled_scaler_is_a_no_op():
    s = LossScaler(enabled=False)
    loss = torch.tensor(3.0)
    assert s.scale_loss(loss) is loss
    p = _param(float("inf"))
    verdict = s.finish([p])                         # fp32/bf16 programs: nothing checked, nothing skipped
    assert not verdict.skipped and torch.isinf(p.grad).all() and s.scale == 1.0


def test_scale_loss_and_state_round_trip():
    s = LossScaler(init_scale=4.0)
    assert s.scale_loss(torch.tensor(1.5)).item() == 6.0
    s.finish([_param(float("nan"))])
    state = s.state_dict()
    t = LossScaler()
    t.load_state_dict(state)
    assert (t.scale, t.growth_tracker) == (2.0, 0)
    t.load_state_dict({"scale": 0.0, "growth_tracker": 0})     # a checkpoint without loss scaling
    assert t.scale == 2.0


def test_unscale_and_check_flags_any_nonfinite_value():
    grads = [torch.tensor([2.0, 4.0]), torch.tensor([[6.0]])]
    assert unscale_and_check(grads, 0.5, "cpu").item() == 0.0
    assert torch.equal(grads[0], torch.tensor([1.0, 2.0])) and grads[1].item() == 3.0
    assert unscale_and_check([torch.tensor([1.0]), torch.tensor([float("nan")])], 1.0, "cpu").item() == 1.0
    assert unscale_and_check([], 1.0, "cpu").item() == 0.0


class _FakeWorld:
    """Three ranks stepping in lockstep in one process: all_reduce(MAX) sees every rank's flag."""

    def __init__(self, flags_of_others: list[float]) -> None:
        self.others, self.calls = flags_of_others, 0

    def all_reduce(self, tensor, op=None, group=None):
        assert op == dist.ReduceOp.MAX
        self.calls += 1
        tensor.copy_(torch.maximum(tensor, torch.tensor(max(self.others), dtype=tensor.dtype)))


def _fake(monkeypatch, others: list[float]) -> _FakeWorld:
    world = _FakeWorld(others)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1 + len(others))
    monkeypatch.setattr(dist, "all_reduce", world.all_reduce)
    return world


def test_a_rank_with_finite_gradients_skips_when_another_rank_overflowed(monkeypatch):
    """The point of the all-reduce: rank 0's pieces are finite, rank 2's are not; rank 0 must
    skip and back off too, or the replicas and the scales part ways."""
    world = _fake(monkeypatch, [0.0, 1.0])
    s = LossScaler(init_scale=256.0)
    p = _param(256.0)
    verdict = s.finish([p])
    assert world.calls == 1 and verdict.skipped and s.scale == 128.0 and p.grad is None


def test_every_rank_finite_steps(monkeypatch):
    world = _fake(monkeypatch, [0.0, 0.0])
    s = LossScaler(init_scale=256.0)
    p = _param(256.0)
    assert not s.finish([p]).skipped and world.calls == 1 and p.grad.item() == 1.0


def test_a_rank_holding_no_gradients_still_takes_part(monkeypatch):
    """An idle pipeline rank (no parameters) joins the all-reduce and follows the verdict."""
    world = _fake(monkeypatch, [1.0])
    s = LossScaler(init_scale=64.0)
    assert s.finish([]).skipped and world.calls == 1 and s.scale == 32.0
