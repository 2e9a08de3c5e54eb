"""Random ops drawn from the counter-based generator (hapc.runtime.random_ops).

Any rank's piece must be exactly the slice of the node's global draw, for any shares and any
dimension; the same call must give the same numbers; the numbers must have the op's
distribution; and ``--verify``'s reference (ReplayDraws) must replay the global draw when a
module calls torch's own functions eagerly.
"""

from __future__ import annotations

import random

import pytest
import torch

from hapc.runtime.local_ops import RankCtx, ShardInfo
from hapc.runtime.random_ops import (ELEMENTWISE, RANDOM_OP_NAMES, RANDOM_OPS, WHOLE, ReplayDraws, draw,
                                     random_piece, unit_uniform)

SHAPE = (6, 50, 33)
_gen = torch.Generator().manual_seed(3)
P = torch.rand(SHAPE, generator=_gen, dtype=torch.float64)           # probabilities
MEAN = torch.randn(SHAPE, generator=_gen)
STD = torch.rand(SHAPE, generator=_gen) + 0.5
X = torch.randn(SHAPE, generator=_gen)

# Every elementwise op with arguments over SHAPE; tensors among them are cut like the output.
CALLS = {
    "aten.rand.default": ((list(SHAPE),), {}),
    "aten.rand_like.default": ((X,), {}),
    "aten.randn.default": ((list(SHAPE),), {"dtype": torch.float64}),
    "aten.randn_like.default": ((X,), {}),
    "aten.randint.default": ((10, list(SHAPE)), {}),
    "aten.randint.low": ((-5, 3, list(SHAPE)), {}),
    "aten.randint_like.default": ((X, 7), {}),
    "aten.randint_like.low_dtype": ((X, 2, 2 ** 40), {"dtype": torch.int64}),
    "aten.bernoulli.default": ((P,), {}),
    "aten.bernoulli.p": ((X, 0.3), {}),
    "aten.bernoulli.Tensor": ((X, P), {}),
    "aten.normal_functional.default": ((X, 1.0, 2.0), {}),
    "aten.normal.float_float": ((1.0, 2.0, list(SHAPE)), {}),
    "aten.normal.Tensor_float": ((MEAN, 0.5), {}),
    "aten.normal.float_Tensor": ((1.0, STD), {}),
    "aten.normal.Tensor_Tensor": ((MEAN, STD), {}),
    "aten.uniform.default": ((X, -1.0, 3.0), {}),
    "aten.exponential.default": ((X, 2.0), {}),
}


def test_every_random_op_is_listed_once_and_drawn():
    assert set(RANDOM_OP_NAMES) == set(ELEMENTWISE) | set(WHOLE) == RANDOM_OPS
    assert len(RANDOM_OP_NAMES) == len(RANDOM_OPS) and not set(ELEMENTWISE) & set(WHOLE)
    assert set(CALLS) == set(ELEMENTWISE)


def _piece_args(args, piece: ShardInfo):
    return tuple(a.narrow(piece.dim, piece.offset, piece.length) if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("op", sorted(CALLS))
def test_every_piece_is_the_slice_of_the_global_draw_for_random_shares(op):
    args, kwargs = CALLS[op]
    whole = draw(op, "node_7", 11, SHAPE, None, args, kwargs)
    assert tuple(whole.shape) == SHAPE
    rng = random.Random(op)
    for _ in range(3):
        dim = rng.randrange(len(SHAPE))
        size = SHAPE[dim]
        cuts = sorted({0, size, *(rng.randrange(size + 1) for _ in range(rng.randrange(1, 4)))})
        pieces = [ShardInfo(dim, a, b - a, size) for a, b in zip(cuts, cuts[1:])]
        got = [draw(op, "node_7", 11, SHAPE, p, _piece_args(args, p), kwargs) for p in pieces]
        assert torch.equal(torch.cat(got, dim), whole), (dim, cuts)


def test_the_local_op_draws_its_rank_piece_from_the_context():
    piece = ShardInfo(1, 17, 20, 50)
    ctx = RankCtx(1, 3, "rand_2", "aten.rand.default", (), (piece,), (SHAPE,), seed=4)
    whole = draw("aten.rand.default", "rand_2", 4, SHAPE, None, (list(SHAPE),), {})
    assert torch.equal(random_piece(ctx, list(SHAPE)), whole.narrow(1, 17, 20))


def test_draws_repeat_and_differ_between_nodes_and_steps():
    one = draw("aten.rand.default", "n", 0, SHAPE, None, (list(SHAPE),), {})
    assert torch.equal(one, draw("aten.rand.default", "n", 0, SHAPE, None, (list(SHAPE),), {}))
    for other in (draw("aten.rand.default", "m", 0, SHAPE, None, (), {}),
                  draw("aten.rand.default", "n", 1, SHAPE, None, (), {})):
        assert (one == other).float().mean().item() < 1e-3
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    draw("aten.randn.default", "n", 0, SHAPE, None, (), {})
    assert torch.equal(torch.rand(3), before)      # torch's generator is not touched


def test_uniforms_are_exact_in_their_dtype_and_below_one():
    top = torch.tensor([2 ** 32 - 1, 0, 2 ** 31])
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        u = unit_uniform(top, dtype)
        assert u.dtype == dtype and u[0].item() < 1.0 and u[1].item() == 0.0 and u[2].item() == 0.5


N = (100_000,)


def _sample(op, args, kwargs=None):
    return draw(op, "stats", 5, N if op not in WHOLE else args[-1], None, args[:-1] if op in WHOLE else args,
                kwargs or {})


def test_uniform_normal_and_exponential_have_their_moments():
    u = draw("aten.rand.default", "u", 5, N, None, (list(N),), {"dtype": torch.float64})
    assert abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    assert u.min().item() >= 0.0 and u.max().item() < 1.0
    z = draw("aten.randn.default", "z", 5, N, None, (list(N),), {"dtype": torch.float64})
    assert abs(z.mean().item()) < 0.015 and abs(z.var().item() - 1.0) < 0.02
    assert abs((z.abs() < 1).double().mean().item() - 0.6827) < 0.005       # the bell's shape, not just moments
    x = torch.zeros(N)
    g = draw("aten.normal_functional.default", "g", 5, N, None, (x, 3.0, 2.0), {})
    assert abs(g.mean().item() - 3.0) < 0.03 and abs(g.std().item() - 2.0) < 0.03
    e = draw("aten.exponential.default", "e", 5, N, None, (x, 4.0), {})
    assert e.min().item() >= 0 and abs(e.mean().item() - 0.25) < 0.005 and abs(e.var().item() - 1 / 16) < 0.003
    a = draw("aten.uniform.default", "a", 5, N, None, (x, -2.0, 6.0), {})
    assert a.min().item() >= -2.0 and a.max().item() <= 6.0 and abs(a.mean().item() - 2.0) < 0.05


def test_bernoulli_keeps_its_rate_and_randint_its_range():
    x = torch.zeros(N)
    for p in (0.1, 0.5, 0.9):
        b = draw("aten.bernoulli.p", "b", 5, N, None, (x, p), {})
        assert b.dtype == x.dtype and set(b.unique().tolist()) <= {0.0, 1.0}
        assert abs(b.mean().item() - p) < 0.005
    probs = torch.linspace(0, 1, N[0], dtype=torch.float64)
    t = draw("aten.bernoulli.default", "t", 5, N, None, (probs,), {})
    assert t[probs == 0].sum() == 0 and t[probs == 1].all() and abs(t.mean().item() - 0.5) < 0.005
    r = draw("aten.randint.low", "r", 5, N, None, (-3, 4, list(N)), {})
    assert r.dtype == torch.int64 and r.min().item() == -3 and r.max().item() == 3
    assert (torch.bincount(r + 3).double() / N[0] - 1 / 7).abs().max().item() < 0.006
    big = draw("aten.randint.default", "big", 5, N, None, (3 * 2 ** 40, list(N)), {})
    assert big.min().item() >= 0 and big.max().item() < 3 * 2 ** 40 and big.max().item() > 2 ** 41


def test_randperm_is_a_permutation_and_multinomial_follows_its_weights():
    perm = draw("aten.randperm.default", "perm", 5, (1000,), None, (1000,), {})
    assert torch.equal(perm.sort().values, torch.arange(1000)) and not torch.equal(perm, torch.arange(1000))
    w = torch.tensor([1.0, 0.0, 3.0, 6.0])
    picks = draw("aten.multinomial.default", "mw", 5, N, None, (w, N[0], True), {})
    assert (torch.bincount(picks, minlength=4).double() / N[0] - w / w.sum()).abs().max().item() < 0.006
    rows = torch.tensor([[1.0, 0.0, 3.0, 6.0]]).repeat(20_000, 1)
    firsts = draw("aten.multinomial.default", "mo", 5, (20_000, 3), None, (rows, 3, False), {})
    assert all(len(set(r)) == 3 and 1 not in r for r in firsts.tolist())           # distinct, never weight 0
    freq = torch.bincount(firsts[:, 0], minlength=4).double() / 20_000
    assert (freq - w / w.sum()).abs().max().item() < 0.015                          # the first pick follows w


def test_the_reference_replays_every_draw_the_program_made():
    """A module calling torch's functions eagerly, under ReplayDraws, gets the global draws of
    the program's random nodes in order; in-place forms and dropout's own draws included."""
    def module(x: torch.Tensor) -> list[torch.Tensor]:
        with replay.paused():           # as skeleton_main's dropout patch does
            dropped = torch.nn.functional.dropout(x, 0.5)
        return [torch.rand(4, 5), torch.randn_like(x), x.new_empty(4, 1).bernoulli_(0.3),
                torch.empty(4, 5).normal_(1.0, 2.0), dropped, torch.randint(0, 9, (4, 5)), torch.randperm(7)]

    ran = [("aten.rand.default", "rand"), ("aten.linear.default", "not_random"),
           ("aten.randn_like.default", "randn_like"), ("aten.bernoulli.p", "bernoulli_"),
           ("aten.normal_functional.default", "normal_"), ("aten.dropout.default", "dropout"),
           ("aten.randint.low", "randint"), ("aten.randperm.default", "randperm")]
    x = torch.randn(4, 5)
    replay = ReplayDraws(9, ran)
    with replay:
        rand, randn, bern, normal, _, randint, perm = module(x)
    want = {
        "rand": draw("aten.rand.default", "rand", 9, (4, 5), None, ([4, 5],), {}),
        "randn": draw("aten.randn_like.default", "randn_like", 9, (4, 5), None, (x,), {}),
        "bern": draw("aten.bernoulli.p", "bernoulli_", 9, (4, 1), None, (torch.empty(4, 1), 0.3), {}),
        "normal": draw("aten.normal_functional.default", "normal_", 9, (4, 5), None, (x, 1.0, 2.0), {}),
        "randint": draw("aten.randint.low", "randint", 9, (4, 5), None, (0, 9, [4, 5]), {}),
        "perm": draw("aten.randperm.default", "randperm", 9, (7,), None, (7,), {}),
    }
    for name, got in zip(want, (rand, randn, bern, normal, randint, perm)):
        assert torch.equal(got, want[name]), name
    # Paused (inside the dropout patch), calls keep torch's own draws and take no node.
    replay = ReplayDraws(9, [("aten.rand.default", "rand")])
    with replay:
        with replay.paused():
            torch.rand(4, 5)
        again = torch.rand(4, 5)
    assert torch.equal(again, want["rand"])


def test_a_call_of_another_kind_than_the_node_keeps_torch_draw_and_the_node_waits():
    with ReplayDraws(0, [("aten.randn.default", "randn")]):
        stray = torch.rand(50)                   # a draw the program has no node for
        got = torch.randn(50)
    assert not torch.equal(stray, draw("aten.rand.default", "randn", 0, (50,), None, (), {}))
    assert torch.equal(got, draw("aten.randn.default", "randn", 0, (50,), None, (), {}))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("op", sorted(CALLS))
def test_cuda_draws_what_the_cpu_draws(op):
    args, kwargs = CALLS[op]
    piece = ShardInfo(2, 4, 20, 33)
    cpu = draw(op, "n", 3, SHAPE, piece, _piece_args(args, piece), kwargs)
    on_gpu = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in _piece_args(args, piece))
    cuda = draw(op, "n", 3, SHAPE, piece, on_gpu, {**kwargs, "device": "cuda"}).cpu()
    if cpu.is_floating_point() and op not in ("aten.rand.default", "aten.rand_like.default", "aten.uniform.default"):
        assert torch.allclose(cuda, cpu, rtol=1e-6, atol=0)     # log/cos of float64 may differ by an ulp
    else:
        assert torch.equal(cuda, cpu)


@pytest.mark.parametrize("shape, dim, count, piece", [
    ((8, 5), 0, 4, None), ((6, 4, 3), 0, 2, (2, 1, 2)), ((6, 4, 3), 1, 2, (0, 2, 1)), ((2, 9, 4), 1, 3, (1, 1, 2)),
])
def test_a_micro_batch_draws_its_rows_of_the_whole_batchs_draw(shape, dim, count, piece):
    """A pipeline's micro-batch ``i`` (its local piece along ``piece`` = (dim, offset, length),
    or whole) draws exactly those elements of the whole batch's draw: what --verify replays."""
    from hapc.runtime.local_ops import ShardInfo
    from hapc.runtime.random_ops import hashed_bits, micro_batch_view

    rows = shape[dim] // count
    micro = tuple(rows if d == dim else n for d, n in enumerate(shape))
    whole_draw = hashed_bits("node", 11, shape)
    for i in range(count):
        info = None if piece is None else ShardInfo(piece[0], piece[1], piece[2], micro[piece[0]])
        whole, moved = micro_batch_view(micro, info, dim, i, count, ShardInfo)
        assert whole == tuple(shape)
        expected = whole_draw.narrow(dim, i * rows, rows)
        if info is not None:
            expected = expected.narrow(info.dim, info.offset, info.length)
        assert torch.equal(hashed_bits("node", 11, whole, moved), expected)
