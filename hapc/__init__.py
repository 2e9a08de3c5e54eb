"""hapc: compile a single-device PyTorch training program into an SPMD program for a
heterogeneous cluster.

Kept thin: names are imported on first use, so importing a lower layer (``hapc.ir``,
``hapc.rules``) never pulls in the search or the cost model.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "synthesize": "hapc.api", "baseline": "hapc.api", "load_cluster": "costmodel.cluster",
    "Plan": "hapc.plan.plan", "Cluster": "costmodel.cluster", "Traced": "hapc.frontend.tracer",
}


def trace(model, inputs):
    """Trace ``model(*inputs)`` (a scalar loss) into the IR; see :func:`hapc.frontend.tracer.trace`."""
    from hapc.frontend.tracer import trace as _trace

    return _trace(model, inputs)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hapc' has no attribute {name!r}")


__all__ = ["Cluster", "Plan", "Traced", "baseline", "load_cluster", "synthesize", "trace"]
