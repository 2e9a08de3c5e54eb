"""Measured per-rank speeds -> the cluster a replan should plan for (``hapc replan --measured``).

An emitted program run with ``--timings`` prints each rank's compute seconds per step. Each rank
did the work the plan gave it, so its measured compute over the cost model's prediction for it
(``SimResult.compute_seconds``) is how much slower than modelled that device ran. Those ratios
are noisy (identical cores of a shared machine can measure far apart, and shares split on
that noise run slower than even data parallelism), so ranks whose step-by-step ratios overlap
(the range of their samples, widened to a floor of ``NOISE_FLOOR``) are put in one group and
get one speed: shares are only split on differences the measurements can tell apart. Speeds are relative to the fastest group (absolute calibration
is ``hapc calibrate``'s job), so only ranks measured slower than the rest change.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from costmodel.cluster import Cluster
from costmodel.cluster_edit import slowed
from hapc.errors import UserError

NOISE_FLOOR = 0.05          # relative differences below this are never told apart
LINE = re.compile(r"^timing step (\d+) rank (\d+) compute_s ([0-9.eE+-]+) comm_s ([0-9.eE+-]+) idle_s ([0-9.eE+-]+)")


@dataclass(frozen=True)
class RankSpeed:
    rank: int
    slowdown: float          # measured / predicted compute, over the fastest group's (>= 1)
    spread: float            # half the relative range of this rank's samples
    group: tuple[int, ...]   # the ranks it could not be told apart from


def read_timings(path: str | Path) -> dict[int, list[float]]:
    """Rank -> compute seconds per step from a ``--timings`` log (the first step, which warms
    caches and allocators, is left out when there are later ones)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read the run log ({exc.strerror})", where=str(path)) from None
    by_step: dict[int, dict[int, float]] = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if m:
            by_step.setdefault(int(m.group(1)), {})[int(m.group(2))] = float(m.group(3))
    if not by_step:
        raise UserError("no 'timing step N rank R compute_s ...' lines: run the program with --timings",
                        where=str(path))
    steps = sorted(by_step)
    if len(steps) > 1:
        steps = steps[1:]
    out: dict[int, list[float]] = {}
    for step in steps:
        for rank, seconds in by_step[step].items():
            out.setdefault(rank, []).append(seconds)
    return out


def rank_speeds(samples: dict[int, list[float]], predicted_seconds: list[float]) -> list[RankSpeed]:
    """Each rank's slow-down against the model, grouped where the measurements overlap."""
    world = len(predicted_seconds)
    if sorted(samples) != list(range(world)):
        raise UserError(f"the log has timings for ranks {sorted(samples)}, the plan has {world} ranks")
    ratios = {r: [x / predicted_seconds[r] for x in xs] for r, xs in samples.items() if predicted_seconds[r] > 0}
    if len(ratios) < world:
        return [RankSpeed(r, 1.0, 0.0, tuple(range(world))) for r in range(world)]
    centre = {r: statistics.median(xs) for r, xs in ratios.items()}
    low = {r: min(min(xs), centre[r] * (1 - NOISE_FLOOR)) for r, xs in ratios.items()}
    high = {r: max(max(xs), centre[r] * (1 + NOISE_FLOOR)) for r, xs in ratios.items()}
    groups: list[list[int]] = []
    for r in sorted(ratios, key=lambda q: centre[q]):
        if groups and low[r] <= max(high[q] for q in groups[-1]):
            groups[-1].append(r)
        else:
            groups.append([r])
    pooled = [statistics.median([x for q in g for x in ratios[q]]) for g in groups]
    fastest = min(pooled)
    out: dict[int, RankSpeed] = {}
    for g, value in zip(groups, pooled):
        for r in g:
            spread = (max(ratios[r]) - min(ratios[r])) / 2 / centre[r] if centre[r] else 0.0
            out[r] = RankSpeed(r, value / fastest, spread, tuple(sorted(g)))
    return [out[r] for r in range(world)]


def measured_cluster(path: str | Path, cluster: Cluster, predicted_seconds: list[float],
                     say: Callable[[str], None] = lambda msg: None) -> Cluster:
    """``cluster`` with each rank as fast as ``path`` measured it, relative to the others."""
    speeds = rank_speeds(read_timings(path), predicted_seconds)
    seen: set[tuple[int, ...]] = set()
    for s in speeds:
        if s.group in seen:
            continue
        seen.add(s.group)
        ranks = ",".join(map(str, s.group))
        verdict = "the fastest" if s.slowdown == 1.0 else f"{s.slowdown:.2f}x slower"
        say(f"ranks {ranks}: {verdict} (measured/predicted compute, told apart beyond "
            f"+-{max(NOISE_FLOOR, max(t.spread for t in speeds if t.group == s.group)) * 100:.0f}%)")
    return slowed(cluster, {s.rank: s.slowdown for s in speeds if s.slowdown > 1.0})
