"""One whole-chain fuzz case: trace, synthesize (and the baselines), execute, check invariants.

:func:`check_case` raises ``AssertionError`` naming the broken promise, so hypothesis can
shrink a failing case to its smallest form. What it checks, for a random model and cluster:

* the tracer: the traced graph run replicated in float64 gives the module's own loss and
  gradients (tied weights summed over their names);
* every program (the synthesized plan and each standard baseline) is well formed: each
  graph node computed exactly once, in order, with a registered strategy, every value read in
  the layout that strategy wants; the shares are non-negative, one per device, sum to 1;
* every program computes the model: the in-process executor on ``world`` simulated ranks
  gives the single-device loss and every parameter gradient (float64, tight tolerance);
* the plan fits each device's memory, or synthesis fails with the one-line ``GB missing``
  error;
* ``plan.json`` is deterministic: a second synthesis gives the byte-identical file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import torch

import hapc
from costmodel.cluster import Cluster, load_cluster
from costmodel.simulator import simulate
from hapc.codegen.executor import replicated_program, run
from hapc.ir.layout import Shard
from hapc.ir.program import DistProgram, Redistribute
from hapc.rules.registry import strategies
from synth.baselines import BASELINES, baseline_program
from synth.ratios import MemoryInfeasible
from tests.fuzz.models import ClusterSpec, ModelSpec

TOLERANCE = 1e-9          # float64, relative to the size of the value compared
# The one-line error when nothing fits: how many GB are missing on which device.
_MISSING = re.compile(r"^[^\n]*\b[0-9.e+-]+ GB missing on \S+#\d+[^\n]*$")


@dataclass
class Outcome:
    """What one whole-chain case did (the fuzz tests record it as hypothesis events)."""

    plan_name: str = ""
    shares: tuple[float, ...] = ()
    empty_pieces: list[str] = field(default_factory=list)
    infeasible: str = ""
    max_err: float = 0.0


def replicated_bytes(traced) -> float:
    """Peak memory of the model trained on one device: the unit of :class:`ClusterSpec` memory."""
    one = load_cluster({"nodes": [{"devices": [{"name": "one", "tflops": 1, "memory_GB": 1e6,
                                                "hbm_GBps": 10, "count": 1}]}]})
    return max(simulate(replicated_program(traced.graph), one).memory.totals)


def check_case(model_spec: ModelSpec, cluster_spec: ClusterSpec, *, determinism: bool = True,
               baselines: tuple[str, ...] = BASELINES) -> Outcome:
    model, inputs = model_spec.build()
    traced = hapc.trace(model, inputs)
    graph = traced.graph
    reference = run(replicated_program(graph), traced, inputs, dtype=torch.float64)
    _assert_matches_module(traced, inputs, reference)

    cluster = load_cluster(cluster_spec.to_dict(replicated_bytes(traced)))
    outcome = Outcome()
    fitting: dict[str, float] = {}      # baseline -> predicted seconds, when it fits
    for name in baselines:
        program = baseline_program(name, graph, cluster)
        _assert_well_formed(program, cluster, name)
        _assert_computes_the_model(program, traced, inputs, reference, name)
        outcome.empty_pieces += [f"{name}: {v}" for v in empty_pieces(program)]
        sim = simulate(program, cluster)
        if sim.fits:
            fitting[name] = sim.iteration_seconds

    try:
        plan = hapc.synthesize(traced, None, cluster)
    except MemoryInfeasible as exc:
        text = str(exc)
        assert _MISSING.match(text), f"memory error is not the one-line form: {text!r}"
        assert exc.missing_bytes and all(v > 0 for v in exc.missing_bytes.values()), exc.missing_bytes
        outcome.infeasible = text
        return outcome
    program = plan.program
    _assert_well_formed(program, cluster, plan.name)
    outcome.max_err = _assert_computes_the_model(program, traced, inputs, reference, plan.name)
    caps = cluster.memory_bytes()
    assert all(m <= c * (1 + 1e-9) for m, c in zip(plan.memory, caps)), \
        f"plan does not fit: memory {plan.memory} > capacity {caps}"
    assert all(plan.cost <= s * (1 + 1e-9) for s in fitting.values()), \
        f"plan ({plan.cost:.6g} s) slower than a baseline that fits: {fitting}"
    outcome.plan_name = plan.name
    outcome.shares = tuple(program.shares)
    outcome.empty_pieces += [f"plan: {v}" for v in empty_pieces(program)]
    if determinism:
        again = hapc.synthesize(traced, None, cluster)
        first, second = (json.dumps(p.to_dict(), sort_keys=True, indent=1) for p in (plan, again))
        assert first == second, "plan.json differs between two syntheses of the same case"
    return outcome


def empty_pieces(program: DistProgram) -> list[str]:
    """Every sharded value some rank holds an empty piece of (``value dim=lengths``)."""
    found = []
    for name, lay in program.layouts().items():
        if isinstance(lay, Shard):
            lengths = program.lengths(name, lay.dim)
            if 0 in lengths:
                found.append(f"{name} dim {lay.dim}: {lengths}")
    return found


def _assert_well_formed(program: DistProgram, cluster: Cluster, label: str) -> None:
    graph = program.graph
    shares = program.shares
    assert len(shares) == cluster.world, f"{label}: {len(shares)} shares for {cluster.world} devices"
    assert all(s >= 0 for s in shares) and abs(sum(shares) - 1) < 1e-9, f"{label}: shares {shares}"
    held = dict(program.source_layouts)          # value name -> layout it is held in
    for name in graph.params + graph.buffers + graph.inputs:
        assert name in held, f"{label}: source {name} has no layout"
    done = []
    nodes = {n.name: n for n in graph.nodes}
    for step in program.steps:
        if isinstance(step, Redistribute):
            assert step.src in held, f"{label}: {step.out} redistributes {step.src} before it exists"
            assert held[step.src] == step.src_layout, \
                f"{label}: {step.out} reads {step.src} as {step.src_layout}, it is {held[step.src]}"
            held[step.out] = step.dst_layout
            continue
        node = nodes[step.node]
        assert step.strategy in strategies(node, graph), f"{label}: {node.name} uses an unregistered strategy"
        refs = node.input_refs()
        assert len(step.inputs) == len(refs), f"{label}: {node.name} reads {len(step.inputs)} values"
        for ref, read, lay in zip(refs, step.inputs, step.strategy.inputs):
            assert read.split("@", 1)[0] == ref, f"{label}: {node.name} reads {read} for {ref}"
            assert held.get(read) == lay, f"{label}: {node.name} wants {read} as {lay}, it is {held.get(read)}"
        for out, lay in zip(node.outputs, step.strategy.outputs):
            held[out] = lay
        done.append(node.name)
    assert done == [n.name for n in graph.nodes], f"{label}: nodes computed {done}, graph has {len(graph.nodes)}"
    assert graph.output in held, f"{label}: the loss is never computed"


def _assert_computes_the_model(program: DistProgram, traced, inputs, reference, label: str) -> float:
    got = run(program, traced, inputs, dtype=torch.float64)
    err = _close(got.loss, reference.loss, f"{label}: loss")
    for name, want in reference.grads.items():
        err = max(err, _close(got.grads[name], want, f"{label}: gradient of {name}"))
    return err


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> float:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not got.numel():
        return 0.0
    err = (got - want).abs().max().item()
    scale = max(1.0, want.abs().max().item())
    assert err <= TOLERANCE * scale, f"{what}: max_abs_err={err:.3g} (scale {scale:.3g})"
    return err


def _assert_matches_module(traced, inputs, reference) -> None:
    """The traced graph computes what the module does: loss and (tied-summed) gradients."""
    import copy

    ref = copy.deepcopy(traced.module).double()
    loss = ref(*[x.double() if x.is_floating_point() else x for x in inputs])
    loss.backward()
    _close(reference.loss, loss.detach(), "tracer: loss")
    graph = traced.graph
    names_of: dict[int, list[str]] = {}
    for p in graph.params:
        names_of.setdefault(id(traced.module.get_parameter(graph.values[p].target)), []).append(p)
    for names in names_of.values():
        want = ref.get_parameter(graph.values[names[0]].target).grad
        if want is None:
            continue
        _close(sum(reference.grads[n] for n in names), want, f"tracer: gradient of {names}")
