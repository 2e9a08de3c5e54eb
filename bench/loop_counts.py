"""What one whole ``synthesize()`` does, counted rather than timed (counts do not depend on
the machine's load): simulations, memory-model runs, node and collective pricings made by
the simulator and the LP coefficients, A* searches (the Megatron baseline's included) and
their expansions (the loop's), layout changes the searches price, segment eliminations, LP
solves and rounds, plus the CPU seconds of the loop (tracing excluded).

To compare with ``main`` (this file may not be there yet)::

    mkdir -p /tmp/main && git archive main | tar -x -C /tmp/main && cp bench/loop_counts.py /tmp/main/bench/
    (cd /tmp/main && PYTHONPATH=$PWD python -m bench.loop_counts vit:24 bert:24)
    python -m bench.loop_counts vit:24 bert:24
"""

from __future__ import annotations

import argparse
import collections
import importlib
import sys
import time
from collections.abc import Callable

from bench.common import HAP8, trace_model

# (module, function, what a call counts as); modules missing in older checkouts are skipped.
COUNTED = (
    ("synth.synthesize", "simulate", "simulations"),
    ("costmodel.simulator", "program_memory", "memory model runs"),
    ("synth.loads", "program_memory", "memory model runs"),
    ("synth.synthesize", "search", "searches"),
    ("synth.baselines", "search", "searches"),
    ("synth.synthesize", "solve_shares", "LP solves"),
    ("costmodel.simulator", "node_seconds", "node pricings"),
    ("synth.loads", "node_seconds", "node pricings"),
    ("costmodel.simcache", "node_seconds", "node pricings"),
    ("costmodel.simulator", "best_variant", "collective pricings"),
    ("costmodel.simulator", "collective_seconds", "collective pricings"),
    ("costmodel.simcache", "best_variant", "collective pricings"),
    ("costmodel.simcache", "collective_seconds", "collective pricings"),
    ("synth.costs", "Prices._price_move", "search move pricings"),
    ("synth.elimination", "_SegmentProblem.transfer", "segment eliminations"),
)


def _counting(counts: collections.Counter) -> None:
    for module_name, name, label in COUNTED:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        owner_name, _, name = name.rpartition(".")          # "Class.method" counts a method
        owner = getattr(module, owner_name, None) if owner_name else module
        fn = getattr(owner, name, None)
        if fn is None:
            continue

        def counted(*args, _fn: Callable = fn, _label: str = label, **kwargs):
            counts[_label] += 1
            return _fn(*args, **kwargs)

        setattr(owner, name, counted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loop_counts", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["vit:24", "bert:24"], help="NAME[:LAYERS], e.g. vit:24")
    parser.add_argument("--cluster", default=str(HAP8))
    args = parser.parse_args(argv)
    from costmodel.cluster import load_cluster
    from synth.synthesize import synthesize_program

    cluster = load_cluster(args.cluster)
    counts: collections.Counter = collections.Counter()
    _counting(counts)
    for spec in args.models:
        name, _, layers = spec.partition(":")
        graph = trace_model(name, **({"layers": int(layers)} if layers else {})).graph
        synthesize_program(graph, cluster)            # imports and first calls outside the count
        counts.clear()
        start = time.process_time()
        syn = synthesize_program(graph, cluster)
        seconds = time.process_time() - start
        print(f"{spec}: {seconds:.2f} s CPU, {len(syn.rounds)} rounds, A* expansions {syn.states_expanded}, "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
