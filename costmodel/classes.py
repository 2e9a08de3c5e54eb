"""Ranks that behave alike: the equivalence classes the simulator and memory model work on.

Under a fixed program, what the cost model predicts for one rank depends only on

* the device's capabilities (type, peaks, memory, HBM bandwidth; the type also selects
  measured op times),
* the length of the rank's piece of every sharded dimension (which sets its share of each
  op's work, its local bytes and its memory), and
* whether it is rank 0 (a Replicate -> Partial move leaves rank 0 alone).

Collectives are blocking and priced once for the whole group, so a rank's node adds nothing
to its own timeline. Two ranks that agree on all three therefore get the same compute,
communication, idle and memory figures, operation by operation, and the simulator needs to
run only one representative of each class, then copy its numbers to the others: exactly the
same floats, in ``classes`` steps instead of ``world``.

How many classes there are depends on the shares: with equal shares within a device type
(what the ratio LP gives identical devices, see :mod:`synth.ratios`), the integer piece
lengths differ by at most one inside a type, and the ranks that get the longer piece come
first, so a type splits into at most one class more than there are distinct thresholds. On
the 256-device example this is a handful of classes, not 256.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from costmodel.cluster import Cluster
from hapc.ir.program import DistProgram
from hapc.ir.shards import shard_lengths

T = TypeVar("T")


@dataclass(frozen=True)
class RankClasses:
    """A partition of ``world`` ranks: ``representatives[c]`` is the first rank of class ``c``
    and ``class_of[r]`` the class of rank ``r``."""

    representatives: tuple[int, ...]
    class_of: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.representatives)

    @property
    def world(self) -> int:
        return len(self.class_of)

    def pick(self, per_rank: Sequence[T]) -> list[T]:
        """The representatives' entries of a per-rank sequence."""
        return [per_rank[r] for r in self.representatives]

    def expand(self, per_class: Sequence[T]) -> list[T]:
        """A per-class sequence spread back over the ranks, in cluster order."""
        return [per_class[c] for c in self.class_of]

    def sizes(self) -> list[int]:
        out = [0] * self.count
        for c in self.class_of:
            out[c] += 1
        return out


def rank_classes(program: DistProgram, cluster: Cluster | None) -> RankClasses:
    """The classes of ranks that the cost model cannot tell apart under ``program``.

    The signature of a rank is its kind of device (:meth:`Cluster.device_kinds`), whether it is
    rank 0, its share of the optimizer state under ZeRO (``state_shares``), and its piece length
    for every (length, block count) pair of the program's sharded dimensions, also taken
    with no blocking (the form :meth:`DistProgram.lengths` uses for a dimension it does not
    know), so every length the simulator or memory model can ask for is covered. Without a
    cluster (memory without capacities) devices do not enter the signature.
    """
    world = program.world
    pairs: set[tuple[int, int]] = set()
    values = program.graph.values
    for (value, dim), n_blocks in program.blocks().items():
        length = values[value.split("@", 1)[0]].meta.shape[dim]     # program.shape(value), inline
        pairs.add((length, n_blocks))
        pairs.add((length, length))
    shares = tuple(program.shares)
    columns = [shard_lengths(length, shares, n_blocks) for length, n_blocks in sorted(pairs)]
    keys = cluster.device_kinds() if cluster is not None else (None,) * world
    states = program.state_shares or (None,) * world      # ZeRO: each rank's share of the states
    signatures = zip(keys, (r == 0 for r in range(world)), states, *columns)
    index: dict[tuple, int] = {}
    representatives: list[int] = []
    class_of: list[int] = []
    for r, sig in enumerate(signatures):
        c = index.get(sig)
        if c is None:
            c = index[sig] = len(representatives)
            representatives.append(r)
        class_of.append(c)
    return RankClasses(tuple(representatives), tuple(class_of))
