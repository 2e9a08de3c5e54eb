"""Integer piece lengths for uneven sharding.

A sharded dimension is cut into ``n_blocks`` equal blocks and each rank gets a whole number
of blocks, in proportion to its share (largest-remainder rounding). Blocks exist because
dimensions are tied together by views: ``[B, S, 768] -> [B, S, 12, 64]`` can keep a shard of
the hidden dimension only if every piece is a whole number of 64-wide heads, so both
dimensions are cut into the same 12 blocks. :func:`hapc.rules.blocks` works out the block
count of every sharded dimension of a program.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import floor


def storage_dim(shape: Sequence[int]) -> int | None:
    """The dimension a weight stored sharded is cut along (ZeRO-3): its longest, the first of
    equals; None when no dimension is longer than 1."""
    dims = [d for d, n in enumerate(shape) if n > 1]
    return max(dims, key=lambda d: (shape[d], -d)) if dims else None


def largest_remainder(total: int, shares: Sequence[float]) -> list[int]:
    """Split ``total`` units in proportion to ``shares``; every rank with a positive share
    gets at least one unit when there are enough units to go round.

    Ties break towards lower ranks, so the result is deterministic.
    """
    if total < 0:
        raise ValueError(f"cannot split a negative total ({total})")
    s = sum(shares)
    if s <= 0:
        raise ValueError(f"shares must have a positive sum, got {list(shares)}")
    exact = [total * x / s for x in shares]
    counts = [floor(e) for e in exact]
    left = total - sum(counts)
    order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    positive = [i for i, x in enumerate(shares) if x > 0]
    if total >= len(positive):
        # Take a unit from the richest rank for every positive-share rank left with none.
        for i in positive:
            if counts[i] == 0:
                donor = max(range(len(counts)), key=lambda j: (counts[j], -j))
                counts[donor] -= 1
                counts[i] += 1
    return counts


def shard_lengths(length: int, shares: Sequence[float], n_blocks: int | None = None) -> list[int]:
    """Lengths of the pieces of a dimension of ``length`` cut into ``n_blocks`` blocks."""
    n_blocks = length if n_blocks is None else n_blocks
    if n_blocks <= 0 or length % n_blocks:
        raise ValueError(f"{n_blocks} blocks do not divide a dimension of length {length}")
    block = length // n_blocks
    return [c * block for c in largest_remainder(n_blocks, shares)]


def offsets(lengths: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for n in lengths:
        out.append(acc)
        acc += n
    return out
