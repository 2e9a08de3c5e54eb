"""A heterogeneous cluster made of CPU cores, for measured (not just predicted) speed-ups.

Pin rank 0 alone on core 0 and ranks 1 and 2 together on core 1 (``--affinity 0,1,1``): rank
0 is a device twice as fast as each of the others, like one new GPU beside two old ones.
Then, on this machine:

1. ``hapc profile --affinity 0,1,1`` measures the three ranks *together*, so the cluster
   file shows one fast device and two slow ones, and the link between them;
2. the model is planned for that cluster twice: even data parallelism (what one would do
   by hand) and the synthesized plan;
3. both programs run pinned the same way, alternating (``--repeats`` rounds) so that a
   change in the machine's load hits both alike, and the measured step times give the
   measured speed-up, printed beside the predicted one.

Run it with ``scripts/hetero_testbed.sh`` (or ``python -m profiler.testbed --help``). On a
machine shared with other work the absolute times move; the speed-up, from interleaved
runs, moves much less.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hapc.errors import UserError

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "configs" / "models" / "mlp.py"
# About 0.2 s per step on the 3-rank testbed: long enough that compute, not overhead, dominates.
DEFAULT_SET = ("layers=4", "features=512", "hidden=1024", "classes=100", "batch=384")


def run_testbed(*, affinity: str, model: str, overrides: dict, out_dir: Path, steps: int, repeats: int,
                quick: bool, cluster_path: str | None, say) -> dict:
    from costmodel.cluster import load_cluster
    from profiler.calibrate import run_plans
    from profiler.pin import parse_affinity
    from profiler.profile import profile

    pins = parse_affinity(affinity)
    if pins is None:
        raise UserError("--affinity is needed: the testbed is made by pinning ranks to cores")
    out_dir.mkdir(parents=True, exist_ok=True)
    if cluster_path is None:
        cluster_path = str(out_dir / "cluster.yaml")
        say(f"profiling {len(pins)} ranks pinned {affinity}")
        result = profile(cluster_path, quick=quick, affinity=affinity, say=say)
        print(result.summary(), flush=True)
    cluster = load_cluster(cluster_path)
    if cluster.world != len(pins):
        raise UserError(f"{cluster_path} has {cluster.world} devices but --affinity names {len(pins)} ranks")
    runs, notes = run_plans(model, overrides, cluster, ["dp-even", "hapc"], steps=steps, repeats=repeats,
                            affinity=affinity, workdir=out_dir, say=say)
    for n in notes:
        say(n)
    if len(runs) < 2:
        raise RuntimeError("; ".join(notes) or "a plan did not run")
    return {"cluster": cluster_path,
            "predicted": {r.plan: r.predicted_seconds for r in runs},
            "shares": {r.plan: r.plan_data["shares"] for r in runs},
            "measured": {r.plan: r.measured_seconds for r in runs},
            "steps": {r.plan: r.step_seconds for r in runs}}


def format_testbed(result: dict) -> str:
    lines = [f"{'plan':<8} {'shares':<18} {'predicted ms':>12} {'measured ms':>11}   steps (ms)"]
    for name in result["predicted"]:
        shares = "/".join(f"{s:.2f}" for s in result["shares"][name])
        runs = " ".join(f"{x * 1e3:.0f}" for x in result["steps"][name])
        lines.append(f"{name:<8} {shares:<18} {result['predicted'][name] * 1e3:12.1f} "
                     f"{result['measured'][name] * 1e3:11.1f}   {runs}")
    if {"dp-even", "hapc"} <= set(result["measured"]):
        pred = result["predicted"]["dp-even"] / result["predicted"]["hapc"]
        meas = result["measured"]["dp-even"] / result["measured"]["hapc"]
        lines.append(f"speed-up of the synthesized plan over even data parallel: measured {meas:.2f}x, "
                     f"predicted {pred:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from hapc.frontend.modelfile import parse_overrides

    parser = argparse.ArgumentParser(prog="python -m profiler.testbed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--affinity", default="0,1,1", help="core set per rank (default 0,1,1)")
    parser.add_argument("--model", default=str(DEFAULT_MODEL), metavar="MODEL.py")
    parser.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                        help=f"model overrides (default: {' '.join(DEFAULT_SET)} for the default model)")
    parser.add_argument("--out", default="out/testbed", help="folder for the cluster file and programs")
    parser.add_argument("--cluster", default=None, help="use this profiled cluster file instead of profiling")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds of the two plans")
    parser.add_argument("--quick", action="store_true", help="quick profile")
    args = parser.parse_args(argv)
    sets = args.set if args.set is not None else (list(DEFAULT_SET) if args.model == str(DEFAULT_MODEL) else [])

    def say(msg: str) -> None:
        print(f"  {msg}", file=sys.stderr, flush=True)

    try:
        result = run_testbed(affinity=args.affinity, model=args.model, overrides=parse_overrides(sets),
                             out_dir=Path(args.out), steps=args.steps, repeats=max(1, args.repeats),
                             quick=args.quick, cluster_path=args.cluster, say=say)
    except UserError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 2
    print(format_testbed(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
