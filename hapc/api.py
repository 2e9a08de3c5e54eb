"""The Python API: ``synthesize``, ``baseline`` and ``load_cluster``.

    from hapc import synthesize
    plan = synthesize(model, inputs, "configs/clusters/small-mixed.yaml")
    print(plan.summary()); plan.save("plan.json")

A model built on the meta device plans without allocating its weights, so a 70B-parameter
model can be planned on a laptop.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costmodel.cluster import Cluster, load_cluster
from hapc.errors import UserError
from hapc.ir.precision import Precision, autocast_graph, check_precision
from hapc.plan.plan import Plan
from hapc.frontend.cache.store import CachedTrace

if TYPE_CHECKING:
    import torch

    from hapc.frontend.from_file import ModelFileTrace
    from hapc.frontend.tracer import Traced


def _traced(model: torch.nn.Module | Traced | CachedTrace, inputs: Sequence[torch.Tensor] | None) -> Traced:
    # Imported here: a graph from the trace cache plans without torch (see hapc.frontend.cache.store).
    if isinstance(model, CachedTrace):
        return model
    from hapc.frontend.tracer import Traced, trace

    if isinstance(model, Traced):
        return model
    if inputs is None:
        raise TypeError("inputs are needed to trace a model")
    if _on_meta(model):
        inputs = tuple(t.to("meta") for t in inputs)
    return trace(model, inputs)


def _on_meta(model: torch.nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def synthesize(model: torch.nn.Module | Traced | ModelFileTrace | str | os.PathLike, inputs: Sequence[torch.Tensor] | None,
               cluster: str | Mapping[str, Any] | Cluster, *, time_budget: float | None = None,
               optimizer: str = "adamw", backend: str = "highs", model_file: str | None = None,
               model_kwargs: Mapping[str, Any] | None = None,
               progress: Callable[[str], None] | None = None, precision: str = "fp32",
               stages: int | str | None = None, microbatches: int | None = None,
               schedule: str | None = None, trace_cache: bool = True) -> Plan:
    """Search for the fastest SPMD program of ``model(*inputs)`` (a scalar loss) on ``cluster``.

    ``time_budget`` (seconds) bounds the search; the plan then says how far from proven
    optimal it may be. ``model_file``/``model_kwargs`` let ``plan.emit`` rebuild the model.
    ``precision`` is ``"fp32"``, ``"bf16"`` or ``"fp16"`` (autocast with float32 master weights,
    fp16 with dynamic loss scaling; the search prices the graph as autocast runs it, see
    :mod:`hapc.ir.precision`), or ``"auto"``: bf16, fp16 or fp32, whichever every device of
    the cluster computes fastest (:mod:`costmodel.precision_choice`).
    ``stages="auto"`` also searches pipelines (stages on device groups, each with its own
    SPMD program; see :mod:`synth.stages`) and keeps one when it is predicted faster; an
    integer forces that many stages, ``microbatches``/``schedule`` ("1f1b", "gpipe") force
    those; ``plan.emit`` writes one program for every rank (:mod:`hapc.codegen.pipeline_emit`).

    ``model`` may also be the path of a model file (``model()``/``inputs()``, design.md
    section 3; ``model_kwargs`` its overrides): it is traced as ``hapc compile`` traces it
    (:mod:`hapc.frontend.from_file`), through the trace cache unless ``trace_cache=False``
    (:mod:`hapc.frontend.cache.store`; a live ``nn.Module`` is never cached: what decides its
    graph is not all in files), or a :class:`hapc.frontend.from_file.ModelFileTrace` already
    made, as the command line makes it.
    """
    from hapc.frontend.from_file import ModelFileTrace

    if isinstance(model, (str, os.PathLike)):
        model_file = model_file or str(Path(model).resolve())
        with _trace_file(model, model_kwargs or {}, cluster, trace_cache, progress) as from_file:
            return synthesize(from_file, inputs, cluster, time_budget=time_budget, optimizer=optimizer,
                              backend=backend, model_file=model_file, model_kwargs=model_kwargs,
                              progress=progress, precision=precision, stages=stages,
                              microbatches=microbatches, schedule=schedule)
    from_file = model if isinstance(model, ModelFileTrace) else None
    return _synthesize(from_file.traced if from_file else _traced(model, inputs), cluster, from_file,
                       time_budget=time_budget, optimizer=optimizer, backend=backend, model_file=model_file,
                       model_kwargs=model_kwargs, progress=progress, precision=precision, stages=stages,
                       microbatches=microbatches, schedule=schedule)


def _synthesize(traced: Traced, cluster: str | Mapping[str, Any] | Cluster, from_file: Any, *,
                time_budget: float | None, optimizer: str, backend: str, model_file: str | None,
                model_kwargs: Mapping[str, Any] | None, progress: Callable[[str], None] | None,
                precision: str, stages: int | str | None, microbatches: int | None,
                schedule: str | None) -> Plan:
    from synth.synthesize import synthesize_program

    cl = load_cluster(cluster)
    numerics = _precision(precision, cl)
    if stages is not None or microbatches is not None or schedule is not None:
        _check_stage_options(traced, 1 if stages is None else stages, microbatches, schedule)   # before any search
    graph = autocast_graph(traced.graph, numerics.name)
    if isinstance(traced, CachedTrace):
        traced.install_strategies(graph, numerics.name)    # the search then needs no sharding rules
    staged = stages is not None and stages != 1
    planner = _stage_planner(graph, cl, optimizer, progress) if staged else None
    try:
        # A one-stage program that does not fit is no error yet: gradient accumulation holds one
        # micro-batch's activations, and pipelines a share of the layers per device.
        result = synthesize_program(graph, cl, time_budget=time_budget, optimizer=optimizer,
                                    backend=backend, progress=progress, require_fit=False)
    except BaseException:
        if planner is not None:
            planner.close()                  # stops the child start_groups began
        raise
    best = result.best
    search = {}
    if best.search is not None:
        search = {"exact": best.search.exact, "gap": best.search.gap, "segments": best.search.segments,
                  "distinct_segments": best.search.distinct_segments,
                  "states_expanded": best.search.states_expanded, "rounds": len(result.rounds)}
    baselines = {k: c.seconds for k, c in result.baselines.items()}
    pipeline = None
    if staged:
        one_stage = best.seconds if best.fits else float("inf")
        pipeline = _pipeline(planner, stages, microbatches, schedule, baselines, one_stage, _memory_binds(result))
        if pipeline is not None and stages == "auto" and pipeline.iteration_seconds >= one_stage:
            pipeline = None        # one stage over all devices is still the fastest
    levers = ["sharding", "uneven shares", "ZeRO-1/2/3", "activation recomputation"] + \
        (["pipeline stages"] if staged else [])
    forced_accumulation = not staged and microbatches is not None and microbatches > 1
    if forced_accumulation or (_memory_binds(result) and stages in (None, 1, "auto")):
        before = pipeline
        pipeline, tried = _accumulated(planner, graph, cl, optimizer, progress, best.program, microbatches, pipeline)
        levers.append(tried)
        if pipeline is not before and not forced_accumulation and best.fits and \
                pipeline.iteration_seconds >= best.seconds:
            pipeline = before          # accumulating costs more than the memory it frees gains
    if not best.fits and pipeline is None:
        _raise_memory(best, cl, optimizer, backend, levers)
    if from_file is not None and pipeline is None:
        from_file.keep_strategies(graph, numerics.name)      # the next hit searches without the rules
    return Plan(best.program, cl, best.sim, "hapc" if pipeline is not None else best.name, baselines, search,
                _model_info(model_file, model_kwargs, optimizer), _assumed(numerics, cl), pipeline,
                baseline_shortfall=result.baseline_shortfall)


def _trace_file(path: str | os.PathLike, kwargs: Mapping[str, Any], cluster: str | Mapping[str, Any] | Cluster,
                use_cache: bool, progress: Callable[[str], None] | None) -> ModelFileTrace:
    """A model file's trace for a library caller (:mod:`hapc.frontend.from_file`), made for the
    device type ``cluster``'s program runs on (as ``hapc compile`` makes it), through the
    trace cache unless ``use_cache`` is false; cache notes go to ``progress`` (else stderr)."""
    from hapc.codegen.launch import run_device
    from hapc.frontend.cache.store import TraceCache
    from hapc.frontend.from_file import trace_file

    def note(msg: str) -> None:
        (progress or (lambda m: print(f"hapc: note: {m}", file=sys.stderr)))(msg)

    return trace_file(path, kwargs, cache=TraceCache(note=note) if use_cache else None,
                      device=run_device(load_cluster(cluster)))


def _check_stage_options(traced: Traced, stages: int | str, microbatches: int | None,
                         schedule: str | None) -> None:
    """One-line errors for stage options that cannot work, each naming the number."""
    from hapc.errors import UserError
    from synth.stages import SCHEDULES
    from synth.stagespace import batch_size

    if stages != "auto" and (isinstance(stages, bool) or not isinstance(stages, int) or stages < 1):
        raise UserError(f"--stages {stages}: expected a positive number of stages or 'auto'")
    if microbatches is not None and microbatches < 1:
        raise UserError(f"--microbatches {microbatches}: expected a positive number")
    if microbatches is not None and microbatches > batch_size(traced.graph):
        raise UserError(f"--microbatches {microbatches} is more than the batch of {batch_size(traced.graph)} samples")
    if microbatches is not None and microbatches > 1:      # refused in one line if samples are coupled
        from synth.microbatching import loss_split

        loss_split(traced.graph)
    if schedule is not None and schedule not in SCHEDULES:
        raise UserError(f"--schedule {schedule}: expected one of {', '.join(SCHEDULES)}")


def _stage_planner(graph, cluster: Cluster, optimizer: str, progress) -> Any:
    """The stage planner, its device groups already being searched in a child process beside
    the one-stage search that comes next (:meth:`synth.stages.StagePlanner.start_groups`)."""
    from synth.stages import StagePlanner

    planner = StagePlanner(graph, cluster, optimizer=optimizer, progress=progress)
    planner.start_groups()
    return planner


def _pipeline(planner, stages: int | str, microbatches: int | None, schedule: str | None,
              baselines: dict[str, float], one_stage_seconds: float, memory_binds: bool) -> Any:
    """The best pipeline (None if none fits or, with ``stages="auto"``, none beats the best
    one-stage plan and the pipeline-even baseline) and, as a side effect, that baseline. Where
    memory binds, stages with memory levers (layers recomputed, weights stored sharded) are
    planned too (:class:`synth.stages.LeverPlanner`, :func:`_stage_levers`)."""
    from hapc.errors import UserError
    from synth.stages import LeverPlanner, best_sub_cluster, pipeline_even

    even = pipeline_even(planner)
    if even is not None:
        baselines["pipeline-even"] = float(even.iteration_seconds)
    forced = None if stages == "auto" else int(stages)
    # Only a pipeline faster than both the one-stage plan and pipeline-even can win "auto":
    # the planner prunes every candidate that cannot beat that bound.
    incumbent = None if forced is not None else min(
        one_stage_seconds, even.iteration_seconds if even is not None else float("inf"))
    pipe = planner.plan(stages=forced, microbatches=microbatches, schedule=schedule, incumbent_seconds=incumbent)
    if memory_binds:             # stages that recompute their layers, and store their weights sharded
        for name, lever in _stage_levers():
            bound = min([s for s in (incumbent, pipe.iteration_seconds if pipe is not None else None) if s is not None],
                        default=None)
            levered = LeverPlanner(planner, lever).plan(stages=forced, microbatches=microbatches, schedule=schedule,
                                                        incumbent_seconds=bound)
            planner.say(f"pipeline: stages with {name}: " + (
                "none that fits is faster" if levered is None else f"{levered.iteration_seconds * 1e3:.3f} ms/iter"))
            if levered is not None and (pipe is None or levered.iteration_seconds < pipe.iteration_seconds):
                pipe = levered
    unforced = forced is None and microbatches is None and schedule is None
    if even is not None and unforced and (pipe is None or even.iteration_seconds < pipe.iteration_seconds):
        pipe = even            # never worse than the pipeline-even baseline
    if unforced:               # never worse than a node, or a run of alike nodes, alone
        alone = best_sub_cluster(planner)
        if alone is not None and alone.iteration_seconds < min(
                one_stage_seconds, pipe.iteration_seconds if pipe is not None else float("inf")):
            pipe = alone
    if pipe is None and forced is not None:
        raise UserError(f"--stages {forced}: no {forced}-stage pipeline fits in memory on this cluster")
    return pipe


def _stage_levers() -> list[tuple[str, Callable[[Any], Any]]]:
    """The memory levers a pipeline's stages are planned with where memory binds, each a pass
    of the stage search: layers recomputed, then also weights stored sharded (ZeRO-3 inside
    each stage's group, gathered for each micro-batch)."""
    from synth.levers import with_recompute
    from synth.zero import with_sharded_storage

    def both(program: Any) -> Any:
        return with_sharded_storage(with_recompute(program) or program)

    return [("recomputed layers", with_recompute), ("recomputed layers and weights stored sharded", both)]


def _memory_binds(result: Any) -> bool:
    """Whether memory shapes the best one-stage plan of ``result`` (a
    :class:`synth.synthesize.Synthesis`): it does not fit, or the search or a baseline found a
    faster plan that did not fit (the share LP moved work for memory's sake, or sharded
    parameter storage was chosen for it), which gradient accumulation might run in less memory."""
    best = result.best
    return not best.fits or any(not r["fits"] and r["seconds"] < best.seconds for r in result.rounds) or \
        any(not c.fits and c.seconds < best.seconds for c in result.baselines.values())


def _accumulated(planner, graph, cluster: Cluster, optimizer: str, progress, program, microbatches: int | None,
                 pipeline: Any) -> tuple[Any, str]:
    """``pipeline`` or gradient accumulation (:func:`synth.accumulation.accumulation`), whichever is
    faster, and what was tried, for an error; forced with ``microbatches`` (then an error when it
    does not fit). The one-stage plan is kept when it fits and is faster: the caller compares."""
    from synth.accumulation import accumulation
    from synth.stages import StagePlanner

    if planner is None:
        planner = StagePlanner(graph, cluster, optimizer=optimizer, progress=progress)
    if progress is not None:
        progress("gradient accumulation: pricing micro-batches over all devices")
    accumulated = accumulation(planner, microbatches, programs=[program],
                               incumbent_seconds=None if pipeline is None else pipeline.iteration_seconds)
    if accumulated is None and microbatches is not None and microbatches > 1 and pipeline is None:
        raise UserError(f"--microbatches {microbatches}: gradient accumulation over {microbatches} micro-batches "
                        f"of {planner.batch // microbatches} samples does not fit in memory on this cluster")
    counts = [m for m in planner.microbatch_counts([planner.group(range(cluster.world))]) if m > 1]
    tried = f"gradient accumulation up to {counts[-1]} micro-batches" if counts else \
        "no gradient accumulation (the model's samples are coupled)" if not planner.splits_batch() else \
        "no gradient accumulation (too few samples per device)"
    if accumulated is not None and (pipeline is None or accumulated.iteration_seconds < pipeline.iteration_seconds):
        return accumulated, tried
    return pipeline, tried


def _raise_memory(best: Any, cluster: Cluster, optimizer: str, backend: str, levers: list[str]) -> None:
    """The one-line error when no plan fits: the memory missing per device and the levers tried."""
    from synth.loads import MemoryInfeasible
    from synth.synthesize import raise_memory

    try:
        raise_memory(best, cluster, optimizer, backend)
    except MemoryInfeasible as exc:
        raise MemoryInfeasible(f"{exc} (tried: {', '.join(levers)})", exc.missing_bytes) from None


def baseline(model: torch.nn.Module | Traced | str | os.PathLike, inputs: Sequence[torch.Tensor] | None,
             cluster: str | Mapping[str, Any] | Cluster, name: str, *, optimizer: str = "adamw",
             model_file: str | None = None, model_kwargs: Mapping[str, Any] | None = None,
             precision: str = "fp32", trace_cache: bool = True) -> Plan:
    """One of the standard strategies (``dp-even``, ``dp-flops``, ``megatron-tp``, ``zero3``)
    as a plan, scored by the same cost model. ``model`` may be a model file's path, traced as
    :func:`synthesize` traces it."""
    from costmodel.simulator import simulate
    from synth.baselines import baseline_program

    _precision(precision, None)              # a bad name fails before any tracing
    if isinstance(model, (str, os.PathLike)):
        model_file = model_file or str(Path(model).resolve())
        with _trace_file(model, model_kwargs or {}, cluster, trace_cache, None) as from_file:
            traced = from_file.traced
    else:
        traced = _traced(model, inputs)
    cl = load_cluster(cluster)
    numerics = _precision(precision, cl)
    program = baseline_program(name, autocast_graph(traced.graph, numerics.name), cl)
    return Plan(program, cl, simulate(program, cl, optimizer=optimizer), name, {}, {},
                _model_info(model_file, model_kwargs, optimizer), _assumed(numerics, cl))


def _precision(name: str, cluster: Cluster | None) -> Precision:
    """The precision to plan: ``name`` checked, and with a cluster ``auto`` resolved and
    ``fp16`` refused on devices without an fp16 rate (:mod:`costmodel.precision_choice`)."""
    from costmodel.precision_choice import resolve_precision

    try:
        check_precision(name)
    except ValueError as exc:
        raise UserError(str(exc), where="precision") from None
    if cluster is None:
        return Precision(name)
    chosen, why = resolve_precision(name, cluster)
    return Precision(chosen, auto=why)


def _assumed(numerics: Precision, cluster: Cluster) -> Precision:
    """What the plan records: TF32 as the cluster file says (the compute model priced fp32
    products at the TF32 peak exactly then), gradients reduced in float32 (the master
    weights' dtype, as DDP under autocast does; bf16 would halve those bytes but round every
    summed gradient, and fp16's loss-scaled gradients could overflow in the sum itself)."""
    return Precision(numerics.name, cluster.allow_tf32, "fp32", numerics.auto)


def _model_info(model_file: str | None, kwargs: Mapping[str, Any] | None, optimizer: str) -> dict[str, Any]:
    info: dict[str, Any] = {"optimizer": optimizer}
    if model_file:
        info["file"] = str(model_file)
        info["kwargs"] = dict(kwargs or {})
    return info


__all__ = ["Plan", "baseline", "load_cluster", "synthesize"]
