"""The small runtime that emitted programs carry: per-rank implementations of ops
(:mod:`hapc.runtime.local_ops`) and uneven collectives with autograd duals
(:mod:`hapc.runtime.collectives`). It depends on torch only, so it can be copied into programs."""
