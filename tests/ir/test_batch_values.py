"""Which values hold one row per sample (hapc/ir/batch.py): a Hugging Face Llama builds its
attention mask from shapes alone (``arange(batch)``, ``new_ones``, positions expanded to the
batch), never reading the input ids; it is the batch's all the same, so a micro-batch holds its
share of it and data parallelism splits it as DDP's local batch does (issue 22)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from hapc.ir.batch import batch_size, batch_values

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _llama():
    from conftest import load_model_file
    from hapc import trace

    module = load_model_file(ROOT / "configs" / "models" / "hf_llama.py")
    # head size 8: the rotary table's 4 frequencies match the batch of 4 by chance
    kwargs = dict(layers=1, hidden=64, heads=8, kv_heads=2, mlp=128, seq=16, batch=4, vocab=101)
    torch.manual_seed(0)
    return trace(module.model(**kwargs), tuple(module.inputs(**kwargs))).graph


def test_a_mask_built_from_shapes_is_the_batchs_and_a_table_from_a_buffer_is_not():
    graph = _llama()
    found = batch_values(graph)
    assert batch_size(graph) == 4
    masks = [n for n in graph.nodes if n.op == "aten.__and__.Tensor"]
    assert masks and all(n.outputs[0] in found for n in masks)            # (4, 1, 16, 16), from shapes
    freqs = [n for n in graph.nodes if any(r.startswith("b_") and "inv_freq" in r for r in n.input_refs())]
    assert freqs and not any(o in found for n in freqs for o in n.outputs)    # (4,) from a buffer
    assert not any(p in found for p in graph.params)
    assert set(graph.inputs) <= found and graph.output in found


def test_a_micro_batch_makes_and_holds_its_share_of_the_mask():
    from costmodel.cluster import load_cluster
    from costmodel.pipeline import ProgramPricer
    from synth.baselines import baseline_program

    graph = _llama()
    cluster = load_cluster(ROOT / "configs" / "clusters" / "cpu4.yaml")
    pricer = ProgramPricer(baseline_program("dp-even", graph, cluster), cluster)
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    mask = max((n for n in graph.nodes if n.op == "aten.__and__.Tensor"), key=lambda n: index[n.name])
    assert pricer.scaled[index[mask.name]]       # its work and what it keeps shrink with the micro-batch
