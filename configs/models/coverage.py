"""Trace every example model and report its size, trace time and sharding-rule coverage.

Run from the repository root: ``.venv/bin/python -m configs.models.coverage [MODEL ...]``
(or ``python configs/models/coverage.py``). For each model file it traces the ``SMALL`` config
with real weights and the default config built on the meta device (no memory for weights),
and prints, per row: parameters, graph nodes, trace seconds, op coverage (distinct ops with
a rule / all distinct ops, and the same weighted by node count) and the ops with no rule,
which the planner can only replicate. ``--hf`` adds small Hugging Face GPT-2 and BERT models.
"""

from __future__ import annotations

import argparse
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
    spec.loader.exec_module(module)
    return module


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
    from hapc.tracer import trace

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
    args = parser.parse_args(argv)

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
