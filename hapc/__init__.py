"""hapc: compile a single-device PyTorch training program into an SPMD program for a
heterogeneous cluster. Kept thin so that importing a lower layer never pulls in the API."""

__version__ = "0.1.0"


def trace(model, inputs):
    """Trace ``model(*inputs)`` (a scalar loss) into the IR; see :func:`hapc.tracer.trace`."""
    from hapc.tracer import trace as _trace

    return _trace(model, inputs)
