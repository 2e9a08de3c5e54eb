"""The instruction IR (traced graph), tensor layouts and shard arithmetic: the bottom layer."""

from hapc.ir.graph import Arg, Cost, Graph, Node, Ref, SourceLoc, TensorMeta, TorchFacts, Value
from hapc.ir.layout import (E, ExpertRows, Layout, P, Partial, R, Replicate, Shard, grad_layout, parse_layout,
                            reachable)
from hapc.ir.shards import largest_remainder, offsets, shard_lengths

__all__ = [
    "Arg",
    "Cost",
    "E",
    "ExpertRows",
    "Graph",
    "Layout",
    "Node",
    "P",
    "Partial",
    "R",
    "Ref",
    "Replicate",
    "Shard",
    "SourceLoc",
    "TensorMeta",
    "TorchFacts",
    "Value",
    "grad_layout",
    "largest_remainder",
    "offsets",
    "parse_layout",
    "reachable",
    "shard_lengths",
]
