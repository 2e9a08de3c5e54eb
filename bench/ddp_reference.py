"""Hand-written torch DDP training of a model file: the reference that an emitted pure
data-parallel program's step time is compared with (design.md: within 5% of DDP).

    torchrun --nproc_per_node=4 bench/ddp_reference.py configs/models/mlp.py \\
        --set hidden=2048 --set batch=64 --steps 10

It does what a user would write by hand: same seed and model as the emitted program, the
global batch split evenly over ranks, ``DistributedDataParallel`` (gradient all-reduce in
25 MB buckets overlapped with backward), AdamW; it prints each step's time and the median over
steps 2..K in the emitted program's format. Not a test by itself (pytest collects test_*.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # run as a script by torchrun
from hapc.runtime.collectives import fused_optimizer, keep_freed_memory


def _value(raw: str):
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(raw.lower(), raw)


def _call_with(fn, kwargs):
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    kwargs = {k: _value(v) for k, v in (s.split("=", 1) for s in args.set)}

    spec = importlib.util.spec_from_file_location("ddp_model_file", args.model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    keep_freed_memory()     # the allocator setting emitted CPU programs use: compare like with like
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(_call_with(module.model, kwargs))
    optimizer = fused_optimizer(torch.optim.AdamW, list(model.parameters()), lr=1e-3)   # as emitted programs
    batch = [t.tensor_split(world)[rank] for t in _call_with(module.inputs, kwargs)]
    times = []
    for i in range(args.steps):
        start = time.perf_counter()
        loss = model(*batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        if rank == 0:
            print(f"step {i + 1} loss {loss.item():.6f} time {times[-1]:.6f}", flush=True)
    if rank == 0 and len(times) > 1:
        print(f"median step time {statistics.median(times[1:]):.6f} s over steps 2..{len(times)}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
