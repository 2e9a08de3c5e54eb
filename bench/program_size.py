"""Lines of the emitted ``program.py`` (issue 13: under 1,000 for GPT-48 and for GPT-12 on 256
devices, "growing with the distinct blocks, not the depth"): each plan is synthesized once and
emitted twice, by block (the default) and unrolled, and both are counted, with the time each
emission took (alternating, in one process, so the load of the machine falls on both alike).

    python -m bench.program_size [--quick]     # --quick: GPT-48 only
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import CLUSTERS_DIR, HAP8, model_path, save_section, say, trace_model

# 16 nodes of 8 A100 and 16 nodes of 8 V100 on a 100 Gb/s network (issue 13's 256 devices).
CLUSTER_256 = CLUSTERS_DIR / "a100x128-v100x128-256gpu.yaml"
CASES = {
    "gpt48-8dev": ("gpt", {"layers": 48}, str(HAP8)),
    "gpt12-256dev": ("gpt", {"batch": 512}, str(CLUSTER_256)),
    "hf_gpt2-8dev": ("hf_gpt2", {}, str(HAP8)),
    "bert-8dev": ("bert", {}, str(HAP8)),
}


def measure(name: str, kwargs: dict[str, Any], cluster: Any) -> dict[str, Any]:
    import hapc.codegen.emitter as emitter
    from costmodel.cluster import load_cluster
    from hapc.codegen import emit
    from synth.synthesize import synthesize_program

    cluster = load_cluster(cluster)
    traced = trace_model(name, **kwargs)
    program = synthesize_program(traced.graph, cluster).best.program
    by_block, unrolled = emitter.find_blocks, (lambda program: [])
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(2):
            for label, finder in (("by_block", by_block), ("unrolled", unrolled)):
                emitter.find_blocks = finder
                try:
                    start = time.perf_counter()
                    path = emit(program, str(model_path(name)), tmp, model_kwargs=kwargs, cluster=cluster)
                    seconds = time.perf_counter() - start
                finally:
                    emitter.find_blocks = by_block
                out[f"{label}_lines"] = len(Path(path).read_text().splitlines())
                out.setdefault(f"{label}_emit_s", []).append(round(seconds, 3))
        out["blocks"] = [len(b.calls) for b in by_block(program)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.program_size", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="GPT-48 only")
    args = parser.parse_args(argv)
    results = {}
    for case, (name, kwargs, cluster) in CASES.items():
        if args.quick and case != "gpt48-8dev":
            continue
        results[case] = measure(name, kwargs, cluster)
        r = results[case]
        say(f"{case}: {r['unrolled_lines']} -> {r['by_block_lines']} lines (calls per block {r['blocks']}); "
            f"emit s by block {r['by_block_emit_s']}, unrolled {r['unrolled_emit_s']}")
    save_section("program_size", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
