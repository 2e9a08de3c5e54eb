"""The small runtime that emitted programs carry: per-rank implementations of ops
(:mod:`hapc.runtime.local_ops`), uneven collectives with autograd duals
(:mod:`hapc.runtime.collectives`), checkpoints that load under another plan
(:mod:`hapc.runtime.checkpoint`) and per-rank step timings (:mod:`hapc.runtime.timings`). It
depends on torch only, so it can be copied into programs."""
