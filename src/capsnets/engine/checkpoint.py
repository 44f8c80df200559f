"""Training checkpoints: a model with its optimizer, scheduler and RNG state, so that a run resumes exactly.

The file format (safetensors + JSON sidecar, atomic, with digests and a format version) is
:mod:`capsnets.checkpoints`'s; a model alone is saved and loaded by :mod:`capsnets.models.hub`. Here a checkpoint adds
what training needs: optimizer state tensors (``optim.state.<index>.<name>``, the rest in the sidecar's
``"optimizer"``), the scheduler's ``state_dict``, RNG states (``rng.*``) and any extra tensors (``extra.*``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsnets.checkpoints import Checkpoint, CheckpointError, cpu_copy, write_checkpoint
from capsnets.engine.runtime import rng_state_tensors
from capsnets.models.hub import model_tensors

__all__ = ["join_optimizer_state", "restore_training", "save_checkpoint", "split_optimizer_state"]


def save_checkpoint(
    path: str | Path,
    *,
    model: nn.Module,
    meta: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Atomically write ``model`` (+ optimizer, scheduler, RNG state) to ``path`` and its JSON sidecar.

    Args:
        path: target ``.safetensors`` file; the sidecar goes to the same name with ``.json``.
        model: the bare model (not a DDP / compiled wrapper).
        meta: JSON-safe information to store (config, model name and args, epoch, metrics...).
        optimizer: optional optimizer whose full state is saved.
        scheduler: optional learning-rate scheduler whose ``state_dict`` is saved.
        extra_tensors: other tensors to keep (e.g. a second copy of the weights), saved as ``extra.<key>``.

    Raises:
        CheckpointWriteError: the file could not be written; the checkpoint saved there before is intact.
    """
    tensors = {**model_tensors(model), **rng_state_tensors()}
    tensors.update({f"extra.{k}": v for k, v in (extra_tensors or {}).items()})
    meta = dict(meta)
    if optimizer is not None:
        optim_tensors, meta["optimizer"] = split_optimizer_state(optimizer.state_dict())
        tensors.update(optim_tensors)
    if scheduler is not None:
        meta["scheduler"] = scheduler.state_dict()
    return write_checkpoint(path, tensors, meta)


def restore_training(checkpoint: Checkpoint, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> None:
    """Load the optimizer (and scheduler) state saved in ``checkpoint``."""
    if "optimizer" not in checkpoint.meta:
        raise CheckpointError(f"checkpoint '{checkpoint.path}' holds no optimizer state; it cannot be resumed")
    state = join_optimizer_state(checkpoint.tensors, checkpoint.meta["optimizer"], optimizer)
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as err:
        raise CheckpointError(f"optimizer state in '{checkpoint.path}' does not fit: {err}") from err
    if scheduler is not None and "scheduler" in checkpoint.meta:
        scheduler.load_state_dict(checkpoint.meta["scheduler"])


def split_optimizer_state(
    state: dict[str, Any], prefix: str = "optim."
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Optimizer ``state_dict`` -> (flat tensors ``<prefix>state.<i>.<name>``, JSON-safe rest): how a
    checkpoint stores an optimizer without pickle (a second optimizer takes another ``prefix``)."""
    tensors, plain = {}, {}
    for index, param_state in state["state"].items():
        for name, value in param_state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}state.{index}.{name}"] = cpu_copy(value)
            else:
                plain.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state["param_groups"], "plain_state": plain}


def join_optimizer_state(
    tensors: dict[str, torch.Tensor], saved: dict[str, Any], optimizer: torch.optim.Optimizer, prefix: str = "optim."
) -> dict[str, Any]:
    """Inverse of :func:`split_optimizer_state`: the ``state_dict`` to load into ``optimizer`` (whose
    list-valued hyper-parameters, e.g. Adam's betas, become tuples again)."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith(f"{prefix}state."):
            index, name = key[len(f"{prefix}state.") :].split(".", 1)
            state.setdefault(int(index), {})[name] = value
    for index, values in saved.get("plain_state", {}).items():
        state.setdefault(int(index), {}).update(values)
    groups = []
    for current, group in zip(optimizer.param_groups, saved["param_groups"]):
        groups.append({k: tuple(v) if isinstance(current.get(k), tuple) else v for k, v in group.items()})
    return {"state": state, "param_groups": groups}
