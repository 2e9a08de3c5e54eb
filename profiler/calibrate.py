"""Calibration: run several plans of a model, compare measured and predicted step times, fit.

A cost model nobody checked is a guess. ``hapc calibrate MODEL.py --cluster C.yaml`` emits
and runs the standard baselines and the synthesized plan on this machine
(:mod:`profiler.launch`), and compares each run's measured step time with the simulator's
prediction. Two numbers say how good the model is: the Spearman **rank correlation**
(does it order plans correctly? that is what plan search needs) and the **median relative
error** (is it right in absolute terms?).

Then it fits a few *knobs*, each a factor on numbers of the cluster file:

==========  ==============================================================
``compute``  every op class's efficiency (all FLOP-bound work)
``memory``   the ``hbm`` efficiency (memory-bound work, optimizer step)
``launch``   the per-kernel launch latency (per-op overhead)
``comm``     every link's bandwidth
``latency``  every link's latency
class name   that class's efficiency alone (``matmul``, ``attention``, ...)
==========  ==============================================================

by least squares on log-times, ``sum_i log(predicted_i / measured_i)^2``, plus a weak pull
of every log-factor towards 0 so that knobs the runs cannot tell apart stay where the
profile put them. The prediction is the real simulator on the real programs, re-run for
each trial, so nothing is linearised. A leave-one-out error (fit without a run, predict it)
says how much of the "after" number is fit rather than model. ``--write`` puts the fitted
numbers into the cluster file: efficiencies, launch latency and link numbers; when an
efficiency would pass 1 the excess moves into the devices' peak.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import least_squares
from scipy.stats import spearmanr

from costmodel.cluster import Cluster, Host, Link, load_cluster
from costmodel.cluster_file import parse_cluster
from costmodel.opclass import DEFAULT_EFFICIENCY
from costmodel.simulator import simulate
from hapc.errors import UserError
from hapc.ir.program import DistProgram

GLOBAL_KNOBS = ("compute", "memory", "launch", "comm", "latency")
FLOP_CLASSES = tuple(k for k in DEFAULT_EFFICIENCY if k != "hbm")
DEFAULT_PLANS = ("dp-even", "dp-flops", "megatron-tp", "zero3", "hapc")
PRIOR_WEIGHT = 0.1          # pull of each log-factor towards 0, against 1 per run's log-error


# ---- knobs ------------------------------------------------------------------------------------

def parse_knobs(spec: str) -> tuple[str, ...]:
    knobs = tuple(k.strip() for k in spec.split(",") if k.strip())
    for k in knobs:
        if k not in GLOBAL_KNOBS and k not in FLOP_CLASSES:
            raise UserError(f"--fit {k!r}: expected some of {', '.join(GLOBAL_KNOBS + FLOP_CLASSES)}")
    if not knobs:
        raise UserError("--fit: name at least one knob")
    return knobs


def apply_knobs(cluster: Cluster, scales: Mapping[str, float]) -> Cluster:
    """A copy of ``cluster`` with each knob's factor applied (missing knobs: factor 1)."""
    eff = dict(cluster.efficiency)
    for cls in FLOP_CLASSES:
        eff[cls] = eff[cls] * scales.get("compute", 1.0) * scales.get(cls, 1.0)
    eff["hbm"] = eff["hbm"] * scales.get("memory", 1.0)
    bw, lat = scales.get("comm", 1.0), scales.get("latency", 1.0)

    def link(lk: Link | None) -> Link | None:
        return None if lk is None else lk.scaled(bw, lat)

    nodes = [Host(h.index, h.devices, link(h.intra_link)) for h in cluster.nodes]
    return replace(cluster, nodes=nodes, network=link(cluster.network), efficiency=eff,
                   launch_latency_seconds=cluster.launch_latency_seconds * scales.get("launch", 1.0))


# ---- the numbers that judge a cost model ------------------------------------------------------

def rank_correlation(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Spearman's rho; nan when fewer than 3 runs or one side is constant."""
    if len(predicted) < 3 or len(set(predicted)) < 2 or len(set(measured)) < 2:
        return float("nan")
    return float(spearmanr(predicted, measured).statistic)


def ordered_pairs(predicted: Sequence[float], measured: Sequence[float], min_gap: float = 0.05) -> float:
    """Of the pairs of runs whose measured times differ by more than ``min_gap`` (relative), the
    fraction the prediction orders the same way; nan when there is no such pair.

    Spearman's rho counts a swap of two plans that measure within noise of each other (1 %
    apart on a shared CPU) like any other; plan search only needs the order of plans that
    really differ, which this counts.
    """
    right = total = 0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            lo, hi = sorted((measured[i], measured[j]))
            if hi <= lo * (1 + min_gap):
                continue
            total += 1
            right += (predicted[i] - predicted[j]) * (measured[i] - measured[j]) > 0
    return right / total if total else float("nan")


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    return [abs(p - m) / m for p, m in zip(predicted, measured)]


def median_relative_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    errs = relative_errors(predicted, measured)
    return statistics.median(errs) if errs else float("nan")


# ---- fitting ----------------------------------------------------------------------------------

Predictor = Callable[[Mapping[str, float]], Sequence[float]]


@dataclass
class Fit:
    """Fitted factors and the predictions they give, with the numbers before and after."""

    scales: dict[str, float]
    measured: list[float]
    before: list[float]
    after: list[float]
    leave_one_out: list[float] = field(default_factory=list)

    @property
    def rho_before(self) -> float:
        return rank_correlation(self.before, self.measured)

    @property
    def rho_after(self) -> float:
        return rank_correlation(self.after, self.measured)

    @property
    def pairs_before(self) -> float:
        return ordered_pairs(self.before, self.measured)

    @property
    def pairs_after(self) -> float:
        return ordered_pairs(self.after, self.measured)

    @property
    def error_before(self) -> float:
        return median_relative_error(self.before, self.measured)

    @property
    def error_after(self) -> float:
        return median_relative_error(self.after, self.measured)

    @property
    def error_leave_one_out(self) -> float:
        return median_relative_error(self.leave_one_out, self.measured) if self.leave_one_out else float("nan")


def fit_scales(predict: Predictor, measured: Sequence[float], knobs: Sequence[str], *,
               prior_weight: float = PRIOR_WEIGHT, bound: float = 6.0) -> dict[str, float]:
    """Factors for ``knobs`` minimising squared log-errors of ``predict`` against ``measured``."""
    meas = np.log(np.asarray(measured, dtype=float))

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = np.asarray(predict(dict(zip(knobs, np.exp(x)))), dtype=float)
        return np.concatenate([np.log(np.maximum(pred, 1e-12)) - meas, prior_weight * x])

    x0 = np.zeros(len(knobs))
    sol = least_squares(residuals, x0, bounds=(-bound, bound), x_scale=1.0, diff_step=1e-3)
    return {k: float(math.exp(v)) for k, v in zip(knobs, sol.x)}


def fit(predict: Predictor, measured: Sequence[float], knobs: Sequence[str], *, leave_one_out: bool = True,
        prior_weight: float = PRIOR_WEIGHT) -> Fit:
    """Fit on every run, and (optionally) refit without each run to predict it out of sample."""
    measured = [float(m) for m in measured]
    before = [float(x) for x in predict({})]
    scales = fit_scales(predict, measured, knobs, prior_weight=prior_weight)
    after = [float(x) for x in predict(scales)]
    loo: list[float] = []
    if leave_one_out and len(measured) >= 3:
        for i in range(len(measured)):
            keep = [j for j in range(len(measured)) if j != i]

            def sub(scales_: Mapping[str, float], keep=keep) -> list[float]:
                full = predict(scales_)
                return [full[j] for j in keep]

            s_i = fit_scales(sub, [measured[j] for j in keep], knobs, prior_weight=prior_weight)
            loo.append(float(predict(s_i)[i]))
    return Fit(scales, measured, before, after, loo)


def simulator_predictor(programs: Sequence[DistProgram], cluster: Cluster,
                        optimizers: Sequence[str] | None = None) -> Predictor:
    """Predicted seconds per iteration of each program on ``cluster`` with the knobs applied."""
    opts = list(optimizers or ["adamw"] * len(programs))

    def predict(scales: Mapping[str, float]) -> list[float]:
        cl = apply_knobs(cluster, scales)
        return [simulate(p, cl, optimizer=o).iteration_seconds for p, o in zip(programs, opts)]

    return predict


# ---- writing the fitted numbers back ----------------------------------------------------------

def fitted_cluster_data(data: Mapping[str, Any], cluster: Cluster, scales: Mapping[str, float]) -> dict[str, Any]:
    """The cluster-file dict ``data`` (which parses to ``cluster``) with the fitted numbers in it."""
    from profiler.clusterfile import group_slots, sig

    out = copy.deepcopy(dict(data))
    tuned = apply_knobs(cluster, scales)
    eff = dict(tuned.efficiency)
    flops_excess = max(1.0, max(eff[c] for c in FLOP_CLASSES))
    hbm_excess = max(1.0, eff["hbm"])
    out["efficiency"] = {c: sig(eff[c] / flops_excess) for c in FLOP_CLASSES}
    out["efficiency"]["hbm"] = sig(eff["hbm"] / hbm_excess)
    if flops_excess > 1.0 or hbm_excess > 1.0:
        for _, group, ranks in group_slots(out):
            dev = cluster.devices[ranks[0]]
            for key in ("peak_flops", "tflops", "hbm_Bps", "hbm_GBps"):
                group.pop(key, None)
            group["tflops"] = {dt: sig(v * flops_excess / 1e12) for dt, v in dev.peak_flops.items()}
            group["hbm_GBps"] = sig(dev.hbm_bandwidth_Bps * hbm_excess / 1e9)
    out.pop("launch_latency_s", None)
    out["launch_latency_us"] = sig(tuned.launch_latency_seconds * 1e6)
    host = 0
    for node in out.get("nodes") or []:
        if node.get("intra_link") is not None and tuned.nodes[host].intra_link is not None:
            node["intra_link"] = _link_entry(node["intra_link"], tuned.nodes[host].intra_link)
        host += int(node.get("count", 1))
    if out.get("network") is not None and tuned.network is not None:
        out["network"] = _link_entry(out["network"], tuned.network)
    parse_cluster(out, "<calibrated cluster>")       # must still be a valid file
    return out


def _link_entry(old: Any, link: Link) -> dict[str, Any]:
    from profiler.clusterfile import link_numbers

    name = old if isinstance(old, str) else (old.get("name") or old.get("type") or link.name)
    return {"name": name, **link_numbers(link)}


def write_fitted(path: str | Path, scales: Mapping[str, float], note: str = "") -> None:
    """Rewrite the cluster file at ``path`` with the fitted numbers, keeping its header comments."""
    from profiler.clusterfile import write_cluster_file

    path = Path(path)
    text = path.read_text()
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if "hapc calibrate" not in line:
            header.append(line)
    data = yaml.safe_load(text)
    cluster = parse_cluster(data, str(path))
    new = fitted_cluster_data(data, cluster, scales)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    factors = ", ".join(f"{k} x{v:.3g}" for k, v in scales.items())
    header.append(f"# Fitted by `hapc calibrate` at {when}: {factors}{'; ' + note if note else ''}.")
    write_cluster_file(path, new, header)


# ---- running plans ----------------------------------------------------------------------------

@dataclass
class Run:
    """One plan of one model, predicted and measured."""

    model: str
    kwargs: dict[str, Any]
    plan: str
    predicted_seconds: float
    measured_seconds: float
    step_seconds: list[float]
    plan_data: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def key(self) -> tuple:
        return (self.model, json.dumps(self.kwargs, sort_keys=True), self.plan)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "kwargs": self.kwargs, "plan": self.plan,
                "predicted_seconds": self.predicted_seconds, "measured_seconds": self.measured_seconds,
                "step_seconds": self.step_seconds, "plan_data": self.plan_data}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Run:
        return Run(d["model"], dict(d["kwargs"]), d["plan"], float(d["predicted_seconds"]),
                   float(d["measured_seconds"]), list(d["step_seconds"]), dict(d.get("plan_data") or {}))


def make_plans(model_file: str, overrides: Mapping[str, Any], cluster: Cluster, names: Sequence[str],
               say: Callable[[str], None] = lambda m: None) -> tuple[list[tuple[str, Any]], Any, list[str]]:
    """The plans to run (name, Plan), the traced model, and a note per plan left out and why."""
    from hapc.api import baseline, synthesize
    from hapc.frontend.modelfile import load_model_file
    from hapc.frontend.tracer import trace

    mf = load_model_file(model_file, dict(overrides))
    say(f"tracing {model_file}")
    try:
        traced = trace(mf.build_model(device="meta"), tuple(t.to("meta") for t in mf.build_inputs()))
    except UserError:
        traced = trace(mf.build_model(), mf.build_inputs())
    plans: list[tuple[str, Any]] = []
    notes: list[str] = []
    seen: dict[str, str] = {}
    path = str(Path(model_file).resolve())
    for name in names:
        say(f"planning {name}")
        try:
            if name == "hapc":
                plan = synthesize(traced, None, cluster, model_file=path, model_kwargs=dict(overrides))
            else:
                plan = baseline(traced, None, cluster, name, model_file=path, model_kwargs=dict(overrides))
        except (UserError, ValueError, KeyError) as exc:
            notes.append(f"{name}: not planned ({str(exc).splitlines()[0][:120]})")
            continue
        body = json.dumps([plan.to_dict()[k] for k in ("shares", "source_layouts", "steps")], sort_keys=True)
        if body in seen:
            notes.append(f"{name}: the same program as {seen[body]}; run once")
            continue
        seen[body] = name
        plans.append((name, plan))
    return plans, traced, notes


def emit_plan(plan: Any, out_dir: Path, traced: Any = None) -> Path:
    """Emit with the cluster (so "auto" collectives run the variant that was priced)."""
    from hapc.codegen import emit

    kwargs = {"model_kwargs": plan.model.get("kwargs", {}), "optimizer": plan.model.get("optimizer", "adamw"),
                  "plan_summary": plan.summary()}
    try:
        return Path(emit(plan.program, plan.model["file"], str(out_dir), cluster=plan.cluster,
                         constants=getattr(traced, "constants", None), **kwargs))
    except TypeError:                  # an emitter without the cluster/constants arguments
        return Path(plan.emit(out_dir))


def run_plans(model_file: str, overrides: Mapping[str, Any], cluster: Cluster, names: Sequence[str], *,
              steps: int = 6, repeats: int = 1, affinity: str | None = None, workdir: str | Path | None = None,
              timeout_seconds: float = 300.0, device: str = "cpu",
              say: Callable[[str], None] = lambda m: None) -> tuple[list[Run], list[str]]:
    """Plan, emit and run each plan of the model; the runs that worked and notes on the others.

    With ``repeats`` > 1 the plans run in alternating rounds and each plan's measured time is
    the median over its rounds: on a machine shared with other work, the load then drifts
    over all plans alike instead of favouring the plans that happened to run in a quiet minute.
    """
    from profiler.launch import run_program

    plans, traced, notes = make_plans(model_file, overrides, cluster, names, say)
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="hapc-calibrate-"))
    programs = {}
    for name, plan in plans:
        out = base / Path(model_file).stem / name
        programs[name] = emit_plan(plan, out, traced)
        plan.save(out / "plan.json")            # for hapc simulate/explain of what ran
    measured: dict[str, list[float]] = {name: [] for name in programs}
    steps_seen: dict[str, list[float]] = {name: [] for name in programs}
    failed: set[str] = set()
    for round_ in range(max(1, repeats)):
        for name, plan in plans:
            if name in failed:
                continue
            say(f"running {name} on {cluster.world} {device} ranks ({steps} steps"
                + (f", round {round_ + 1}/{repeats})" if repeats > 1 else ")"))
            result = run_program(programs[name], cluster.world, steps=steps, affinity=affinity,
                                 timeout_seconds=timeout_seconds, device=device)
            if not result.ok:
                notes.append(f"{name}: run failed ({result.error})")
                failed.add(name)
                continue
            say(f"{name}: measured {result.measured_seconds * 1e3:.1f} ms/step, predicted {plan.cost * 1e3:.1f} ms")
            measured[name].append(result.measured_seconds)
            steps_seen[name] += result.step_seconds
    runs = [Run(Path(model_file).name, dict(overrides), name, plan.cost, statistics.median(measured[name]),
                steps_seen[name], plan.to_dict()) for name, plan in plans if name not in failed]
    return runs, notes


def programs_of(runs: Sequence[Run]) -> list[tuple[DistProgram, str]]:
    from hapc.plan.plan import Plan

    out = []
    for r in runs:
        plan = Plan.from_dict(r.plan_data)
        out.append((plan.program, plan.model.get("optimizer", "adamw")))
    return out


# ---- the report -------------------------------------------------------------------------------

def format_report(runs: Sequence[Run], result: Fit, notes: Sequence[str] = ()) -> str:
    ms = 1e3
    lines = [(f"{'model':<10} {'plan':<12} {'measured ms':>11} {'predicted ms':>12} {'error':>7} "
             f"{'fitted ms':>10} {'error':>7}")]
    for i, r in enumerate(runs):
        b, a, m = result.before[i], result.after[i], result.measured[i]
        lines.append(f"{Path(r.model).stem[:10]:<10} {r.plan:<12} {m * ms:11.2f} {b * ms:12.2f} "
                     f"{(b - m) / m * 100:+6.0f}% {a * ms:10.2f} {(a - m) / m * 100:+6.0f}%")
    lines.append(f"rank correlation (Spearman): {result.rho_before:.3f} before, {result.rho_after:.3f} after fitting")
    lines.append(f"pairs of plans measured more than 5% apart that the model orders right: "
                 f"{result.pairs_before * 100:.0f}% before, {result.pairs_after * 100:.0f}% after")
    lines.append(f"median relative error: {result.error_before * 100:.1f}% before, {result.error_after * 100:.1f}% "
                 f"after" + (f" ({result.error_leave_one_out * 100:.1f}% leave-one-out)" if result.leave_one_out
                             else ""))
    lines.append("fitted factors: " + ", ".join(f"{k} x{v:.3g}" for k, v in result.scales.items()))
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def calibrate(model_file: str, cluster_path: str, *, overrides: Mapping[str, Any] | None = None,
              plans: Sequence[str] = DEFAULT_PLANS, steps: int = 6, repeats: int = 1, affinity: str | None = None,
              knobs: Sequence[str] = GLOBAL_KNOBS, runs_path: str | None = None, write: bool = False,
              workdir: str | None = None, timeout_seconds: float = 300.0, device: str = "auto",
              sizes: Sequence[Mapping[str, Any]] = (),
              say: Callable[[str], None] = lambda m: None) -> tuple[list[Run], Fit, list[str]]:
    """Run, compare, fit (and write): the library form of ``hapc calibrate``.

    ``sizes``: model configs (each merged over ``overrides``) to run in turn, so that one
    device, where every plan is the same program, still gives the fit several runs."""
    cluster = load_cluster(cluster_path)
    device = run_device(device, cluster)
    plans = [p for p in plans if p != "none"]        # "none": refit the --runs file, run nothing
    unknown = [p for p in plans if p not in DEFAULT_PLANS]
    if unknown:
        raise UserError(f"--plans: unknown plan {unknown[0]!r}; expected some of {', '.join(DEFAULT_PLANS)}")
    if affinity is None:
        from profiler.profile import read_affinity

        affinity = read_affinity(cluster_path)
        if affinity:
            say(f"pinning ranks {affinity} as the cluster file was profiled")
    runs, notes = [], []
    for size in (list(sizes) or [{}]) if plans else []:
        got, why = run_plans(model_file, {**(overrides or {}), **size}, cluster, plans, steps=steps,
                             repeats=repeats, affinity=affinity, workdir=workdir, timeout_seconds=timeout_seconds,
                             device=device, say=say)
        runs += got
        notes += why
    if runs_path:
        earlier = []
        if Path(runs_path).is_file():
            earlier = [Run.from_dict(d) for d in json.loads(Path(runs_path).read_text())]
        fresh = {r.key for r in runs}
        runs = [r for r in earlier if r.key not in fresh] + runs
        Path(runs_path).write_text(json.dumps([r.to_dict() for r in runs]) + "\n")
    if not runs:
        raise UserError("no plan ran; nothing to compare (" + "; ".join(notes) + ")")
    if any(_world_of(r) != cluster.world for r in runs):
        raise UserError(f"{runs_path}: its runs are for another number of devices than {cluster_path}")
    progs = programs_of(runs)
    say(f"fitting {', '.join(knobs)} to {len(runs)} run(s)")
    result = fit(simulator_predictor([p for p, _ in progs], cluster, [o for _, o in progs]),
                 [r.measured_seconds for r in runs], knobs, leave_one_out=len(runs) >= 4)
    if write:
        write_fitted(cluster_path, result.scales, note=f"{len(runs)} runs, median error "
                     f"{result.error_before * 100:.0f}% -> {result.error_after * 100:.0f}%")
        notes.append(f"wrote the fitted numbers into {cluster_path}")
    return runs, result, notes


def run_device(device: str, cluster: Cluster) -> str:
    """Where calibration runs its programs: ``cpu`` or ``cuda`` as asked, or for ``auto`` the
    cluster's kind: GPUs when its devices are not CPUs and this machine has a GPU per rank of
    a node (NCCL refuses two ranks on one GPU), else CPU ranks. On one GPU, calibrate a
    world-1 cluster with several sizes of a model, accumulating them with ``--runs``."""
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device {device!r}: expected cpu, cuda or auto")
    per_node = max(len(h.devices) for h in cluster.nodes)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device is available here")
        if torch.cuda.device_count() < per_node:
            raise UserError(f"--device cuda: the cluster has {per_node} devices per node, this machine "
                            f"{torch.cuda.device_count()} GPU(s) (NCCL needs one GPU per rank)")
        return "cuda"
    if device == "auto":
        gpus = not all(d.type.lower().startswith("cpu") for d in cluster.devices)
        return "cuda" if gpus and torch.cuda.is_available() and torch.cuda.device_count() >= per_node else "cpu"
    return device


def _world_of(run: Run) -> int:
    return len(run.plan_data.get("shares", []))


def calibrate_cli(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    from hapc.frontend.modelfile import parse_overrides

    runs, result, notes = calibrate(args.model, args.cluster, overrides=parse_overrides(args.set),
                                    plans=[p.strip() for p in args.plans.split(",") if p.strip()],
                                    steps=max(2, args.steps), repeats=max(1, args.repeats), affinity=args.affinity,
                                    knobs=parse_knobs(args.fit),
                                    runs_path=args.runs, write=args.write, workdir=args.workdir,
                                    timeout_seconds=args.timeout, device=args.device,
                                    sizes=[parse_overrides(s.split(",")) for s in args.size], say=say)
    print(format_report(runs, result, notes))
    return 0
