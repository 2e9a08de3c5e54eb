"""``hapc profile``: measure this machine's devices and links (and, with --model, a model's ops)
and write the cluster file the cost model loads."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hapc.cli.common import check_precision, examples, key_value, progress
from hapc.errors import UserError


EXAMPLES = (
    'hapc profile -o cluster.yaml --quick',
    'hapc profile -o cluster.yaml --merge configs/clusters/hap-8gpu-v100x4-p100x4.yaml',
    'hapc profile -o cluster.yaml --ops-only --model model.py --precision bf16',
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    prof = sub.add_parser("profile", help="measure this machine's devices and links and write a cluster file",
                          description="Start N ranks (or run under torchrun), measure matmul FLOPS per dtype, "
                                      "memory bandwidth, op overhead and op-class efficiencies on every device "
                                      "at once, time the collectives, fit each link's latency and bandwidth, "
                                      "and write a cluster file the cost model loads.", **examples(*EXAMPLES))
    prof.add_argument("-o", "--output", required=True, metavar="CLUSTER.yaml", help="the cluster file to write")
    prof.add_argument("--nproc", type=int, default=None,
                      help="ranks to start (default: one per GPU, or one per CPU core)")
    prof.add_argument("--merge", default=None, metavar="EXISTING.yaml",
                      help="keep this file's topology, names and counts; replace its numbers")
    prof.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    prof.add_argument("--affinity", default=None, metavar="CORES",
                      help="pin rank i to the i-th core set, e.g. 0,1,1 (ranks 1 and 2 share core 1)")
    prof.add_argument("--threads", type=int, default=1, help="threads per rank (default 1)")
    prof.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                      help="what to measure (auto: the GPUs when there are any, else CPU cores)")
    prof.add_argument("--no-op-classes", action="store_true", help="skip the per-op-class efficiencies")
    prof.add_argument("--model", default=None, metavar="MODEL.py",
                      help="also time every distinct op of this model (forward and backward, shard sizes) on "
                           "one device; stored beside the cluster file (CLUSTER.ops.json), used by the cost model")
    prof.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=key_value, help="model config override")
    prof.add_argument("--precision", default="fp32", metavar="fp32|bf16|fp16", help="time the model's ops as this "
                      "precision runs them (bf16, fp16: under autocast)")
    prof.add_argument("--ops-only", action="store_true",
                      help="with --model: keep the existing cluster file, only time the model's ops")
    prof.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    prof.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from profiler.profile import profile

    if args.model:
        check_precision(args.precision, allow_auto=False)
    if args.ops_only:
        if not args.model:
            raise UserError("--ops-only times a model's ops: give --model MODEL.py", where="--ops-only")
        return _profile_model_ops(args)
    result = profile(args.output, nproc=args.nproc, merge=args.merge, quick=args.quick, affinity=args.affinity,
                     threads=args.threads, device=args.device, op_classes=not args.no_op_classes,
                     say=progress(args))
    if result is not None:          # None on the ranks other than 0 under torchrun
        print(result.summary())
        if args.model:
            return _profile_model_ops(args)
    return 0


def _profile_model_ops(args: argparse.Namespace) -> int:
    """Time the model's distinct op signatures on one device of this machine and store them
    beside the cluster file (see profiler.ops and costmodel.optable)."""
    import time

    import torch

    from costmodel.cluster_file import read_cluster_file
    from costmodel.optable import measured_share, table_path
    from hapc.frontend.modelfile import load_model_file, parse_overrides, trace_for_device
    from hapc.frontend.tracer import trace
    from hapc.ir.precision import autocast_graph
    from profiler.ops import profile_ops
    from profiler.profile import _device_type

    say = progress(args)
    started = time.perf_counter()
    cluster = read_cluster_file(args.output)
    device_type = _device_type(args.device)
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cpu":
        torch.set_num_threads(args.threads)     # as the profiled ranks (and emitted programs) run
    mf = load_model_file(args.model, parse_overrides(args.set))
    say(f"tracing {args.model}")
    graph = autocast_graph(trace_for_device(mf, trace, device_type).graph, args.precision)
    failed: list[str] = []
    table = profile_ops(graph, args.output, cluster.devices[0].type, device,
                        autocast={"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision),
                        allow_tf32=cluster.allow_tf32, failures=failed, say=say)
    if failed:
        print(f"hapc: warning: these ops did not run on {device_type} in {args.precision} (no kernel for it "
              f"here?) and are priced by the roofline: {', '.join(sorted(failed))}", file=sys.stderr)
    measured, total = measured_share(graph, table)
    print(f"per-op times: {measured} of {total} op nodes of {Path(args.model).name} measured on "
          f"{table.device_name} ({len(table.entries)} signatures in the table) in "
          f"{time.perf_counter() - started:.1f} s; wrote {table_path(args.output)}")
    return 0
