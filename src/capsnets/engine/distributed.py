"""Data-parallel set-up from ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).

Run ``torchrun --nproc_per_node=N -m capsnets train ...``: each process joins the group (NCCL on CUDA,
gloo on CPU), uses ``cuda:LOCAL_RANK``, and wraps its model in ``DistributedDataParallel``, which
averages gradients, so the per-process loss must be a mean over the local batch. The data loader gives
each rank a slice of every global batch. Only rank 0 writes files and shows a progress bar.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from capsnets.engine.runtime import resolve_device


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the group (``world_size == 1``: not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # True if we created the process group and must destroy it

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: str = "auto") -> tuple[DistContext, torch.device]:
    """Join the process group described by torchrun's environment, or run alone if there is none.

    Args:
        device: the configured device (``"auto"``, ``"cpu"``, ``"cuda"``...). Under torchrun a CUDA
            device becomes ``cuda:LOCAL_RANK``.

    Returns:
        the :class:`DistContext` and the device this process trains on.
    """
    if dist.is_available() and dist.is_initialized():  # set up by the caller: use it, do not destroy it
        context = DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
        return context, _rank_device(device, context.local_rank)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistContext(), resolve_device(device)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    target = _rank_device(device, local_rank)
    if target.type == "cuda":
        torch.cuda.set_device(target)
    dist.init_process_group("nccl" if target.type == "cuda" else "gloo", rank=rank, world_size=world_size)
    return DistContext(rank, world_size, local_rank, owns_group=True), target


def teardown(context: DistContext) -> None:
    """Destroy the process group if :func:`setup` created it."""
    if context.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, context: DistContext, device: torch.device) -> nn.Module:
    """``DistributedDataParallel(model)`` when distributed, else ``model`` unchanged."""
    if not context.enabled:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def all_reduce_sum(tensor: torch.Tensor, context: DistContext) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place (no-op when not distributed); returns it."""
    if context.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def _rank_device(device: str, local_rank: int) -> torch.device:
    resolved = resolve_device(device)
    if resolved.type == "cuda" and resolved.index is None:
        return torch.device("cuda", local_rank)
    return resolved
