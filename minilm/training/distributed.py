"""Data-parallel training across processes started by ``torchrun`` (gloo on CPU, nccl on CUDA).

Every rank draws the same global batch and takes its own rows (``minilm.training.loop``), so N
processes reproduce one process with ``grad_accum x N``.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed

from minilm.common import resolve_device


@dataclasses.dataclass
class Dist:
    """This process's place in a torchrun process group: its rank, local rank and the world size
    (one process: rank 0 of 1)."""

    rank: int = 0
    local_rank: int = 0
    world: int = 1
    owned: bool = False  # this process group was created by train() and is destroyed at its end

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self):
        if self.enabled:
            torch.distributed.barrier()

    def finish(self) -> None:
        """The run's last barrier, then the process group destroyed where ``train()`` created it.

        Call it once nothing holds the DDP wrapper any more. DDP's Reducer, if it holds the
        group's last reference, frees the group with the GIL held, and gloo's destructor joins
        worker threads that may still need the GIL to free a finished collective's tensors: a
        deadlock at exit, seen in 4 of 36 two-process runs on two busy cores. Dropped by
        ``destroy_process_group``, the group is freed with the GIL released."""
        self.barrier()
        if self.owned:
            torch.distributed.destroy_process_group()


def init_distributed(train_cfg) -> Dist:
    """Join the process group when started by torchrun (WORLD_SIZE > 1): gloo on CPU, nccl on CUDA.
    A group that is already initialised (by the caller) is used as it is."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return Dist(
            rank=dist.get_rank(), local_rank=int(os.environ.get("LOCAL_RANK", "0")), world=dist.get_world_size()
        )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(train_cfg.device, setting="train.device", local_rank=local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(rank=rank, local_rank=local_rank, world=world, owned=True)
