"""What a stage costs on a device group, for every pair of cuts: the arrays the stage DP reads.

A group's program is priced once per node and micro-batch count (:class:`costmodel.pipeline.
ProgramProfile`, prefix sums); a stage over cuts ``[i, j)`` on the group costs differences of
those sums, so one array operation prices every cut pair at once. :func:`cut_pair_terms` gives
a stage's forward and backward step, its gradient sync and optimizer tail, its memory and how
many micro-batches it can hold; :func:`bound_pair_terms` the same bounded below for any program
the group could run (:mod:`costmodel.stagebounds`); :func:`arc_terms` adds the sends to the
stages before and after it, as :class:`synth.stagedp.Arc` wants them.
"""

from __future__ import annotations

import functools

import numpy as np

from costmodel.cluster import Cluster
from costmodel.collectives import best_variant
from costmodel.pipeline import ProgramProfile, send_seconds


def cut_pair_terms(prof: ProgramProfile, cuts: np.ndarray, n_nodes: int, group: Cluster,
                   cluster: Cluster) -> dict[str, np.ndarray]:
    """Per cut pair ``(i, j)`` of ``cuts`` (node positions) on ``group`` (``prof`` its profile,
    ``cluster`` the whole one): ``fwd``, ``bwd``, ``step`` (inf where ``j <= i``), ``sync``,
    ``exposed``, ``tail``, ``inflight_max`` (-1 where ``j <= i``), and per rank ``static`` and
    ``act`` bytes as ``[i, j, rank]``. Each pair's floats are the same whichever cuts are given."""
    c = len(cuts)

    def diff(prefix: np.ndarray) -> np.ndarray:
        at = prefix[cuts]
        return at[None, :] - at[:, None]

    def per_rank(prefix: np.ndarray) -> np.ndarray:
        """``diff`` of a per-rank prefix as ``[rank, i, j]``: reducing over ranks then runs
        over whole planes, not a short last axis (the same floats)."""
        at = prefix[cuts].T
        return at[:, None, :] - at[:, :, None]

    fwd = per_rank(prof.fwd_compute).max(axis=0) + diff(prof.fwd_comm)
    bwd = per_rank(prof.bwd_compute).max(axis=0) + diff(prof.bwd_comm)
    static = per_rank(prof.static_bytes)                     # [world, c, c]
    act = per_rank(prof.activation_bytes)
    opt = per_rank(prof.optimizer_seconds).max(axis=0)
    grad = diff(prof.grad_sync_bytes)
    shared_tail = np.zeros((c, c))
    for p, uses in prof.param_uses.items():
        first = prof.param_first_use[p]
        if len(uses) < 2:
            continue
        used = np.zeros(n_nodes + 1)
        for u in uses:
            used[u + 1] += 1
        used = np.cumsum(used)
        holds = (used[cuts][None, :] - used[cuts][:, None] > 0) & (cuts[:, None] > first)
        static = static + holds[None, :, :] * prof.param_static_bytes[p][:, None, None]
        if p in prof.param_grad_bytes:
            shared_tail += holds * send_seconds(cluster.network or group.group_link(), prof.param_grad_bytes[p])
    static = static + largest_call(prof, cuts)
    sync = all_reduce_seconds(group, grad)
    exposed = sync - np.minimum(sync, bwd) * cluster.comm_overlap
    cap = np.array([d.memory_bytes for d in group.devices], dtype=float)[:, None, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        room = (cap - static) / act
        room = np.where(act > 0, room, np.where(cap >= static, np.inf, -1.0))
    inflight_max = np.floor(room.min(axis=0))
    upper = upper_pairs(c)
    return {"fwd": fwd, "bwd": bwd, "step": np.where(upper, fwd + bwd, np.inf), "tail": opt + shared_tail,
            "sync": sync, "exposed": exposed, "inflight_max": np.where(upper, inflight_max, -1.0),
            "static": np.moveaxis(static, 0, 2), "act": np.moveaxis(act, 0, 2)}     # [i, j, rank]


def largest_call(prof: ProgramProfile, cuts: np.ndarray) -> np.ndarray | float:
    """Per rank and cut pair ``[rank, i, j]``, the activations of the largest recomputed call
    that starts in ``[cuts[i], cuts[j])``: what a stage holds once while backward reruns its
    calls one at a time (:mod:`costmodel.recompute`); 0 without recomputation."""
    if not len(prof.call_nodes):
        return 0.0
    c, world = len(cuts), prof.call_bytes.shape[1]
    out = np.zeros((world, c, c))
    first = np.searchsorted(prof.call_nodes, cuts, side="left")     # the first call at or after each cut
    for i in range(c):
        if first[i] >= len(prof.call_nodes):
            continue
        running = np.maximum.accumulate(prof.call_bytes[first[i]:], axis=0)     # [calls from i on, rank]
        upto = first - first[i]               # calls from i on that start before cut j
        has = upto > 0
        out[:, i, has] = running[upto[has] - 1].T
    return out


def bound_pair_terms(prof, cuts: np.ndarray) -> dict[str, np.ndarray]:
    """What :func:`cut_pair_terms` gives, bounded below (in-flight limits bounded above) for
    every program the group could run, from its :class:`costmodel.stagebounds.StageBounds`
    profile ``prof``."""

    def diff(prefix: np.ndarray) -> np.ndarray:
        at = prefix[cuts]
        return at[None, :] - at[:, None]

    fwd, bwd = diff(prof.fwd_seconds), diff(prof.bwd_seconds)
    upper = upper_pairs(len(cuts))
    inflight = prof.inflight_max(cuts[:, None], cuts[None, :])
    nothing = np.zeros_like(fwd)
    return {"fwd": fwd, "bwd": bwd, "step": np.where(upper, fwd + bwd, np.inf),
            "tail": diff(prof.optimizer_seconds), "sync": nothing,
            "exposed": nothing, "inflight_max": np.where(upper, inflight, -1.0)}


def arc_terms(mat: dict[str, np.ndarray], sends_after: tuple[np.ndarray, np.ndarray],
              sends_before: tuple[np.ndarray, np.ndarray], blocked: float) -> tuple[np.ndarray, ...]:
    """A group's :class:`synth.stagedp.Arc` arrays ``(cost, gate, inflight_max, busy, busy_tail,
    ahead)`` from its cut-pair terms ``mat`` and the seconds to send each cut's activations
    (forward, backward) to the stage after it and from the one before it (zero where there is
    none); ``blocked`` is the part of a send compute cannot hide, added to the stage's step."""
    xf, xb = sends_after
    bf, bb = sends_before
    step = mat["step"] + blocked * (xf[None, :] + bf[:, None] + xb[None, :] + bb[:, None])
    link = xf + xb
    busy = step + link[None, :]
    tail = mat["exposed"] + mat["tail"]
    cost = busy.copy()
    cost[0] = cost[0] + tail[0]
    ahead = mat["fwd"] + blocked * (xf[None, :] + bf[:, None]) + xf[None, :]
    gate = np.maximum(step, link[None, :])
    return cost, gate, mat["inflight_max"], busy, busy + tail, ahead


@functools.lru_cache(maxsize=8)
def upper_pairs(c: int) -> np.ndarray:
    """``[i, j]``: whether cut ``j`` comes after cut ``i`` (a stage between them); read only."""
    return np.triu(np.ones((c, c), dtype=bool), 1)


def all_reduce_seconds(group: Cluster, nbytes: np.ndarray) -> np.ndarray:
    """Gradient all-reduce time over ``group`` for each byte count: alpha-beta, so affine in
    bytes for the best variant at large sizes; priced at two sizes and interpolated."""
    if group.world <= 1:
        return np.zeros_like(nbytes)
    small, large = 1e6, 1e9
    t_small = best_variant("all_reduce", [small] * group.world, group)[1]
    t_large = best_variant("all_reduce", [large] * group.world, group)[1]
    slope = (t_large - t_small) / (large - small)
    base = t_small - slope * small
    return np.where(nbytes > 0, base + slope * nbytes, 0.0)
