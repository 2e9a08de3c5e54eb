"""Collectives that local ops run inside themselves (``hapc.runtime.local_ops``), priced.

Most layout changes are explicit ``Redistribute`` steps, but a few local ops reduce over ranks
as part of their own arithmetic: a mean loss over uneven batch shares sums the global count,
a vocabulary-parallel cross-entropy assembles log-sum-exp from every rank's max and sum, sync
batch norm sums statistics, a sharded cumsum adds the totals of earlier ranks. Each is an
all-reduce of a few kilobytes, which costs nothing on NVLink but a millisecond or more with
gloo on CPUs, so they are priced like any other blocking all-reduce. A sum whose result carries gradient runs
a second all-reduce in backward (its autograd dual); a max or a count does not.
"""

from __future__ import annotations

from math import prod

from hapc.ir.graph import DTYPE_BYTES, Graph, Node


def internal_all_reduces(local: str | None, node: Node, graph: Graph) -> tuple[list[float], list[float]]:
    """(forward, backward) all-reduce sizes in bytes that local op ``local`` runs for ``node``."""
    if local is None:
        return [], []
    refs = node.input_refs()
    if local in ("cross_entropy_batch", "nll_loss_batch"):
        return [float(_itemsize(graph, node.outputs[0]))], []
    if not refs:
        return [], []
    x = graph.meta(refs[0])
    item = DTYPE_BYTES.get(x.dtype, 4)
    if local == "vocab_parallel_cross_entropy":      # max and sum of exponentials per row
        rows = prod(x.shape[:-1]) * item
        return [rows, rows], [rows]
    if local == "batch_norm_sync":                     # sum, sum * mean, m2 per channel, and the count
        stats = (3 * x.shape[1] + 1) * item if len(x.shape) > 1 else 4 * item
        return [stats], [stats]
    if local == "cumsum_scan":                         # each rank's totals along the scanned dim
        dim = node.args[1] if len(node.args) > 1 and isinstance(node.args[1], int) else -1
        totals = prod(x.shape) // max(1, x.shape[dim]) * item
        return [totals], [totals]
    return [], []


def _itemsize(graph: Graph, name: str) -> int:
    return DTYPE_BYTES.get(graph.meta(name).dtype, 4)
