"""Pipelined plans with the stages a test asks for (groups and layer counts), rather than the
ones the stage search would pick: the tiny test models pipeline best on one rank per stage,
and the runtime must also be shown on multi-rank groups with uneven shares inside."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from costmodel.cluster import load_cluster
from costmodel.groups import sub_cluster
from costmodel.simulator import simulate
from hapc.ir.precision import Precision
from hapc.codegen.launch import run_device
from hapc.frontend.modelfile import load_model_file, trace_for_device
from hapc.plan.plan import Plan
from hapc.frontend.tracer import trace
from synth.levers import with_recompute
from synth.baselines import baseline_program
from synth.stages import StagePlanner, price_stages

ROOT = Path(__file__).resolve().parents[2]


def forced_pipeline(model_file: str | Path, overrides: dict, cluster_file: str | Path,
                    groups: Sequence[Sequence[int]], cut_at: Sequence[float], microbatches: int,
                    schedule: str = "1f1b", group_program: str = "search", traced=None,
                    recompute: bool = False) -> Plan:
    """A plan whose stage ``k`` runs on ``groups[k]`` and ends at the cut candidate nearest the
    fraction ``cut_at[k]`` of the model's cut candidates. Each group's program is the stage
    planner's (``"search"``: A* + share LP on the group) or a baseline's (``"dp-flops"``: data
    parallel with FLOP-proportional, so uneven, shares; fast); ``recompute``: each group's
    program recomputes its layers in backward."""
    if traced is None:
        cl = load_cluster(str(cluster_file))          # traced for its device type, as hapc compile does
        traced = trace_for_device(load_model_file(str(model_file), overrides), trace, run_device(cl))
    graph, cluster = traced.graph, load_cluster(str(cluster_file))
    planner = StagePlanner(graph, cluster)
    inner = planner.cuts[1:-1]
    bounds = [0] + [inner[min(len(inner) - 1, int(f * len(inner)))] for f in cut_at] + [len(graph.nodes)]
    assert len(bounds) == len(groups) + 1 and bounds == sorted(set(bounds)), bounds

    def program_of(ranks):
        if group_program == "search":
            program = planner.group_program(planner.group(ranks))
        else:
            program = baseline_program(group_program, graph, sub_cluster(cluster, ranks))
        return (with_recompute(program) or program) if recompute else program

    specs = [(bounds[k], bounds[k + 1], tuple(g), program_of(tuple(g))) for k, g in enumerate(groups)]
    pipe = price_stages(graph, cluster, specs, microbatches, schedule)
    program = baseline_program("dp-even", graph, cluster)
    model = {"optimizer": "adamw", "file": str(Path(model_file).resolve()), "kwargs": dict(overrides)}
    return Plan(program, cluster, simulate(program, cluster), "hapc", {}, {}, model, Precision(), pipe)
