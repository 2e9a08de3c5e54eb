"""Trace every example model and report its size, trace time and sharding-rule coverage.

Run from the repository root: ``.venv/bin/python -m configs.models.coverage [MODEL ...]``
(or ``python configs/models/coverage.py``). For each model file it traces the ``SMALL`` config
with real weights and the default config built on the meta device (no memory for weights),
and prints, per row: parameters, graph nodes, trace seconds, op coverage (distinct ops with
a rule / all distinct ops, and the same weighted by node count) and the ops with no rule,
which the planner can only replicate. ``--hf`` adds small Hugging Face GPT-2 and BERT models.

``--families [NAME ...]`` prints the model-family table instead: every Hugging Face family of
``configs/models/hf.py`` (unmodified library classes at tiny configs) traced, planned for 3
uneven CPU ranks (the synthesizer's plan and the Megatron tensor-parallel baseline) and run by
the in-process executor against one device, float64, loss and every parameter gradient
(``verify``: the largest absolute error, ``ok`` under 1e-6). Failures are printed, never
hidden: the row says at which stage (trace, plan, verify) and why. The real multi-process runs
of the same plans are tests/e2e/test_families.py (slow).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).resolve().parent
MODELS = ["mlp", "gpt", "bert", "vit", "vgg", "moe"]


def load(name: str) -> ModuleType:
    path = HERE / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_model_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # dataclasses and pickling look a module up by name
    spec.loader.exec_module(module)
    return module


@functools.cache
def load_once(name: str) -> ModuleType:
    return load(name)


def build(module: ModuleType, size: str) -> tuple[torch.nn.Module, tuple]:
    """The model and inputs at ``size``: "small" for real tensors, "default" on the meta device."""
    torch.manual_seed(0)
    if size == "small":
        return module.model(**module.SMALL), tuple(module.inputs(**module.SMALL))
    with torch.device("meta"):
        model = module.model()
    return model, tuple(x.to("meta") for x in module.inputs())


def hf_models() -> dict[str, tuple[torch.nn.Module, tuple]]:
    """Small Hugging Face models (no downloaded weights), wrapped so forward returns the loss."""
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    class LossOnly(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=ids, labels=labels).loss

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=16, vocab_size=101,
                                      bos_token_id=0, eos_token_id=0))
    bert = BertForMaskedLM(BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      intermediate_size=256, max_position_embeddings=16, vocab_size=101))
    ids = torch.randint(0, 101, (5, 16), generator=torch.Generator().manual_seed(0))
    return {"hf-gpt2": (LossOnly(gpt2), (ids, ids.clone())), "hf-bert": (LossOnly(bert), (ids, ids.clone()))}


def row(name: str, size: str, model: torch.nn.Module, inputs: tuple) -> dict:
    from hapc.rules import has_rule
    from hapc.frontend.tracer import trace

    traced = trace(model, inputs)
    graph = traced.graph
    ops = graph.ops()
    covered = [op for op in ops if has_rule(op)]
    return {
        "model": name, "size": size,
        "params_M": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) / 1e6,
        "nodes": len(graph.nodes), "trace_s": traced.seconds,
        "ops": f"{len(covered)}/{len(ops)}",
        "nodes_covered": f"{sum(ops[op] for op in covered)}/{len(graph.nodes)}",
        "missing": sorted(op.removeprefix("aten.") for op in ops if not has_rule(op)),
    }


# 3 CPU ranks of uneven speed (shares about 0.5 / 0.3 / 0.2), as tests/e2e/test_families.py runs them.
UNEVEN3 = {"name": "cpu3-uneven", "nodes": [{
    "devices": [{"name": f"cpu{i}", "tflops": t, "memory_GB": 8, "hbm_GBps": 20, "count": 1}
                for i, t in enumerate((1.0, 0.6, 0.4))],
    "intra_link": "loopback"}]}
VERIFY_TOLERANCE = 1e-6


def family_program(traced, plan: str):
    """The program ``plan`` ("synth": the synthesizer's, or a baseline's name) for UNEVEN3."""
    from costmodel.cluster import load_cluster
    from synth.baselines import baseline_program
    from synth.synthesize import synthesize_program

    cluster = load_cluster(UNEVEN3)
    if plan == "synth":
        return synthesize_program(traced.graph, cluster, baselines=("dp-flops",)).best.program
    return baseline_program(plan, traced.graph, cluster)


def verify_error(program, traced, inputs: tuple) -> float:
    """Largest absolute difference of loss and parameter gradients, ``program`` on its ranks
    against the replicated program on one, both in float64 (the in-process executor)."""
    from hapc.codegen.executor import replicated_program, run

    got = run(program, traced, inputs, dtype=torch.float64)
    want = run(replicated_program(traced.graph), traced, inputs, dtype=torch.float64)
    errors = [(got.loss - want.loss).abs().item()]
    errors += [(got.grads[k] - want.grads[k]).abs().max().item() for k in want.grads if want.grads[k].numel()]
    return max(errors)


def sharded_nodes(program) -> int:
    from hapc.ir.program import Compute

    return sum(1 for s in program.steps if isinstance(s, Compute) and not s.strategy.is_replicated)


def family_row(name: str, plans: tuple[str, ...] = ("synth", "megatron-tp")) -> dict:
    """One row of the family table; a stage that raises ends the row with its error."""
    from hapc.rules import has_rule
    from hapc.frontend.tracer import trace

    hf = load_once("hf")
    spec = hf.FAMILIES[name]
    out: dict = {"model": name, "owner": spec.owner, "nodes": None, "missing": [], "verify": {}, "error": None}
    stage = "build"
    try:
        torch.manual_seed(0)
        model, inputs = hf.model(name), hf.inputs(name)
        stage = "trace"
        traced = trace(model, inputs)
        out["nodes"] = len(traced.graph.nodes)
        out["missing"] = sorted(op.removeprefix("aten.") for op in traced.graph.ops() if not has_rule(op))
        for plan in plans:
            stage = f"plan {plan}"
            program = family_program(traced, plan)
            stage = f"verify {plan}"
            out["verify"][plan] = (verify_error(program, traced, inputs), sharded_nodes(program))
    except Exception as exc:  # the table reports failures; it must not stop at the first
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        out["error"] = f"{stage}: {type(exc).__name__}: {first}"[:160]
    return out


def print_family_table(rows: list[dict]) -> None:
    head = f"{'model':<11} {'owner':<9} {'nodes':>5}  {'verify synth':<22} {'verify megatron-tp':<22} without a rule"
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = []
        for plan in ("synth", "megatron-tp"):
            if plan in r["verify"]:
                err, sharded = r["verify"][plan]
                word = "ok" if err < VERIFY_TOLERANCE else "FAILED"
                cells.append(f"{word} {err:.1e} ({sharded} sh)")
            else:
                cells.append("-")
        nodes = r["nodes"] if r["nodes"] is not None else "-"
        print(f"{r['model']:<11} {r['owner']:<9} {nodes:>5}  {cells[0]:<22} {cells[1]:<22} "
              f"{', '.join(r['missing']) or '-'}")
        if r["error"]:
            print(f"{'':<11} ERROR {r['error']}")
    ok = sum(1 for r in rows if not r["error"] and r["verify"] and
             all(e < VERIFY_TOLERANCE for e, _ in r["verify"].values()))
    print(f"{ok}/{len(rows)} families verified; '(N sh)': nodes the plan runs sharded")


def print_table(rows: list[dict]) -> None:
    head = (f"{'model':<8} {'size':<8} {'params M':>9} {'nodes':>6} {'trace s':>8} {'ops':>6} {'nodes':>10}"
            "  without a rule")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['model']:<8} {r['size']:<8} {r['params_M']:>9.2f} {r['nodes']:>6} {r['trace_s']:>8.2f} "
              f"{r['ops']:>6} {r['nodes_covered']:>10}  {', '.join(r['missing']) or '-'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=MODELS, help=f"model files to trace (default: {MODELS})")
    parser.add_argument("--small-only", action="store_true", help="skip the default sizes")
    parser.add_argument("--hf", action="store_true", help="also trace small Hugging Face GPT-2 and BERT")
    parser.add_argument("--families", nargs="*", metavar="FAMILY",
                        help="print the Hugging Face model-family table instead (default: every family)")
    args = parser.parse_args(argv)

    if args.families is not None:
        hf = load_once("hf")
        names = args.families or list(hf.FAMILIES)
        unknown = [n for n in names if n not in hf.FAMILIES]
        if unknown:
            parser.error(f"unknown families {unknown}; known: {', '.join(hf.FAMILIES)}")
        rows = []
        for name in names:
            start = time.perf_counter()
            rows.append(family_row(name))
            print(f"  {name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
        print_family_table(rows)
        return 0

    # Warm torch.export up once so that the first row's time is not the import's.
    warm = load("mlp")
    row("warm-up", "small", *build(warm, "small"))
    rows = []
    for name in args.models:
        module = load(name)
        for size in ("small",) if args.small_only else ("small", "default"):
            start = time.perf_counter()
            rows.append(row(name, size, *build(module, size)))
            print(f"  traced {name} {size} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.hf:
        for name, (model, inputs) in hf_models().items():
            rows.append(row(name, "small", model, inputs))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
