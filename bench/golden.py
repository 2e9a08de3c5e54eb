"""Golden plans: the example models at ``SMALL`` size on the small mixed cluster.

``tests/plan/test_golden.py`` synthesizes each model again and runs ``hapc check`` against the
file kept here, so a change that makes any plan slower (beyond the tolerance) or invalid
fails CI. When a change is meant to alter plans, refresh them and read what moved:

    make golden                       # or: .venv/bin/python -m bench.golden [MODEL ...]

prints, per model, the old and new predicted time per iteration (both simulated by the
current cost model, as ``hapc check`` compares them) and whether the chosen program changed.

Plan files are written with relative paths (source lines relative to the repository; the model
file relative to the plan file's folder, as ``Plan.save`` writes it), so a golden file is the
same whichever checkout refreshed it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench.common import CLUSTERS_DIR, ROOT, model_path, small_config, trace_model

MODELS = ("mlp", "gpt", "bert", "vit", "vgg", "moe")
CLUSTER = CLUSTERS_DIR / "small-mixed.yaml"
GOLDEN_DIR = ROOT / "tests" / "golden"


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}-small-mixed.json"


def plan_small(name: str):
    """Synthesize ``name`` at its ``SMALL`` size for the small mixed cluster (in-process)."""
    from hapc.api import synthesize

    cfg = small_config(name)
    traced = trace_model(name, **cfg)
    rel = model_path(name).relative_to(ROOT).as_posix()
    return synthesize(traced, None, str(CLUSTER), model_file=rel, model_kwargs=cfg)


def plan_text(plan) -> str:
    """The plan as ``Plan.save`` writes it, with paths inside the repository made relative."""
    data = plan.to_dict()
    data["graph"]["sources"] = {node: [_relative(src[0])] + list(src[1:])
                                for node, src in data["graph"].get("sources", {}).items()}
    if "file" in data.get("model", {}):       # as Plan.save writes it: from the plan's folder
        data["model"]["file"] = os.path.relpath(ROOT / _relative(data["model"]["file"]), GOLDEN_DIR)
    return json.dumps(data, sort_keys=True, indent=1) + "\n"


def _relative(path: str) -> str:
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path


def write_plan(plan, path: str | Path) -> None:
    Path(path).write_text(plan_text(plan))


def _cost_ms(path: Path) -> float | None:
    from hapc.errors import UserError
    from hapc.plan.plan import Plan

    try:
        return Plan.load(path).cost * 1e3
    except (UserError, KeyError, ValueError, TypeError):   # an older format: report it as missing
        return None


def _steps(path: Path) -> Any:
    try:
        data = json.loads(path.read_text())
        return data["steps"], data["shares"], data.get("name")
    except (OSError, ValueError, KeyError):
        return None


def _recorded_ms(path: Path) -> float | None:
    """The time the file says it was predicted at when written (the cost model of that day)."""
    try:
        return float(json.loads(path.read_text())["predicted"]["iteration_seconds"]) * 1e3
    except (OSError, ValueError, KeyError, TypeError):
        return None


def refresh(names: list[str], out_dir: Path = GOLDEN_DIR) -> list[dict[str, Any]]:
    """Write fresh golden plans for ``names`` into ``out_dir`` and report what changed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        path = out_dir / golden_path(name).name
        old_ms = _cost_ms(path) if path.exists() else None
        old_steps = _steps(path) if path.exists() else None
        recorded_ms = _recorded_ms(path) if path.exists() else None
        plan = plan_small(name)
        write_plan(plan, path)
        new_ms = plan.cost * 1e3
        rows.append({"model": name, "old_ms": old_ms, "recorded_ms": recorded_ms, "new_ms": new_ms,
                     "winner": plan.name,
                     "new": old_steps is None, "program_changed": old_steps != _steps(path), "file": path})
        _print_row(rows[-1])
    return rows


def _print_row(r: dict[str, Any]) -> None:
    old = f"{r['old_ms']:.4f}" if r["old_ms"] is not None else "(none)"
    change = ""
    if r["old_ms"]:
        pct = (r["new_ms"] / r["old_ms"] - 1) * 100
        change = f"{pct:+.2f}%" if abs(pct) >= 0.005 else "0.00%"
    what = "new file" if r["new"] else "program changed" if r["program_changed"] else "same program"
    rec = r.get("recorded_ms")
    if rec is not None and r["old_ms"] and abs(rec / r["old_ms"] - 1) > 1e-4:
        what += f"; the old file recorded {rec:.4f} ms under the cost model it was written with"
    print(f"{r['model']:<5} {old:>10} -> {r['new_ms']:.4f} ms/iter {change:>8}  ({r['winner']}; {what})"
          f"  {_relative(str(r['file']))}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.golden",
        description="Refresh the golden plans under tests/golden/ (example models at SMALL size on "
                    "configs/clusters/small-mixed.yaml) and print old vs new predicted time per model.")
    parser.add_argument("models", nargs="*", metavar="MODEL",
                        help=f"models to refresh (default: all of {', '.join(MODELS)})")
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR,
                        help="write the plans here instead (the determinism test compares two such folders)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model {unknown[0]!r} (choose from {', '.join(MODELS)})")
    names = list(args.models) or list(MODELS)
    print(f"{'model':<5} {'old':>10}    new (both predicted by the current cost model)")
    refresh(names, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
