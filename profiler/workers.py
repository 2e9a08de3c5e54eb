"""Running the measurements on every rank: spawned here, or already started by torchrun.

Every rank measures its own device *at the same time as the others* (barriers between the
benchmarks), because that is how training uses them: two ranks sharing a CPU core each get
half of it, and only a simultaneous measurement shows that. Then the ranks time collectives:
within each node (the node's ``intra_link``) and, when torchrun spans several nodes, between
one rank per node (the ``network``). Rank 0 gathers everything into one JSON-able dict.

Spawned ranks use ``fork`` on CPU (they inherit the imported modules, so starting them
takes a fraction of a second) and ``spawn`` when CUDA is used (CUDA does not survive a
fork). One thread per rank by default, like ``OMP_NUM_THREADS=1`` for emitted programs.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from hapc.runtime.collectives import keep_freed_memory
from profiler.comm import measure_collectives, measure_overlap
from profiler.device import measure_device
from profiler.opclass_bench import measure_classes
from profiler.pin import pin


@dataclass(frozen=True)
class WorkerConfig:
    """What every rank needs to know; plain values so it pickles for spawn."""

    device_type: str                    # "cpu" or "cuda"
    quick: bool
    threads: int
    affinity: tuple[tuple[int, ...], ...] | None
    op_classes: bool
    result_path: str
    verbose: bool = True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(nproc: int, config: WorkerConfig) -> dict:
    """Start ``nproc`` ranks on this machine, run the measurements, return rank 0's result."""
    import torch.multiprocessing as mp

    port = free_port()
    method = "spawn" if config.device_type == "cuda" else "fork"
    mp.start_processes(_spawned, args=(nproc, port, config), nprocs=nproc, start_method=method, join=True)
    return json.loads(Path(config.result_path).read_text())


def _spawned(rank: int, world: int, port: int, config: WorkerConfig) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    run_rank(config)


def run_rank(config: WorkerConfig) -> dict | None:
    """One rank's part (process group from the environment); rank 0 writes and returns the result."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if config.affinity:
        pin(set(config.affinity[local_rank]))
    torch.set_num_threads(config.threads)
    if config.device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=300))
    else:
        device = torch.device("cpu")
        keep_freed_memory()        # as emitted programs run on CPU: measure what they will see
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    try:
        return _measure(device, config)
    finally:
        dist.destroy_process_group()


def _measure(device: torch.device, config: WorkerConfig) -> dict | None:
    rank, world = dist.get_rank(), dist.get_world_size()
    say: Callable[[str], None] = (lambda m: print(f"  [profile] {m}", file=sys.stderr, flush=True)) \
        if rank == 0 and config.verbose else (lambda m: None)
    hosts: list[str | None] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    node_of = _node_index(hosts)
    node_ranks = [[r for r in range(world) if node_of[r] == n] for n in range(max(node_of) + 1)]
    on_host = len(node_ranks[node_of[rank]])

    def barrier() -> None:
        dist.barrier()

    say(f"{world} ranks on {len(node_ranks)} node(s), {config.threads} thread(s) each; measuring devices together")
    numbers = measure_device(device, quick=config.quick, ranks_on_host=on_host, between=barrier, say=say)
    classes = {}
    if config.op_classes:
        classes = measure_classes(device, numbers.peak_flops["fp32"], numbers.hbm_bandwidth_Bps,
                                  numbers.launch_seconds, quick=config.quick, between=barrier, say=say)
    barrier()

    samples, skipped = [], {}
    # Within each node: every node's group at once (no traffic crosses nodes).
    groups = [dist.new_group(ranks) if len(node_ranks) > 1 else None for ranks in node_ranks]
    mine = node_ranks[node_of[rank]]
    if len(mine) > 1:
        s, k = measure_collectives(groups[node_of[rank]], mine, device, "intra", quick=config.quick,
                                   say=say if node_of[rank] == 0 else (lambda m: None))
        if node_of[rank] == 0:
            samples += s
            skipped.update({f"intra {kind}": why for kind, why in k.items()})
    barrier()
    if node_of[rank] == 0:
        say("overlap of an asynchronous all-reduce with compute")
    overlap = measure_overlap(None, device) if world > 1 else 1.0
    # Between nodes: the first rank of each node.
    if len(node_ranks) > 1:
        leaders = [ranks[0] for ranks in node_ranks]
        net = dist.new_group(leaders)
        if rank in leaders:
            s, k = measure_collectives(net, leaders, device, "network", quick=config.quick, say=say)
            if rank == 0:
                samples += s
                skipped.update({f"network {kind}": why for kind, why in k.items()})
        barrier()

    every: list[dict | None] = [None] * world
    dist.all_gather_object(every, {"rank": rank, "host": hosts[rank], "device": numbers.to_dict(),
                                   "op_classes": classes})
    if rank != 0:
        return None
    result = {"world": world, "device_type": device.type, "threads": config.threads,
              "affinity": [list(a) for a in config.affinity] if config.affinity else None,
              "nodes": node_ranks, "ranks": every, "collectives": [s.to_dict() for s in samples],
              "skipped_collectives": skipped, "comm_overlap": overlap, "torch": torch.__version__,
              "quick": config.quick}
    Path(config.result_path).write_text(json.dumps(result))
    return result


def _node_index(hosts: list) -> list[int]:
    """Node number of each rank, nodes numbered in order of their first rank."""
    order: dict[str, int] = {}
    return [order.setdefault(h, len(order)) for h in hosts]
