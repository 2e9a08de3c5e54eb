"""The floor under a program's simulated time (costmodel.comm_floor) and what ``hapc replan``
saves with it: the old program is not simulated when its collectives alone are slower than a
searched program, and the plan is the same as when it is."""

from __future__ import annotations

import json

import pytest


from tests.costmodel.cm_programs import chain_graph, custom_cluster, zero3
from tests.process.forking import child_forks  # noqa: F401 (a fixture)

import hapc.elastic.replan  # noqa: E402
from bench.common import HAP8  # noqa: E402
from bench.golden import MODELS, golden_path  # noqa: E402
from costmodel.cluster import Cluster, load_cluster  # noqa: E402
from costmodel.cluster_edit import without_devices  # noqa: E402
from costmodel.collectives import KINDS  # noqa: E402
from costmodel.comm_floor import blocking_comm_floor_seconds  # noqa: E402
from costmodel.simulator import simulate  # noqa: E402
from hapc.ir.program import DistProgram  # noqa: E402
from hapc.plan.plan import Plan  # noqa: E402


def test_the_floor_is_under_the_simulated_collectives_of_every_golden_program():
    """Each golden plan's program on its own cluster, with a device fewer, and on HAP's 8 GPUs
    over two nodes: the floor never exceeds the collectives the simulator ran (let alone the
    iteration), and is not a vacuous zero (the data-parallel ones move nothing before their
    gradient all-reduce, which the floor leaves out; the others do)."""
    positive = 0
    for name in MODELS:
        plan = Plan.load(golden_path(name))
        for cluster in (plan.cluster, without_devices(plan.cluster, [1]), load_cluster(HAP8)):
            program = DistProgram(plan.graph, tuple(cluster.flops_shares()), dict(plan.program.source_layouts),
                                  list(plan.program.steps))
            sim = simulate(program, cluster)
            ran = sum(e.end_seconds - e.start_seconds for e in sim.events
                      if e.phase in ("fwd", "bwd") and e.kind in KINDS)
            floor = blocking_comm_floor_seconds(program, cluster)
            assert 0.0 <= floor <= ran * (1 + 1e-12) <= sim.iteration_seconds * (1 + 1e-12), (name, cluster.name)
            positive += floor > 0
    assert positive >= 3


def _zero3_onto_a_slow_network() -> tuple[Plan, Cluster, list[int]]:
    """A ZeRO-3 plan (every weight gathered before use) on four devices of one node, and the
    same four devices as two nodes of two over a slow network: the old program's gathers
    alone now outlast what a search finds."""
    graph = chain_graph(batch=64, widths=(2048,) * 5, flops_per_layer=1e10)
    device = (10.0, 16.0, 900.0)
    cluster = load_cluster(custom_cluster(devices=(device,) * 4))
    program = zero3(graph, cluster.flops_shares())
    old = Plan(program, cluster, simulate(program, cluster), "zero3", {}, {}, {"optimizer": "adamw"})
    return old, load_cluster(custom_cluster(devices=(device,) * 2, nodes=2, network_GBps=1.0)), [0, 1, 2, 3]


def test_a_replan_that_does_not_simulate_the_old_program_makes_the_same_plan(monkeypatch):
    old, new, survivors = _zero3_onto_a_slow_network()
    floored = hapc.elastic.replan.replan(old, new, survivors=survivors)
    assert floored.effort == "search" and floored.carried_cost_is_floor and not floored.kept_program
    monkeypatch.setattr(hapc.elastic.replan, "blocking_comm_floor_seconds", lambda program, cluster: 0.0)
    simulated = hapc.elastic.replan.replan(old, new, survivors=survivors)
    assert simulated.effort == "search" and not simulated.carried_cost_is_floor
    assert floored.carried_cost_seconds <= simulated.carried_cost_seconds
    assert floored.simulations < simulated.simulations
    assert json.dumps(floored.plan.to_dict()) == json.dumps(simulated.plan.to_dict())


@pytest.mark.parametrize("effort", ["auto", "search"])
def test_a_replan_makes_the_same_plan_with_or_without_a_child_process(effort, monkeypatch):
    """The other overlap's search runs in a forked child when a core is spare, and the first
    search's program is re-balanced while it runs: neither changes the plan."""
    old, new, survivors = _zero3_onto_a_slow_network()
    forked = hapc.elastic.replan.replan(old, new, survivors=survivors, effort=effort)
    monkeypatch.setenv("HAPC_SERIAL", "1")
    serial = hapc.elastic.replan.replan(old, new, survivors=survivors, effort=effort)
    assert json.dumps(forked.plan.to_dict()) == json.dumps(serial.plan.to_dict())
    assert (forked.searches, serial.searches) == (2, 2)


def test_a_later_search_that_leads_is_sent_whole_and_one_that_cannot_as_its_time(monkeypatch):
    """The child sends a searched program that cannot lead the ones before it as its time only
    (hapc.elastic.replan._Behind). Here overlap 1 finds a slower program than 0 (0.75 ties with 0):
    searched after 0 it comes back behind, searched before 0 it makes 0's come back whole, and
    either way, forked or not, the plan is the one the default overlaps make."""
    old, new, survivors = _zero3_onto_a_slow_network()
    default = json.dumps(hapc.elastic.replan.replan(old, new, survivors=survivors, effort="search").plan.to_dict())
    kinds: list[str] = []
    real = hapc.elastic.replan._SearchRound.candidate
    monkeypatch.setattr(hapc.elastic.replan._SearchRound, "candidate",
                        lambda self, index: (lambda got: kinds.append(type(got).__name__) or got)(real(self, index)))
    for overlaps, sent in (((1.0, 0.0), ["_Candidate", "_Candidate"]), ((0.0, 1.0), ["_Candidate", "_Behind"])):
        monkeypatch.setattr(hapc.elastic.replan, "SEARCH_OVERLAPS", overlaps)
        for serial in ("", "1"):
            monkeypatch.setenv("HAPC_SERIAL", serial)
            kinds.clear()
            done = hapc.elastic.replan.replan(old, new, survivors=survivors, effort="search")
            assert json.dumps(done.plan.to_dict()) == default and done.searches == 2
            assert kinds == sent, (overlaps, serial)


@pytest.mark.usefixtures("child_forks")
def test_work_while_searching_runs_once_only_while_the_child_searches(monkeypatch):
    old, new, survivors = _zero3_onto_a_slow_network()
    default = json.dumps(hapc.elastic.replan.replan(old, new, survivors=survivors, effort="search").plan.to_dict())
    calls: list[int] = []
    monkeypatch.setattr(hapc.elastic.replan._SearchRound, "ready", lambda self, index=1: False)   # still searching
    done = hapc.elastic.replan.replan(old, new, survivors=survivors, effort="search", while_searching=lambda: calls.append(1))
    assert calls == [1] and json.dumps(done.plan.to_dict()) == default
    monkeypatch.setattr(hapc.elastic.replan._SearchRound, "ready", lambda self, index=1: True)    # already back
    hapc.elastic.replan.replan(old, new, survivors=survivors, effort="search", while_searching=lambda: calls.append(2))
    hapc.elastic.replan.replan(old, new, survivors=survivors, effort="quick", while_searching=lambda: calls.append(3))
    assert calls == [1]


@pytest.mark.parametrize("effort", ["quick", "search"])
def test_a_replan_keeps_the_old_plans_precision(effort):
    """A bf16 plan replanned is a bf16 plan: its graph is already autocast, and the program
    emitted from it must autocast too (the replanned plan once fell back to fp32). TF32 is
    what the new cluster file says, as a compile records it."""
    import dataclasses

    from hapc.ir.precision import Precision

    old, new, survivors = _zero3_onto_a_slow_network()
    old = dataclasses.replace(old, precision=Precision("bf16", not new.allow_tf32, "fp32"))
    done = hapc.elastic.replan.replan(old, new, survivors=survivors, effort=effort)
    assert done.plan.precision == Precision("bf16", new.allow_tf32, "fp32")
    assert Plan.from_dict(json.loads(json.dumps(done.plan.to_dict()))).precision.name == "bf16"
