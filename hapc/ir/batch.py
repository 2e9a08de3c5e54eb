"""Which values of a graph hold one row per sample of the batch.

A micro-batch holds its share of those (the pipeline pricer scales their bytes and work by it)
and data parallelism splits them (the ``dp-*`` baselines shard them as DDP's local batch does).
They are the values computed from a model input and, besides, those built from no source at
all (no input, parameter or buffer: only shapes and constants) whose first dimension is the
batch, with what is computed from them: Hugging Face builds its attention masks from
``arange(batch)``, ``new_ones(batch, ...)`` and position ids expanded to the batch, without
reading the input ids. Such a mask of a Llama at 512 sequences of 4096 tokens is 8.6 GB
whole; counted as the same for every sample, every micro-batch was charged all of it.
"""

from __future__ import annotations

from hapc.ir.graph import Graph


def batch_size(graph: Graph) -> int:
    """Samples in one global batch: the largest leading dimension of the model inputs."""
    sizes = [graph.meta(x).shape[0] for x in graph.inputs if graph.meta(x).shape]
    return max(sizes) if sizes else 1


def batch_values(graph: Graph) -> set[str]:
    """The values that hold one row per sample (see the module docstring), model inputs
    included. A value made from shapes alone is counted when its first dimension equals the
    batch size, which a table of another length may match by chance (positions at a sequence
    length equal to the batch): a few bytes priced per micro-batch that are not."""
    batch = batch_size(graph)
    found = set(graph.inputs)
    sourced = {name for name, v in graph.values.items() if v.kind in ("param", "buffer")}
    for node in graph.nodes:
        reads = node.input_refs()
        if any(v in found for v in reads):
            found.update(node.outputs)
        elif any(v in sourced for v in reads):
            sourced.update(node.outputs)
        elif batch > 1:
            found.update(o for o in node.outputs
                         if o in graph.values and tuple(graph.values[o].meta.shape[:1]) == (batch,))
    return found
