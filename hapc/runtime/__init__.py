"""The small runtime that emitted programs carry: per-rank implementations of ops
(:mod:`hapc.runtime.local_ops`). It depends on torch only, so it can be copied into programs."""
