"""Checkpoints: one safetensors file of tensors plus a JSON sidecar, both written atomically.

``<name>.safetensors`` holds every tensor: model weights (``model.<param>``), optimizer state tensors
(``optim.state.<index>.<name>``), RNG states (``rng.*``) and any extra tensors (``extra.*``).
``<name>.json`` holds everything else: the training config, model name and arguments (so a model can
be rebuilt without the training script), epoch, metrics, optimizer hyper-parameters and non-tensor
state, scheduler state, versions and time.
No pickle is involved, so loading a checkpoint never runs code.

Each file is written to a temporary file in the same directory, fsynced, then moved over the old one
with ``os.replace``; a failure while writing leaves the previous checkpoint untouched. Both files carry
the same random ``checkpoint_id``, so a pair torn by a crash between the two renames is detected on load.
"""
from __future__ import annotations

import json
import os
import platform
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

import capsnets
from capsnets.files import default_permissions, temp_beside
from capsnets.engine.runtime import rng_state_tensors

SUFFIX = ".safetensors"


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not fit the model it is loaded into."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: ``tensors`` from the safetensors file and ``meta`` from the JSON sidecar."""

    path: Path
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]

    def model_state(self) -> dict[str, torch.Tensor]:
        """The model's ``state_dict`` (keys without the ``model.`` prefix)."""
        return {k[len("model."):]: v for k, v in self.tensors.items() if k.startswith("model.")}


def sidecar_path(path: str | Path) -> Path:
    """The JSON sidecar that belongs to a ``.safetensors`` checkpoint."""
    return Path(path).with_suffix(".json")


def resolve_checkpoint_path(path: str | Path) -> Path:
    """Accept a run directory (its ``best``, else ``last``, checkpoint), a ``.safetensors`` or ``.json`` file."""
    path = Path(path)
    if path.is_dir():
        for name in ("best", "last"):
            if (path / f"{name}{SUFFIX}").is_file():
                return path / f"{name}{SUFFIX}"
        raise CheckpointError(f"no best{SUFFIX} or last{SUFFIX} in run directory '{path}'; train first or "
                              "pass the checkpoint file itself")
    return path.with_suffix(SUFFIX) if path.suffix == ".json" else path


def save_checkpoint(path: str | Path, *, model: nn.Module, meta: dict[str, Any],
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                    extra_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Atomically write ``model`` (+ optimizer, scheduler, RNG state) to ``path`` and its JSON sidecar.

    Args:
        path: target ``.safetensors`` file; the sidecar goes to the same name with ``.json``.
        model: the bare model (not a DDP / compiled wrapper).
        meta: JSON-safe information to store (config, model name and args, epoch, metrics...).
        optimizer: optional optimizer whose full state is saved.
        scheduler: optional learning-rate scheduler whose ``state_dict`` is saved.
        extra_tensors: other tensors to keep (e.g. a second copy of the weights), saved as ``extra.<key>``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": _cpu_copy(v) for k, v in model.state_dict().items()}
    tensors.update(rng_state_tensors())
    tensors.update({f"extra.{k}": _cpu_copy(v) for k, v in (extra_tensors or {}).items()})
    sidecar = {**meta, "checkpoint_id": uuid.uuid4().hex, "versions": _versions(),
               "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if optimizer is not None:
        optim_tensors, sidecar["optimizer"] = split_optimizer_state(optimizer.state_dict())
        tensors.update(optim_tensors)
    if scheduler is not None:
        sidecar["scheduler"] = scheduler.state_dict()
    payload = json.dumps(sidecar, indent=2, default=_json_default)
    metadata = {"checkpoint_id": sidecar["checkpoint_id"], "format": "capsnets"}
    tmp_tensors = _write_temp(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
    try:
        tmp_json = _write_temp(sidecar_path(path), lambda tmp: Path(tmp).write_text(payload))
    except BaseException:
        os.unlink(tmp_tensors)
        raise
    os.replace(tmp_tensors, path)
    os.replace(tmp_json, sidecar_path(path))
    _fsync_dir(path.parent)
    return path


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors stay on the CPU).

    Raises:
        CheckpointError: the file or sidecar is missing, unreadable, or the two do not belong together.
    """
    path = resolve_checkpoint_path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist; pass a run directory or a {SUFFIX} file")
    sidecar = sidecar_path(path)
    if not sidecar.is_file():
        raise CheckpointError(f"checkpoint '{path}' has no sidecar '{sidecar}'; copy it together with the "
                              f"{SUFFIX} file")
    try:
        tensors = load_file(path)
        with safe_open(path, framework="pt") as handle:
            header_id = (handle.metadata() or {}).get("checkpoint_id")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint '{path}' is corrupt or truncated ({err}); use another checkpoint, "
                              "e.g. last/best of the same run, or retrain") from err
    try:
        meta = json.loads(sidecar.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"sidecar '{sidecar}' is not valid JSON ({err}); the checkpoint is damaged") from err
    if meta.get("checkpoint_id") != header_id:
        raise CheckpointError(f"sidecar '{sidecar}' does not belong to '{path}' (checkpoint ids differ), "
                              "probably a save interrupted between the two files; use the other checkpoint")
    return Checkpoint(path=path, tensors=tensors, meta=meta)


def restore_model(model: nn.Module, checkpoint: Checkpoint) -> None:
    """Load the checkpoint's weights into ``model``; a key or shape mismatch raises ``CheckpointError``."""
    state = checkpoint.model_state()
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"checkpoint '{checkpoint.path}' does not fit the model (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, wrong shape {wrong[:5]}); build the model with the checkpoint's model name "
            f"and model_args ({checkpoint.meta.get('model')!r}, {checkpoint.meta.get('model_args')})")
    model.load_state_dict(state)


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


def split_optimizer_state(state: dict[str, Any], prefix: str = "optim.") -> tuple[dict[str, torch.Tensor],
                                                                                dict[str, Any]]:
    """Optimizer ``state_dict`` -> (flat tensors ``<prefix>state.<i>.<name>``, JSON-safe rest): how a
    checkpoint stores an optimizer without pickle (a second optimizer takes another ``prefix``)."""
    tensors, plain = {}, {}
    for index, param_state in state["state"].items():
        for name, value in param_state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}state.{index}.{name}"] = _cpu_copy(value)
            else:
                plain.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state["param_groups"], "plain_state": plain}


def join_optimizer_state(tensors: dict[str, torch.Tensor], saved: dict[str, Any], optimizer: torch.optim.Optimizer,
                         prefix: str = "optim.") -> dict[str, Any]:
    """Inverse of :func:`split_optimizer_state`: the ``state_dict`` to load into ``optimizer`` (whose
    list-valued hyper-parameters, e.g. Adam's betas, become tuples again)."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith(f"{prefix}state."):
            index, name = key[len(f"{prefix}state."):].split(".", 1)
            state.setdefault(int(index), {})[name] = value
    for index, values in saved.get("plain_state", {}).items():
        state.setdefault(int(index), {}).update(values)
    groups = []
    for current, group in zip(optimizer.param_groups, saved["param_groups"]):
        groups.append({k: tuple(v) if isinstance(current.get(k), tuple) else v for k, v in group.items()})
    return {"state": state, "param_groups": groups}


def _write_temp(target: Path, write: Callable[[str], Any]) -> str:
    """Write via ``write(tmp_path)`` to a fsynced temporary file beside ``target``; return its path."""
    tmp = temp_beside(target)
    try:
        write(tmp)
        default_permissions(tmp)  # safetensors replaces the file with an owner-only one
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True).contiguous()


def _versions() -> dict[str, str]:
    return {"capsnets": capsnets.__version__, "torch": torch.__version__, "python": platform.python_version()}


def _json_default(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint sidecar")


def build_model(name: str, model_args: dict[str, Any] | None = None, *, recorded: bool = False) -> nn.Module:
    """``capsnets.create_model(name, **model_args)``, with list values (from YAML/JSON) turned into tuples.

    ``recorded``: ``model_args`` come from an earlier run (a checkpoint, or a run being resumed): an argument
    whose default changed since, and which they do not name, gets its old value
    (:func:`~capsnets.models.registry.recorded_model_args`).
    """
    from capsnets.models import create_model
    from capsnets.models.registry import recorded_model_args

    args = {k: tuple(v) if isinstance(v, list) else v for k, v in (model_args or {}).items()}
    return create_model(name, **(recorded_model_args(name, args) if recorded else args))


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, Checkpoint]:
    """Rebuild the model recorded in a checkpoint's sidecar, load its weights, move it to ``device``.

    Args:
        path: a run directory (its best checkpoint), or a ``.safetensors`` / ``.json`` checkpoint file.
    """
    checkpoint = load_checkpoint(path)
    if "model" not in checkpoint.meta:
        raise CheckpointError(f"sidecar of '{checkpoint.path}' does not name the model; it was not written "
                              "by capsnets' trainer")
    model = build_model(checkpoint.meta["model"], checkpoint.meta.get("model_args"), recorded=True)
    restore_model(model, checkpoint)
    return model.to(device).eval(), checkpoint
