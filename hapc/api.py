"""The Python API: ``synthesize``, ``baseline`` and ``load_cluster``.

    from hapc import synthesize
    plan = synthesize(model, inputs, "configs/clusters/small-mixed.yaml")
    print(plan.summary()); plan.save("plan.json")

A model built on the meta device plans without allocating its weights, so a 70B-parameter
model can be planned on a laptop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from costmodel.cluster import Cluster, load_cluster
from hapc.errors import UserError
from hapc.ir.precision import Precision, autocast_graph, check_precision
from hapc.plan import Plan
from hapc.tracer import Traced, trace


def _traced(model: torch.nn.Module | Traced, inputs: Sequence[torch.Tensor] | None) -> Traced:
    if isinstance(model, Traced):
        return model
    if inputs is None:
        raise TypeError("inputs are needed to trace a model")
    if _on_meta(model):
        inputs = tuple(t.to("meta") for t in inputs)
    return trace(model, inputs)


def _on_meta(model: torch.nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def synthesize(model: torch.nn.Module | Traced, inputs: Sequence[torch.Tensor] | None,
               cluster: str | Mapping[str, Any] | Cluster, *, time_budget: float | None = None,
               optimizer: str = "adamw", backend: str = "highs", model_file: str | None = None,
               model_kwargs: Mapping[str, Any] | None = None,
               progress: Callable[[str], None] | None = None, precision: str = "fp32") -> Plan:
    """Search for the fastest SPMD program of ``model(*inputs)`` (a scalar loss) on ``cluster``.

    ``time_budget`` (seconds) bounds the search; the plan then says how far from proven
    optimal it may be. ``model_file``/``model_kwargs`` let ``plan.emit`` rebuild the model.
    ``precision`` is ``"fp32"`` or ``"bf16"`` (autocast with float32 master weights; the
    search prices the graph as autocast runs it, see :mod:`hapc.ir.precision`).
    """
    from synth.synthesize import synthesize_program

    numerics = _precision(precision)
    traced = _traced(model, inputs)
    cl = load_cluster(cluster)
    result = synthesize_program(autocast_graph(traced.graph, numerics.name), cl, time_budget=time_budget, optimizer=optimizer,
                                backend=backend, progress=progress)
    best = result.best
    search = {}
    if best.search is not None:
        search = {"exact": best.search.exact, "gap": best.search.gap, "segments": best.search.segments,
                  "distinct_segments": best.search.distinct_segments,
                  "states_expanded": best.search.states_expanded, "rounds": len(result.rounds)}
    return Plan(best.program, cl, best.sim, best.name,
                {k: c.seconds for k, c in result.baselines.items()}, search,
                _model_info(model_file, model_kwargs, optimizer), _assumed(numerics, cl))


def baseline(model: torch.nn.Module | Traced, inputs: Sequence[torch.Tensor] | None,
             cluster: str | Mapping[str, Any] | Cluster, name: str, *, optimizer: str = "adamw",
             model_file: str | None = None, model_kwargs: Mapping[str, Any] | None = None,
             precision: str = "fp32") -> Plan:
    """One of the standard strategies (``dp-even``, ``dp-flops``, ``megatron-tp``, ``zero3``)
    as a plan, scored by the same cost model."""
    from costmodel.simulator import simulate
    from synth.baselines import baseline_program

    numerics = _precision(precision)
    traced = _traced(model, inputs)
    cl = load_cluster(cluster)
    program = baseline_program(name, autocast_graph(traced.graph, numerics.name), cl)
    return Plan(program, cl, simulate(program, cl, optimizer=optimizer), name, {}, {},
                _model_info(model_file, model_kwargs, optimizer), _assumed(numerics, cl))


def _precision(name: str) -> Precision:
    try:
        return Precision(check_precision(name))
    except ValueError as exc:
        raise UserError(str(exc), where="precision") from None


def _assumed(numerics: Precision, cluster: Cluster) -> Precision:
    """What the plan records: TF32 as the cluster file says (the compute model priced fp32
    products at the TF32 peak exactly then), gradients reduced in float32 (the master
    weights' dtype, as DDP under autocast does; bf16 would halve those bytes but round every
    summed gradient)."""
    return Precision(numerics.name, cluster.allow_tf32, "fp32")


def _model_info(model_file: str | None, kwargs: Mapping[str, Any] | None, optimizer: str) -> dict[str, Any]:
    info: dict[str, Any] = {"optimizer": optimizer}
    if model_file:
        info["file"] = str(model_file)
        info["kwargs"] = dict(kwargs or {})
    return info


__all__ = ["Plan", "baseline", "load_cluster", "synthesize"]
