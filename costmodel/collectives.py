"""Collective cost: alpha-beta per link, flat (ring/tree), uneven and hierarchical variants.

A message of ``n`` bytes over a link costs ``alpha + n / bandwidth`` (latency plus size over
bandwidth, both from the cluster file). A collective is a sequence of such steps; the
formulas below count the steps (alpha terms) and the bytes each rank must push through its
busiest link (beta terms). With ``p`` ranks, ``m`` the largest per-rank piece and ``n`` the
whole tensor:

==================  ===================================  =========================================
kind                variant                              seconds
==================  ===================================  =========================================
all_reduce          ring                                 2(p-1) a + 2(p-1)/p n/B
all_reduce          tree (pipelined double binary tree)  2 ceil(log2 p) a + 2 n/B
all_gather          ring (padded to the largest piece)   (p-1) a + (p-1) m/B
all_gather          tree (Bruck; named only)             ceil(log2 p) a + (p-1) m/B
all_gather          grouped (one broadcast per piece)    sum_r [(p-1) a + piece_r/B]
all_gather          all_to_all (split sizes)             (p-1) a + max bytes a rank sends or receives / B
reduce_scatter      as all_gather (its dual)
broadcast / reduce  ring (pipelined chain)               (p-1) a + n/B
broadcast / reduce  tree (binomial)                      ceil(log2 p) (a + n/B)
all_to_all          pairwise (split sizes)               (p-1) a + busiest rank or NIC bytes / B
all_to_all          tree (Bruck; named only)             ceil(log2 p) (a + half a rank's bytes / B)
==================  ===================================  =========================================

A link may carry its own numbers for particular collectives (:meth:`Link.for_kind`, fitted
per kind by ``hapc profile``); a variant is priced with the numbers of the library call it is
made of (:func:`runs_as`).

A flat collective over a group that spans nodes runs at its slowest link
(:meth:`Cluster.group_link`); in a ring that is exact, since each node's network card
carries one hop in each direction. The network bandwidth of a cluster file is per node
(one card shared by the node's devices), which is what all-to-all and hierarchical forms
account for.

**Hierarchical** forms for groups spanning nodes (Hetu v2 composes them from these parts):
all-reduce = intra-node reduce-scatter, inter-node all-reduce of every node's share (the
node's card carries ``2(N-1)/N n`` over ``N`` nodes), intra-node all-gather; all-gather =
inter-node all-gather between ranks with the same local index (in parallel, sharing the
card), then an intra-node all-gather of what arrived; reduce-scatter is its mirror image.

"ring" and "tree" of all-reduce are picked by NCCL itself; the runtime cannot choose, so
:func:`best_variant` takes the faster, as NCCL's tuner does. The Bruck forms ("tree" of
all-gather, reduce-scatter and all-to-all) are priced when named but never chosen
automatically, because neither NCCL nor gloo runs them. All sizes are bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import ceil, log2

from costmodel.cluster import Cluster, Link

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")

# Variants best_variant chooses among, in tie-break order.
AUTO_VARIANTS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "hierarchical"),
    "all_gather": ("ring", "grouped", "all_to_all", "hierarchical"),
    "reduce_scatter": ("ring", "grouped", "all_to_all", "hierarchical"),
    "broadcast": ("ring", "tree"),
    "reduce": ("ring", "tree"),
    "all_to_all": ("pairwise",),
}
# Every variant that can be priced by name.
VARIANTS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "hierarchical"),
    "all_gather": ("ring", "tree", "grouped", "all_to_all", "hierarchical"),
    "reduce_scatter": ("ring", "tree", "grouped", "all_to_all", "hierarchical"),
    "broadcast": ("ring", "tree"),
    "reduce": ("ring", "tree"),
    "all_to_all": ("pairwise", "tree"),
}
_ALIASES = {"padded": "ring", "padded_ring": "ring", "padded_tree": "tree", "flat": "ring",
            "grouped_broadcast": "grouped", "grouped_reduce": "grouped", "split": "all_to_all",
            "all_to_all_single": "all_to_all", "bruck": "tree"}
# Every name a plan may give a layout change's method.
METHOD_NAMES = frozenset({"auto", *_ALIASES, *(v for names in VARIANTS.values() for v in names)})


def collective_seconds(kind: str, piece_bytes: Sequence[float], cluster: Cluster,
                       ranks: Sequence[int] | None = None, variant: str = "auto", *,
                       send_matrix: Sequence[Sequence[float]] | None = None) -> float:
    """Seconds of one collective over ``ranks`` (default: ranks 0..len(piece_bytes)-1).

    ``piece_bytes`` has one entry per rank of the group:

    * all_gather: the piece each rank contributes; reduce_scatter: the piece each rank ends with;
    * all_reduce, broadcast, reduce: the size of the (whole) tensor on each rank;
    * all_to_all: what each rank holds before, sent evenly to all ranks unless ``send_matrix``
      (``send_matrix[r][s]`` bytes from group member r to member s) says otherwise.

    ``variant`` is one of :data:`VARIANTS` for the kind (or an alias such as "padded"), or
    "auto" for the cheapest of :data:`AUTO_VARIANTS`.
    """
    if variant == "auto":
        return best_variant(kind, piece_bytes, cluster, ranks, send_matrix=send_matrix)[1]
    kind, variant, ranks = _check(kind, variant, piece_bytes, cluster, ranks)
    pieces = list(map(float, piece_bytes))
    if len(ranks) <= 1 or (max(pieces) <= 0 and not _any(send_matrix)):
        return 0.0
    return _PRICERS[kind](variant, pieces, cluster.for_collective(runs_as(kind, variant)), list(ranks), send_matrix)


def dual_variant(kind: str, forward_variant: str) -> str:
    """The variant a collective's backward (of ``kind``) runs: its forward's, as the emitted
    autograd duals do, or "auto" (the cheapest) where the dual has no form of that name (an
    all-reduce has no "grouped")."""
    if not forward_variant or forward_variant == "auto":
        return "auto"
    try:
        return resolve_variant(kind, forward_variant)
    except ValueError:
        return "auto"


def runs_as(kind: str, variant: str) -> str:
    """The library call a variant is made of, whose per-collective link numbers price it.

    An all-gather "grouped" is one broadcast per piece and its reduce-scatter dual one reduce
    per piece; either one "all_to_all" is an ``all_to_all_single`` with split sizes.
    """
    if kind in ("all_gather", "reduce_scatter"):
        if variant == "all_to_all":
            return "all_to_all"
        if variant == "grouped":
            return "broadcast" if kind == "all_gather" else "reduce"
    return kind


def best_variant(kind: str, piece_bytes: Sequence[float], cluster: Cluster,
                 ranks: Sequence[int] | None = None, *, send_matrix: Sequence[Sequence[float]] | None = None,
                 variants: Sequence[str] | None = None) -> tuple[str, float]:
    """The cheapest applicable variant and its seconds (ties go to the earlier variant)."""
    if kind not in AUTO_VARIANTS:
        raise ValueError(f"unknown collective {kind!r}; expected one of {', '.join(KINDS)}")
    ranks = None if ranks is None else list(ranks)     # None: the first len(piece_bytes) ranks
    spans = cluster.group_shape(range(len(piece_bytes)) if ranks is None else ranks).spans_nodes
    best: tuple[str, float] | None = None
    for v in variants or AUTO_VARIANTS[kind]:
        if v == "hierarchical" and not spans:
            continue   # within one node it is the flat ring
        t = collective_seconds(kind, piece_bytes, cluster, ranks, v, send_matrix=send_matrix)
        if best is None or t < best[1]:
            best = (v, t)
    assert best is not None
    return best


def resolve_variant(kind: str, variant: str) -> str:
    """Canonical variant name (aliases resolved), or ValueError naming the valid ones."""
    v = _ALIASES.get(variant, variant)
    if kind not in VARIANTS:
        raise ValueError(f"unknown collective {kind!r}; expected one of {', '.join(KINDS)}")
    if v not in VARIANTS[kind]:
        raise ValueError(f"{kind} has no variant {variant!r}; expected auto or one of {', '.join(VARIANTS[kind])}")
    return v


# ---- the formulas ------------------------------------------------------------------------------

def _steps_log(p: int) -> int:
    return ceil(log2(p)) if p > 1 else 0


def _ab(link: Link | None) -> tuple[float, float]:
    """(alpha seconds, bandwidth bytes/s); a group of one rank has no link and no cost."""
    if link is None:
        return 0.0, float("inf")
    return link.latency_seconds, link.bandwidth_Bps


def _all_reduce(variant: str, pieces: list[float], cluster: Cluster, ranks: list[int], _m) -> float:
    n, p = max(pieces), len(ranks)
    if variant == "hierarchical":
        return _hier_all_reduce(n, cluster, ranks)
    a, bw = _ab(cluster.group_link(ranks))
    if variant == "ring":
        return 2 * (p - 1) * a + 2 * (p - 1) / p * n / bw
    return 2 * _steps_log(p) * a + 2 * n / bw


def _hier_all_reduce(n: float, cluster: Cluster, ranks: list[int]) -> float:
    shape = cluster.group_shape(ranks)
    intra = 0.0
    for g, link in zip(shape.by_node, shape.node_links):
        k = len(g)
        if k > 1:
            a, bw = _ab(link)
            intra = max(intra, (k - 1) * a + (k - 1) / k * n / bw)
    nodes = len(shape.by_node)
    inter = 0.0
    if nodes > 1:
        a, bw = _ab(cluster.network)
        inter = 2 * (nodes - 1) * a + 2 * (nodes - 1) / nodes * n / bw
    return 2 * intra + inter


def _gather_like(variant: str, pieces: list[float], cluster: Cluster, ranks: list[int], _m) -> float:
    """all_gather and reduce_scatter: the same traffic, reversed."""
    p, m = len(ranks), max(pieces)
    if variant == "hierarchical":
        return _hier_gather(m, cluster, ranks)
    if variant == "all_to_all":
        # all_gather: r sends its piece to everyone; reduce_scatter: r sends s its slice s.
        # The busiest rank's sends or receives are the same in both directions of use.
        return _pairwise_uniform(list(pieces), cluster, ranks)
    a, bw = _ab(cluster.group_link(ranks))
    if variant == "grouped":
        return sum((p - 1) * a + x / bw for x in pieces)
    if variant == "ring":
        return (p - 1) * a + (p - 1) * m / bw
    return _steps_log(p) * a + (p - 1) * m / bw


def _hier_gather(m: float, cluster: Cluster, ranks: list[int]) -> float:
    shape = cluster.group_shape(ranks)
    groups = shape.by_node
    nodes, widest = len(groups), max(len(g) for g in groups)
    inter = 0.0
    if nodes > 1:
        a, bw = _ab(cluster.network)
        inter = (nodes - 1) * a + (nodes - 1) * widest * m / bw
    intra = 0.0
    for g, link in zip(groups, shape.node_links):
        k = len(g)
        if k > 1:
            a, bw = _ab(link)
            intra = max(intra, (k - 1) * a + (k - 1) * nodes * m / bw)
    return inter + intra


def _one_to_all(variant: str, pieces: list[float], cluster: Cluster, ranks: list[int], _m) -> float:
    """broadcast and reduce: one tensor from (or to) one root."""
    n, p = max(pieces), len(ranks)
    a, bw = _ab(cluster.group_link(ranks))
    if variant == "ring":
        return (p - 1) * a + n / bw
    return _steps_log(p) * (a + n / bw)


class OverlapSends(Sequence[tuple[float, ...]]):
    """The send matrix of a re-sharding all-to-all, kept as its two factors.

    When rank ``r`` holds ``before[r]`` bytes of a tensor cut one way and rank ``s`` wants
    ``after[s]`` bytes of it cut another way, ``r`` sends ``s`` their overlap,
    ``before[r] * after[s] / total`` (nothing to itself). Written out that is ``p^2`` numbers
    (65,536 at 256 ranks, per move, per simulation); as factors the per-node sums that
    :func:`collective_seconds` needs come in closed form, linear in ranks. It reads as the
    matrix (rows on demand, equal to a tuple of tuples with the same entries) for any code that
    wants the entries.
    """

    def __init__(self, before: Sequence[float], after: Sequence[float], total: float) -> None:
        self.before, self.after, self.total = tuple(before), tuple(after), float(total)

    def __len__(self) -> int:
        return len(self.before)

    def __getitem__(self, r):  # type: ignore[override]
        if isinstance(r, slice):
            return [self[i] for i in range(len(self))[r]]
        r = range(len(self))[r]             # IndexError past the end; -1 is the last row
        b, full = self.before[r], self.total
        return tuple(0.0 if r == s or full == 0 else b * a / full for s, a in enumerate(self.after))

    def transposed(self) -> OverlapSends:
        """What the backward sends: every piece back where it came from."""
        return OverlapSends(self.after, self.before, self.total)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OverlapSends):
            return (self.before, self.after, self.total) == (other.before, other.after, other.total)
        return isinstance(other, Sequence) and len(other) == len(self) and all(
            tuple(row) == mine for row, mine in zip(other, self))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"OverlapSends({len(self)} ranks, {self.total:g} bytes)"


def _all_to_all(variant: str, pieces: list[float], cluster: Cluster, ranks: list[int],
                matrix: Sequence[Sequence[float]] | None) -> float:
    p = len(ranks)
    if matrix is None and variant != "tree":
        return _pairwise_uniform([x / p for x in pieces], cluster, ranks)
    if isinstance(matrix, OverlapSends):
        return _overlap_all_to_all(variant, matrix, cluster, ranks)
    if matrix is None:
        matrix = [[x / p if s != r else 0.0 for s in range(p)] for r, x in enumerate(pieces)]
    if variant == "tree":
        a, bw = _ab(cluster.group_link(ranks))
        busiest = max(sum(row[s] for s in range(p) if s != r) for r, row in enumerate(matrix))
        steps = _steps_log(p)
        return steps * (a + busiest / 2 / bw)
    return _pairwise(matrix, cluster, ranks)


def _overlap_all_to_all(variant: str, sends: OverlapSends, cluster: Cluster, ranks: list[int]) -> float:
    """:func:`_pairwise` (and the Bruck form) for an :class:`OverlapSends` matrix, in closed
    form per node: with ``B`` and ``A`` the sums of ``before`` and ``after`` over a set of
    ranks, rank ``i`` sends ``before[i] (A - after[i]) / total`` to the others of that set and
    receives ``after[i] (B - before[i]) / total`` from them."""
    p, full = len(ranks), sends.total
    shape = cluster.group_shape(ranks)
    if full == 0:
        return 0.0
    before, after = sends.before, sends.after
    if variant == "tree":
        a, bw = _ab(shape.link)
        all_after = sum(after)
        busiest = max(b * (all_after - x) / full for b, x in zip(before, after))
        return _steps_log(p) * (a + busiest / 2 / bw)
    all_before, all_after = sum(before), sum(after)
    worst = 0.0
    network = cluster.network
    for positions, link in zip(shape.positions, shape.node_links):
        node_before = sum(before[i] for i in positions)
        node_after = sum(after[i] for i in positions)
        if link is not None:
            busiest = max(max(before[i] * (node_after - after[i]), after[i] * (node_before - before[i]))
                          for i in positions) / full
            if busiest > 0:
                worst = max(worst, busiest / link.bandwidth_Bps)
        if network is not None:
            out = node_before * (all_after - node_after) / full
            into = node_after * (all_before - node_before) / full
            worst = max(worst, max(out, into) / network.bandwidth_Bps)
    a, _ = _ab(shape.link)
    return (p - 1) * a + worst


def _pairwise(matrix: Sequence[Sequence[float]], cluster: Cluster, ranks: list[int]) -> float:
    """p-1 exchange steps; the bandwidth term is the busiest rank on its intra-node link or
    the busiest node on its (shared) network card, sending or receiving."""
    p = len(ranks)
    node = [cluster.node_of(r) for r in ranks]
    worst = 0.0
    net_out: dict[int, float] = {}
    net_in: dict[int, float] = {}
    for i in range(p):
        out_intra = sum(matrix[i][j] for j in range(p) if j != i and node[j] == node[i])
        in_intra = sum(matrix[j][i] for j in range(p) if j != i and node[j] == node[i])
        link = cluster.nodes[node[i]].intra_link
        if link is not None and max(out_intra, in_intra) > 0:
            worst = max(worst, max(out_intra, in_intra) / link.bandwidth_Bps)
        net_out[node[i]] = net_out.get(node[i], 0.0) + sum(matrix[i][j] for j in range(p) if node[j] != node[i])
        net_in[node[i]] = net_in.get(node[i], 0.0) + sum(matrix[j][i] for j in range(p) if node[j] != node[i])
    if cluster.network is not None:
        for nd, out in net_out.items():
            worst = max(worst, max(out, net_in[nd]) / cluster.network.bandwidth_Bps)
    a, _ = _ab(cluster.group_link(ranks))
    return (p - 1) * a + worst


def _pairwise_uniform(share: list[float], cluster: Cluster, ranks: list[int]) -> float:
    """:func:`_pairwise` for a matrix whose row ``i`` sends ``share[i]`` to every other rank
    (an even all-to-all, an all-gather run as one): the same sums in closed form per node,
    linear in nodes after one pass over the pieces (256 ranks priced in microseconds).

    On a node with ``n`` members sending ``sent`` in all, member ``i`` sends ``share[i] (n-1)``
    and receives ``sent - share[i]`` over the intra-node link, so the busiest member is the one
    with the largest piece (sending) or the smallest (receiving)."""
    p = len(ranks)
    shape = cluster.group_shape(ranks)
    total = sum(share)
    worst = 0.0
    network = cluster.network
    for positions, link in zip(shape.positions, shape.node_links):
        pieces = [share[i] for i in positions]
        n, sent = len(pieces), sum(pieces)
        if link is not None:
            busiest = max(max(pieces) * (n - 1), sent - min(pieces))
            if busiest > 0:
                worst = max(worst, busiest / link.bandwidth_Bps)
        if network is not None:
            worst = max(worst, max(sent * (p - n), (total - sent) * n) / network.bandwidth_Bps)
    a, _ = _ab(shape.link)
    return (p - 1) * a + worst


_PRICERS = {"all_reduce": _all_reduce, "all_gather": _gather_like, "reduce_scatter": _gather_like,
            "broadcast": _one_to_all, "reduce": _one_to_all, "all_to_all": _all_to_all}


def _check(kind: str, variant: str, piece_bytes: Sequence[float], cluster: Cluster,
           ranks: Sequence[int] | None) -> tuple[str, str, list[int]]:
    v = resolve_variant(kind, variant)
    given = ranks is not None
    ranks = list(ranks) if given else list(range(len(piece_bytes)))
    if len(ranks) != len(piece_bytes):
        raise ValueError(f"{kind}: {len(piece_bytes)} piece sizes for a group of {len(ranks)} ranks")
    if len(ranks) > cluster.world or given and (len(set(ranks)) != len(ranks) or
                                                 any(not 0 <= r < cluster.world for r in ranks)):
        raise ValueError(f"{kind}: ranks {ranks} are not distinct ranks of a {cluster.world}-device cluster")
    if piece_bytes and min(piece_bytes) < 0:
        raise ValueError(f"{kind}: negative piece size in {list(piece_bytes)}")
    return kind, v, ranks


def _any(matrix: Sequence[Sequence[float]] | None) -> bool:
    if isinstance(matrix, OverlapSends):      # some r != s with before[r] * after[s] > 0
        senders = [r for r, b in enumerate(matrix.before) if b > 0]
        takers = [s for s, a in enumerate(matrix.after) if a > 0]
        return matrix.total != 0 and bool(senders) and bool(takers) and \
            (len(senders) > 1 or len(takers) > 1 or senders != takers)
    return matrix is not None and any(x > 0 for row in matrix for x in row)
