"""Fitting a link's alpha (latency) and beta (seconds per byte) to measured collectives.

The cost model prices every collective over one link as ``steps * alpha + bytes * beta``
(:mod:`costmodel.collectives`), with ``steps`` and ``bytes`` depending on the kind, the
group size and the piece sizes. Rather than restate those formulas here, the two
coefficients of each measured sample are read off the cost model itself: the price on a
link of latency 1 s and unlimited bandwidth is ``steps``, on a link of no latency and
1 byte/s it is ``bytes``. Then ``seconds ~ steps * alpha + bytes * beta`` is linear in
(alpha, beta), and a non-negative least-squares fit on *relative* errors (each row divided
by its measured time, so a 4 KB message counts as much as a 8 MB one) gives both. The
fitted link therefore reproduces the measurements through the same formulas the simulator
uses to price plans.

Variants: ring for all-reduce, all-gather, reduce-scatter and broadcast, pairwise for
all-to-all, which is how gloo and NCCL run them on one node.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from costmodel.cluster import Cluster, Device, Host, Link
from costmodel.collectives import collective_seconds
from costmodel.opclass import DEFAULT_EFFICIENCY
from profiler.comm import CommSample

VARIANT = {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring", "broadcast": "ring",
           "all_to_all": "pairwise"}
_HUGE_BANDWIDTH_BPS = 1e30


@dataclass(frozen=True)
class LinkFit:
    """A fitted link: ``latency_seconds`` (alpha), ``bandwidth_Bps`` (1/beta) over all kinds,
    each measured kind's own (alpha, 1/beta) in ``per_kind``, and how well they fit.

    ``median_rel_error`` and ``per_kind_rel_error`` are those of the per-kind numbers (what
    the cost model prices with); ``joint_rel_error`` is what one (alpha, beta) for every kind
    would leave, which says how much the per-kind numbers matter on this link.
    """

    latency_seconds: float
    bandwidth_Bps: float
    median_rel_error: float
    per_kind_rel_error: dict[str, float]
    samples: int
    per_kind: dict[str, tuple[float, float]] = field(default_factory=dict)   # kind -> (alpha, bandwidth)
    joint_rel_error: float = float("nan")

    def as_link(self, name: str) -> Link:
        kinds = tuple((k, bw, a) for k, (a, bw) in sorted(self.per_kind.items()))
        return Link(name, self.bandwidth_Bps, self.latency_seconds, kinds)


def _one_link_cluster(p: int, latency_seconds: float, bandwidth_Bps: float) -> Cluster:
    devices = [Device(i, 0, "x", {"fp32": 1.0, "tf32": 1.0, "bf16": 1.0, "fp16": 1.0}, 1, 1.0) for i in range(p)]
    return Cluster(devices, [Host(0, tuple(range(p)), Link("x", bandwidth_Bps, latency_seconds))], None,
                   dict(DEFAULT_EFFICIENCY))


def coefficients(kind: str, ranks: int, piece_bytes: float) -> tuple[float, float]:
    """(steps, bytes) of one collective under the cost model: seconds = steps*alpha + bytes*beta."""
    pieces = [piece_bytes] * ranks
    steps = collective_seconds(kind, pieces, _one_link_cluster(ranks, 1.0, _HUGE_BANDWIDTH_BPS), None, VARIANT[kind])
    nbytes = collective_seconds(kind, pieces, _one_link_cluster(ranks, 0.0, 1.0), None, VARIANT[kind])
    return steps, nbytes


def predicted_seconds(sample: CommSample, latency_seconds: float, bandwidth_Bps: float) -> float:
    steps, nbytes = coefficients(sample.kind, sample.ranks, sample.piece_bytes)
    return steps * latency_seconds + nbytes / bandwidth_Bps


def _nnls_alpha_beta(samples: Sequence[CommSample]) -> tuple[float, float]:
    """Least-squares (alpha, beta) >= 0 on relative errors; beta 0 means no bandwidth term fit."""
    rows = []
    for s in samples:
        steps, nbytes = coefficients(s.kind, s.ranks, s.piece_bytes)
        rows.append([steps / s.seconds, nbytes / s.seconds])
    a = np.asarray(rows)
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    (alpha_scaled, beta_scaled), _ = nnls(a / scale, np.ones(len(rows)))
    return float(alpha_scaled / scale[0]), float(beta_scaled / scale[1])


def fit_link(samples: Sequence[CommSample]) -> LinkFit:
    """Alpha and beta (both >= 0) over all samples, and per kind measured at two sizes or more.

    A kind whose own fit finds no bandwidth term (all its sizes latency-bound) keeps the
    joint bandwidth and gets its own latency; one whose fit finds no latency term keeps zero.
    """
    usable = [s for s in samples if s.seconds > 0 and s.ranks >= 2]
    if len(usable) < 2:
        raise ValueError(f"need at least two collective timings to fit a link, got {len(usable)}")
    alpha, beta = _nnls_alpha_beta(usable)
    bandwidth = 1.0 / beta if beta > 0 else _HUGE_BANDWIDTH_BPS
    by_kind: dict[str, list[CommSample]] = {}
    for s in usable:
        by_kind.setdefault(s.kind, []).append(s)
    per_kind: dict[str, tuple[float, float]] = {}
    for kind, mine in sorted(by_kind.items()):
        if len({s.piece_bytes for s in mine}) < 2:
            continue
        a_k, b_k = _nnls_alpha_beta(mine)
        per_kind[kind] = (a_k, 1.0 / b_k if b_k > 0 else bandwidth)
    joint: list[float] = []
    errors: dict[str, list[float]] = {}
    for s in usable:
        joint.append(abs(predicted_seconds(s, alpha, bandwidth) - s.seconds) / s.seconds)
        a_k, bw_k = per_kind.get(s.kind, (alpha, bandwidth))
        errors.setdefault(s.kind, []).append(abs(predicted_seconds(s, a_k, bw_k) - s.seconds) / s.seconds)
    every = [e for errs in errors.values() for e in errs]
    return LinkFit(alpha, bandwidth, statistics.median(every), {k: statistics.median(v) for k, v in errors.items()},
                   len(every), per_kind, statistics.median(joint))
