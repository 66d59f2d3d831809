"""Processes: joining the process group torchrun describes, collectives the loop uses, the replica
check, and the stop signals (SIGINT / SIGTERM) every process obeys."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: Optional[str] = None) -> DistInfo:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR / PORT),
    or run alone. gloo for CPU, nccl for CUDA."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", local_rank)
    elif torch.cuda.is_available():
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=timedelta(minutes=30))
        owns = True
    if world > 1 and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    if dev.type == "cpu" and local_world > 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    return DistInfo(rank, world, local_rank, local_world, dev, owns)


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def all_reduce_sum(info: DistInfo, t: torch.Tensor) -> torch.Tensor:
    """The sum of `t` over the processes, on the CPU."""
    if info.distributed:
        t = t.to(info.device)
        dist.all_reduce(t)
    return t.cpu()


def all_reduce_max(info: DistInfo, value: float) -> float:
    """The largest `value` of the processes."""
    if not info.distributed:
        return value
    t = torch.tensor([value], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def check_replicas(info: DistInfo, model: nn.Module, warn: Callable[[str], None]) -> None:
    """Every process must hold the same weights (DDP averages the gradients); a checksum per
    process, compared, catches a process that drifted."""
    if not info.distributed:
        return
    with torch.no_grad():
        mine = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    sums = [torch.zeros_like(mine, device=info.device) for _ in range(info.world_size)]
    dist.all_gather(sums, mine.to(info.device))
    values = [float(x) for x in sums]
    if max(values) != min(values):
        warn(f"warning: the model replicas differ between processes (weight checksums {values})")


class StopRequest:
    """SIGINT / SIGTERM set a flag the loop reads after each step; a second SIGINT stops at once."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous = {}

    def _handler(self, signum, frame):
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self._previous.items():
            signal.signal(s, h)
        return False
