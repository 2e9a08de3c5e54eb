"""The simulator's shortcuts change no number: prices remembered across simulations and
repeated layers (costmodel.simcache), memory made on demand, and the block counts of sharded
dimensions, each against the plain computation."""

from __future__ import annotations

import pickle
from math import gcd

import costmodel.simulator as simulator_module
from costmodel import load_cluster, program_memory, simulate
from costmodel.collectives import best_variant, collective_seconds
from costmodel.compute import node_seconds
from costmodel.internal import internal_all_reduces
from costmodel.simcache import SimulationCache
from hapc.ir.graph import Cost, Node
from hapc.ir.layout import R, Shard
from hapc.ir.program import Compute, Redistribute
from tests.costmodel.cm_programs import chain_graph, custom_cluster, data_parallel, zero3

# 2 nodes x (fast, slow, medium): uneven shares, three kinds, a network between the nodes.
MIXED = load_cluster(custom_cluster(devices=((4, 10, 200), (1, 10, 100), (2, 10, 150)), nodes=2,
                                    efficiency={"matmul": 0.5}, launch_latency_us=3.0))


class _Uncached(SimulationCache):
    """The reference: every price computed afresh, every node on its own."""

    def node_key(self, node):
        return ("node", node.name)

    def node_time(self, node, node_key, rank, device_key, fraction):
        return node_seconds(node, self.graph, self.cluster.devices[rank], self.cluster, fraction)

    def best(self, kind, piece_bytes, send_matrix=None):
        return best_variant(kind, piece_bytes, self.cluster, send_matrix=send_matrix)

    def seconds(self, kind, piece_bytes, variant, send_matrix=None):
        return collective_seconds(kind, piece_bytes, self.cluster, None, variant, send_matrix=send_matrix)

    def internal(self, local, node):
        return internal_all_reduces(local, node, self.graph)


def _programs():
    """Layers 0 and 2 (6 -> 12) and 1 and 3 (12 -> 6) repeat; data parallel, ZeRO-3 and a
    program with an all-to-all round trip, at uneven shares."""
    graph = chain_graph(batch=29, widths=(6, 12, 6, 12, 6))
    for node in graph.nodes[1:4:2]:            # the 12 -> 6 layers cost otherwise, and move bytes
        node.cost = Cost(3e9, 5e9, 4e8, 7e8)
    shares = MIXED.flops_shares()
    moved = data_parallel(graph, shares)
    moved.steps[1:1] = [Redistribute("y0", "y0@cols", Shard(0), Shard(1)),
                        Redistribute("y0@cols", "y0@rows", Shard(1), Shard(0))]
    moved.invalidate()
    return [data_parallel(graph, shares), zero3(graph, shares), moved, data_parallel(graph, (1 / 6,) * 6)]


def _numbers(sim):
    return sim.to_dict(), [(e.phase, e.label, e.kind, e.variant, e.start_seconds, e.end_seconds)
                           for e in sim.events]


def test_a_shared_cache_gives_the_plain_simulation_bit_for_bit(monkeypatch):
    programs = _programs()
    cache = SimulationCache(programs[0].graph, MIXED)
    fast = [_numbers(simulate(p, MIXED, cache=cache)) for p in programs]
    assert cache.misses < cache.lookups / 2          # repeated layers and programs share prices
    monkeypatch.setattr(simulator_module, "SimulationCache", _Uncached)
    plain = [_numbers(simulate(p, MIXED)) for p in _programs()]
    assert fast == plain


def test_a_cache_for_another_graph_or_cluster_is_not_used():
    programs = _programs()
    other = SimulationCache(chain_graph(batch=29, widths=(6, 12)), MIXED)
    assert not other.serves(programs[0].graph, MIXED)
    assert _numbers(simulate(programs[0], MIXED, cache=other)) == _numbers(simulate(programs[0], MIXED))
    assert other.lookups == 0


def test_nodes_share_a_price_only_when_everything_priced_is_equal():
    graph = chain_graph(batch=8, widths=(6, 12, 6, 12))
    cache = SimulationCache(graph, MIXED)
    first, _, third = (cache.node_key(n) for n in graph.nodes[:3])
    assert first == third                               # 6 -> 12 twice: one price
    node = graph.nodes[0]
    half = Node("half", node.op, node.args, node.kwargs, ("y_half",), node.cost)
    graph.values["y_half"] = graph.values["y0"].__class__(
        "y_half", graph.meta("y0").__class__(graph.meta("y0").shape, "float16"), "activation")
    assert cache.node_key(half) != first                # another dtype, another peak


def test_memory_made_on_demand_is_the_memory_model_of_the_simulated_program():
    for program in _programs():
        expected = program_memory(program, MIXED)
        sim = simulate(program, MIXED)
        program.steps.append(Compute("sum", program.steps[-1].strategy, program.steps[-1].inputs))
        assert sim.memory.totals == expected.totals     # the program as simulated, not as edited
        assert [vars(d) for d in sim.memory.devices] == [vars(d) for d in expected.devices]
    copy = pickle.loads(pickle.dumps(simulate(_programs()[1], MIXED)))
    assert copy._memory_inputs is None and copy.memory.totals == program_memory(_programs()[1], MIXED).totals


def _blocks_by_union_find(program) -> dict:
    """Block counts the plain way: a parent-pointer union-find over (value, dim) pairs."""
    parent: dict = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            x = parent[x]
        return x

    def link(keys):
        for k in keys:
            find(k)
        for a, b in zip(keys, keys[1:]):
            parent[find(a)] = find(b)

    def key(v, dim):
        return v, dim % len(program.shape(v))

    outputs = {n.name: n.outputs for n in program.graph.nodes}
    for name, lay in program.source_layouts.items():
        if isinstance(lay, Shard):
            link([key(name, lay.dim)])
    for step in program.steps:
        if isinstance(step, Compute):
            link([key(v, lay.dim) for v, lay in zip(step.inputs + outputs[step.node],
                                                    step.strategy.inputs + step.strategy.outputs)
                  if isinstance(lay, Shard)])
        else:
            if isinstance(step.dst_layout, Shard):
                link([key(step.out, step.dst_layout.dim)])
            if isinstance(step.src_layout, Shard) and step.src_layout == step.dst_layout:
                link([key(step.src, step.src_layout.dim), key(step.out, step.dst_layout.dim)])
    sizes: dict = {}
    for k in parent:
        sizes[find(k)] = gcd(sizes.get(find(k), 0), program.shape(k[0])[k[1]])
    return {k: sizes[find(k)] for k in parent}


def test_block_counts_equal_a_plain_union_find():
    for program in _programs():
        program.steps.append(Redistribute("y3", "y3@copy", Shard(0), Shard(0)))
        program.steps.append(Redistribute("y3@copy", "y3@whole", Shard(0), R))
        program.invalidate()
        assert list(program.blocks().items()) == list(_blocks_by_union_find(program).items())
