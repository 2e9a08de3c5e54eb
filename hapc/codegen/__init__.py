"""Code generation: a distributed program -> a standalone torchrun training script."""

from hapc.codegen.emitter import emit, render

__all__ = ["emit", "render"]
