"""Dropout masks drawn on the tensor's own device, for this rank's piece only.

The counter-based mask (hapc.runtime.random_ops.dropout_keep) must give every rank exactly
its slice of the global mask whatever the shares, keep about 1 - p of the elements, and
differ between nodes and steps; one rank alone uses torch's own device generator, and
``--verify`` replays whichever the program used.
"""

from __future__ import annotations

import pytest
import torch

from hapc.runtime.local_ops import RankCtx, ShardInfo
from hapc.runtime.random_ops import dropout, dropout_keep, global_indices

SHAPE = (6, 50, 33)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_every_uneven_piece_is_the_slice_of_the_global_mask(dim):
    full = dropout_keep("dropout_3", 7, SHAPE, 0.3)
    size = SHAPE[dim]
    cuts = [0, size // 5, size // 2 + 1, size]          # three uneven pieces
    pieces = [dropout_keep("dropout_3", 7, SHAPE, 0.3, ShardInfo(dim, a, b - a, size))
              for a, b in zip(cuts, cuts[1:])]
    assert torch.equal(torch.cat(pieces, dim), full)


def test_global_indices_are_row_major_positions():
    want = torch.arange(6 * 50 * 33).reshape(SHAPE).narrow(1, 11, 17)
    assert torch.equal(global_indices(SHAPE, ShardInfo(1, 11, 17, 50)), want)


def test_mask_keeps_one_minus_p_and_is_independent_across_nodes_and_steps():
    shape, p = (64, 1024), 0.1
    a = dropout_keep("n1", 0, shape, p)
    assert abs(a.float().mean().item() - (1 - p)) < 0.005
    same = p * p + (1 - p) ** 2                          # agreement of two independent masks
    for other in (dropout_keep("n2", 0, shape, p), dropout_keep("n1", 1, shape, p)):
        assert abs((a == other).float().mean().item() - same) < 0.01
    flat = a.flatten().float()
    assert abs(torch.corrcoef(torch.stack([flat[:-1], flat[1:]]))[0, 1].item()) < 0.01
    assert torch.equal(a, dropout_keep("n1", 0, shape, p))   # replayable


def test_rank_alone_runs_torch_dropout_under_the_node_seed_and_replays():
    from hapc.runtime.random_ops import seeded_rng

    x = torch.randn(SHAPE)
    alone = RankCtx(0, 1, "n1", "aten.dropout.default", (None,), (None,), (SHAPE,), seed=3, exact_pieces=False)
    got = dropout(alone, x, 0.2)
    with seeded_rng("n1", 3, x.device):
        assert torch.equal(got, torch.nn.functional.dropout(x, 0.2, True))   # what --verify replays
    assert torch.equal(got, dropout(alone, x, 0.2))
    assert not torch.equal(got, dropout(RankCtx(0, 1, "n1", "d", (None,), (None,), (SHAPE,), seed=4,
                                                exact_pieces=False), x, 0.2))
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    dropout(alone, x, 0.2)
    assert torch.equal(torch.rand(3), before)      # the caller's generator is left as it was


def test_local_dropout_scales_kept_elements_and_handles_edges():
    x = torch.randn(SHAPE)
    piece = ShardInfo(1, 20, 30, 50)
    ctx = RankCtx(1, 3, "n", "aten.dropout.default", (piece,), (piece,), (SHAPE,), seed=5)
    local = x.narrow(1, 20, 30)
    out = dropout(ctx, local, 0.25)
    keep = dropout_keep("n", 5, SHAPE, 0.25).narrow(1, 20, 30)
    assert torch.allclose(out, torch.where(keep, local / 0.75, torch.zeros(())))
    assert dropout(ctx, local, 0.0) is local and dropout(ctx, local, 0.5, False) is local
    assert torch.count_nonzero(dropout(ctx, local, 1.0)) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_draws_the_same_bits_as_the_cpu():
    piece = ShardInfo(2, 4, 20, 33)
    assert torch.equal(dropout_keep("n", 3, SHAPE, 0.1, piece, "cuda").cpu(), dropout_keep("n", 3, SHAPE, 0.1, piece))


# ---- attention dropout ---------------------------------------------------------------------------

def test_attention_written_out_is_sdpa_and_drops_the_given_weights():
    from hapc.runtime.random_ops import attention_with_dropout

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    everything = torch.ones(2, 3, 5, 5, dtype=torch.bool)
    for causal in (False, True):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        got = attention_with_dropout(q, k, v, None, 0.5, causal, None, False, everything) * 0.5
        assert torch.allclose(got, want, atol=1e-6)
    # A query shard (rows 2..4) with its causal offset is those rows of the whole.
    whole = attention_with_dropout(q, k, v, None, 0.3, True, None, False, everything)
    part = attention_with_dropout(q[:, :, 2:], k, v, None, 0.3, True, None, False, everything[:, :, 2:], 2)
    assert torch.allclose(part, whole[:, :, 2:], atol=1e-6)
    # Dropping every weight of query 0 zeroes its output.
    keep = everything.clone()
    keep[:, :, 0] = False
    assert torch.count_nonzero(attention_with_dropout(q, k, v, None, 0.3, False, None, False, keep)[:, :, 0]) == 0


def test_one_rank_attention_dropout_replays_under_the_node_seed():
    from hapc.runtime.random_ops import seeded_rng

    q = torch.randn(2, 3, 6, 4, requires_grad=True)
    outs = []
    for _ in range(2):
        with seeded_rng("attn", 4, q.device):
            outs.append(torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5))
    assert torch.equal(outs[0], outs[1])
    with seeded_rng("attn", 5, q.device):
        other = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert not torch.equal(outs[0], other)
