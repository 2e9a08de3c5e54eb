"""``hapc calibrate``: run several plans of a model, compare measured and predicted step times,
fit the cost model (the work is :mod:`profiler.calibrate`'s)."""

from __future__ import annotations

import argparse

from hapc.cli.common import SET_HELP, examples, key_value, progress


EXAMPLES = (
    'hapc calibrate configs/models/gpt.py --cluster cluster.yaml --repeats 2 --write',
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser("calibrate", help="run several plans of a model, compare measured and predicted "
                                           "step times, fit the cost model",
                         description="Emit and run the baselines and the synthesized plan of MODEL.py on this "
                                     "machine, compare measured with predicted step times (rank correlation, "
                                     "median error), fit efficiency, launch and link scales, and report "
                                     "before/after; --write puts the fitted values into the cluster file.", **examples(*EXAMPLES))
    cal.add_argument("model", metavar="MODEL.py", help="the model file: model() and inputs(), see configs/models/README.md")
    cal.add_argument("--cluster", required=True, metavar="CLUSTER.yaml",
                      help="the cluster file (YAML: nodes, devices, links), e.g. configs/clusters/small-mixed.yaml")
    cal.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=key_value, help=SET_HELP)
    cal.add_argument("--plans", default="dp-even,dp-flops,megatron-tp,zero3,hapc",
                     help="comma-separated plans to run (baselines and 'hapc', the synthesized one); "
                          "'none' refits the --runs file without running")
    cal.add_argument("--steps", type=int, default=6, help="training steps per run (the first is not timed)")
    cal.add_argument("--repeats", type=int, default=1,
                     help="alternating rounds of all plans; each plan's time is the median over rounds")
    cal.add_argument("--affinity", default=None, metavar="CORES",
                     help="pin ranks as profiled (default: the cluster file's hapc-affinity line)")
    cal.add_argument("--fit", default="compute,memory,launch,comm,latency",
                     help="what to fit: compute, memory, launch, comm, latency, or op classes (matmul, ...)")
    cal.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                     help="where the programs run (auto: GPUs when the cluster's devices are GPUs and this "
                          "machine has one per rank of a node, else CPU ranks)")
    cal.add_argument("--size", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                     help="run the plans for this model config too (repeatable; merged over --set): several "
                          "sizes give a one-GPU cluster, where every plan is one program, enough runs to fit")
    cal.add_argument("--runs", default=None, metavar="RUNS.json",
                     help="add these measurements to earlier ones in RUNS.json and fit on all of them")
    cal.add_argument("--write", action="store_true", help="write the fitted values into the cluster file")
    cal.add_argument("--workdir", default=None, metavar="DIR", help="keep the emitted programs here")
    cal.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per run")
    cal.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    cal.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from profiler.calibrate import calibrate_cli

    return calibrate_cli(args, say=progress(args))
