"""Import what a trace needs from torch with Python's cyclic garbage collector paused, then
keep the collector off those objects for the rest of the process.

``import torch`` and the parts of torch that ``torch.export`` loads on first use
(``torch._dynamo``, its tracer with aot_autograd) create hundreds of thousands of objects that
live as long as the process. While they load, the collector runs full collections over all of
them several times, and again during the trace and the search that follow; it finds next to
nothing to free. :func:`import_for_tracing` imports with the collector off and then freezes
(``gc.freeze``: later collections skip) everything alive
(:func:`hapc.process.collector.gc_paused` with ``freeze_after``), which is what the standard
library offers for exactly this (long-lived objects made at start-up); the cost is the few MB of
garbage the imports leave, kept for the process's life.

For a process that compiles once and ends, the command line; a library caller's process and
its collector are left alone.
"""

from __future__ import annotations

import contextlib
import sys

from hapc.process.collector import gc_paused


def import_for_tracing() -> None:
    """Import torch, ``torch._dynamo`` and torch.export's tracer (a no-op when they are loaded)
    with the collector paused, and freeze what is alive after. Where the caller has turned the
    collector off, it stays off and nothing is frozen."""
    if "torch._dynamo" in sys.modules:
        return
    with gc_paused(freeze_after=True):
        import torch  # noqa: F401
        import torch._dynamo  # noqa: F401  (torch.export loads it on first use)

        with contextlib.suppress(ImportError):      # a private module: where torch.export keeps its tracer
            import torch.export._trace  # noqa: F401
        import hapc.frontend.tracer  # noqa: F401
