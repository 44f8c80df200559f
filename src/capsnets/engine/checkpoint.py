"""Checkpoints: one safetensors file of tensors plus a JSON sidecar, both written atomically.

``<name>.safetensors`` holds every tensor: model weights (``model.<param>``), optimizer state tensors
(``optim.state.<index>.<name>``), RNG states (``rng.*``) and any extra tensors (``extra.*``).
``<name>.json`` holds everything else: the training config, model name and arguments (so a model can
be rebuilt without the training script), epoch, metrics, optimizer hyper-parameters and non-tensor
state, scheduler state, versions and time.
No pickle is involved, so loading a checkpoint never runs code. The header also records the SHA-256 of the
tensors and of the sidecar, checked on loading: a damaged file is reported, never loaded as other numbers.

A save has one commit point. The safetensors file also holds the whole sidecar (its header's metadata
entry ``"sidecar"``); it is written to a temporary file in the same directory, fsynced, and moved over the
old one with ``os.replace``. Only then is the ``.json`` file written (the same way): a readable copy. A crash
at any moment leaves either the old or the new checkpoint, complete: a ``.json`` left stale by a crash after
the commit point is recognised by its ``checkpoint_id``, the copy inside the checkpoint is used, and
:func:`recover_directory` rewrites it; a temporary file left by a crash before the commit point is removed
by :func:`recover_directory`. Checkpoints written before the sidecar was embedded are read from the pair
of files, their ids compared.
"""
from __future__ import annotations

import hashlib
import json
import logging
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
from capsnets.files import atomic_write, default_permissions, temp_beside
from capsnets.engine.runtime import rng_state_tensors

logger = logging.getLogger(__name__)

SUFFIX = ".safetensors"
#: The safetensors metadata entry holding the sidecar's JSON text.
EMBEDDED_SIDECAR = "sidecar"
#: Metadata entries holding the SHA-256 of the tensors (:func:`tensors_digest`) and of the embedded sidecar.
TENSORS_DIGEST, SIDECAR_DIGEST = "tensors_sha256", "sidecar_sha256"


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not fit the model it is loaded into."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, no permission); the previous one is intact."""


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
    metadata = {"checkpoint_id": sidecar["checkpoint_id"], "format": "capsnets", EMBEDDED_SIDECAR: payload,
                TENSORS_DIGEST: tensors_digest(tensors), SIDECAR_DIGEST: _text_digest(payload)}
    try:
        tmp_tensors = _write_temp(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
        os.replace(tmp_tensors, path)  # the commit point
        _fsync_dir(path.parent)
    except (OSError, SafetensorError) as err:
        raise CheckpointWriteError(f"could not write checkpoint '{path}' ({_reason(err)}); the checkpoint saved "
                                   "there before is intact. Free disk space or fix the folder's permissions, then "
                                   "resume") from err
    try:
        atomic_write(sidecar_path(path), lambda tmp: Path(tmp).write_text(payload), fsync=True)
    except OSError as err:
        raise CheckpointWriteError(f"checkpoint '{path}' is saved, but its readable copy '{sidecar_path(path)}' "
                                   f"could not be written ({_reason(err)}); the checkpoint is complete without it. "
                                   "Free disk space, then resume") from err
    return path


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors stay on the CPU).

    The sidecar is validated (types of the entries this library reads). A ``.json`` file that does not belong
    to the checkpoint (a save interrupted after its commit point) is reported and the copy inside the checkpoint
    is used.

    Raises:
        CheckpointError: the file or sidecar is missing, unreadable, damaged, or the two do not belong together.
    """
    path = resolve_checkpoint_path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist; pass a run directory or a {SUFFIX} file")
    try:
        tensors = load_file(path)
        with safe_open(path, framework="pt") as handle:
            header = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint '{path}' is corrupt or truncated ({_reason(err)}); use another checkpoint, "
                              "e.g. last/best of the same run, or retrain") from err
    sidecar = sidecar_path(path)
    embedded = header.get(EMBEDDED_SIDECAR)
    _check_digests(path, header, tensors)
    if embedded is not None:
        meta = _parse_sidecar(embedded, f"the sidecar inside '{path}'")
        if meta.get("checkpoint_id") != header.get("checkpoint_id"):
            raise CheckpointError(f"the sidecar inside '{path}' does not match its header; the checkpoint is damaged: "
                                  "use another checkpoint, e.g. last/best of the same run, or retrain")
        if _sidecar_id(sidecar) != meta["checkpoint_id"]:
            logger.warning("'%s' is missing or belongs to an earlier save (a save interrupted after its commit "
                           "point); using the copy of the sidecar inside '%s'", sidecar, path)
    else:  # written before the sidecar was embedded: the pair of files
        if not sidecar.is_file():
            raise CheckpointError(f"checkpoint '{path}' has no sidecar '{sidecar}'; copy it together with the "
                                  f"{SUFFIX} file")
        meta = _parse_sidecar(_read_text(sidecar), f"sidecar '{sidecar}'")
        if meta.get("checkpoint_id") != header.get("checkpoint_id"):
            raise CheckpointError(f"sidecar '{sidecar}' does not belong to '{path}' (checkpoint ids differ), "
                                  "probably a save interrupted between the two files; use the other checkpoint")
    validate_sidecar(meta, f"the sidecar of '{path}'")
    return Checkpoint(path=path, tensors=tensors, meta=meta)


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of tensors' names, dtypes, shapes and bytes, in name order: what a checkpoint records of its
    tensors (header entry ``"tensors_sha256"``), so that flipped bytes in a file are found when it is read."""
    sha = hashlib.sha256()
    for key in sorted(tensors):
        tensor = tensors[key].detach().to("cpu").contiguous()
        sha.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        sha.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return sha.hexdigest()


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _check_digests(path: Path, header: dict[str, str], tensors: dict[str, torch.Tensor]) -> None:
    """Raise :class:`CheckpointError` if the tensors or the embedded sidecar are not what was saved (checkpoints
    written before the digests were recorded are not checked)."""
    damaged = []
    if TENSORS_DIGEST in header and tensors_digest(tensors) != header[TENSORS_DIGEST]:
        damaged.append("its tensors")
    if SIDECAR_DIGEST in header and _text_digest(header.get(EMBEDDED_SIDECAR, "")) != header[SIDECAR_DIGEST]:
        damaged.append("its sidecar")
    if damaged:
        raise CheckpointError(f"checkpoint '{path}' is damaged: the checksum of {' and '.join(damaged)} does not match "
                              "the one recorded when it was saved; use another checkpoint, e.g. last/best of the same "
                              "run, or retrain")


def _embedded_sidecar_intact(header: dict[str, str]) -> bool:
    """Whether a header's embedded sidecar is the one saved (when its digest was recorded)."""
    return SIDECAR_DIGEST not in header or _text_digest(header.get(EMBEDDED_SIDECAR, "")) == header[SIDECAR_DIGEST]


#: Sidecar entries this library reads, and the types they must have when present.
_SIDECAR_TYPES: dict[str, tuple[type, ...]] = {
    "checkpoint_id": (str,), "model": (str,), "model_args": (dict,), "dataset": (str,), "config": (dict,),
    "epoch": (int, float), "metrics": (dict,), "training": (dict,), "optimizer": (dict,), "scheduler": (dict,),
    "history": (list,), "recipe": (dict,), "classes": (list,)}


def validate_sidecar(meta: Any, where: str) -> None:
    """Raise :class:`CheckpointError` if ``meta`` is not a mapping whose known entries have the right types."""
    def damaged(what: str) -> CheckpointError:
        return CheckpointError(f"{where} is damaged: {what}; use another checkpoint (e.g. last/best of the same "
                               "run) or retrain")

    if not isinstance(meta, dict):
        raise damaged(f"expected a JSON object, got {type(meta).__name__}")
    for key, types in _SIDECAR_TYPES.items():
        value = meta.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise damaged(f"'{key}' should be {' or '.join(t.__name__ for t in types)}, got {value!r:.60}")
    if isinstance(meta.get("epoch"), (int, float)) and not meta["epoch"] >= 0:  # NaN too
        raise damaged(f"'epoch' is negative ({meta['epoch']})")
    optimizer = meta.get("optimizer")
    if optimizer is not None:
        groups = optimizer.get("param_groups")
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            raise damaged("'optimizer.param_groups' should be a list of objects")
        if not isinstance(optimizer.get("plain_state", {}), dict):
            raise damaged("'optimizer.plain_state' should be an object")


def _parse_sidecar(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{where} is not valid JSON ({err}); the checkpoint is damaged: use another "
                              "checkpoint, e.g. last/best of the same run, or retrain") from err


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"cannot read sidecar '{path}' ({_reason(err)})") from err


def _text_or_none(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _sidecar_id(sidecar: Path) -> str | None:
    """The ``checkpoint_id`` of a ``.json`` sidecar, or None if it is missing or unreadable."""
    return _json_entry(sidecar, "checkpoint_id")


def peek_sidecar(path: str | Path) -> dict[str, Any] | None:
    """The sidecar of a checkpoint, read from its header alone (no tensor is read, so it is not validated against
    them), or None if the file is missing or its header unreadable or damaged."""
    try:
        with safe_open(Path(path), framework="pt") as handle:
            header = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError):
        return None
    if EMBEDDED_SIDECAR not in header:  # written before the sidecar was embedded
        meta = _json_entry(sidecar_path(path), None)
        return meta if isinstance(meta, dict) and meta.get("checkpoint_id") == header.get("checkpoint_id") else None
    if not _embedded_sidecar_intact(header):
        return None
    try:
        meta = json.loads(header[EMBEDDED_SIDECAR])
    except json.JSONDecodeError:
        return None
    return meta if isinstance(meta, dict) else None


def checkpoint_epoch(path: str | Path) -> int | float | None:
    """The epoch a checkpoint records (read from its header alone), or None if it is missing or unreadable."""
    epoch = (peek_sidecar(path) or {}).get("epoch")
    return epoch if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) else None


def _json_entry(path: Path, key: str | None) -> Any:
    """Entry ``key`` of the JSON object in ``path`` (``None``: the object), or None if it is missing or unreadable."""
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if key is None:
        return value
    return value.get(key) if isinstance(value, dict) else None


def recover_directory(directory: str | Path) -> list[str]:
    """Clean up after saves interrupted by a crash, in ``directory``; returns one message per repair (also logged).

    - A temporary file (``.<name>.<random>.tmp``) is what a save left before its commit point: the file beside
      it is the one saved before, complete. It is removed.
    - A ``.json`` sidecar missing, older than the checkpoint it belongs to (a crash after the commit point) or
      otherwise different from the copy inside the checkpoint (damaged) is rewritten from that copy.
    """
    directory = Path(directory)
    messages = []
    if not directory.is_dir():
        return messages
    for leftover in sorted(directory.glob(".*.tmp")):
        if leftover.is_file():
            leftover.unlink()
            messages.append(f"removed '{leftover}', left by a write that a crash interrupted (the file it was "
                            "to replace is the complete earlier version)")
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        try:
            with safe_open(path, framework="pt") as handle:
                header = handle.metadata() or {}
        except (SafetensorError, OSError, ValueError):
            continue  # reported when something loads it
        embedded = header.get(EMBEDDED_SIDECAR)
        if embedded is None or _text_or_none(sidecar_path(path)) == embedded or not _embedded_sidecar_intact(header):
            continue  # a damaged checkpoint is reported when something loads it
        damaged = sidecar_path(path).exists() and _sidecar_id(sidecar_path(path)) in (None, header.get("checkpoint_id"))
        why = "it was damaged" if damaged else "a save was interrupted after its commit point"
        atomic_write(sidecar_path(path), lambda tmp: Path(tmp).write_text(embedded), fsync=True)
        messages.append(f"rewrote '{sidecar_path(path)}' from the copy inside '{path}' ({why})")
    for message in messages:
        logger.warning("%s", message)
    return messages


def restore_model(model: nn.Module, checkpoint: Checkpoint) -> None:
    """Load the checkpoint's weights into ``model``; a key or shape mismatch raises ``CheckpointError``."""
    _check_fits(model, checkpoint)
    model.load_state_dict(checkpoint.model_state())


def _check_fits(model: nn.Module, checkpoint: Checkpoint) -> None:
    """Raise ``CheckpointError`` unless ``model``'s parameters and buffers have the checkpoint's names and shapes
    (``model`` may live on the meta device)."""
    state = checkpoint.model_state()
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"checkpoint '{checkpoint.path}' does not fit the model (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, wrong shape {wrong[:5]}); build the model with the checkpoint's model name "
            f"and model_args ({checkpoint.meta.get('model')!r}, {checkpoint.meta.get('model_args')})")


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


def _reason(err: BaseException) -> str:
    """An exception's message in one line (``OSError``: its strerror and file)."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}" + (f": '{err.filename}'" if err.filename else "")
    return str(err).splitlines()[0] if str(err) else type(err).__name__


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
    name, args = checkpoint.meta["model"], checkpoint.meta.get("model_args")
    try:  # first without memory: a damaged sidecar's sizes must not allocate anything
        with torch.device("meta"):
            probe = build_model(name, args, recorded=True)
    except (RuntimeError, NotImplementedError):  # a builder that needs real tensors
        probe = None
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"the sidecar of '{checkpoint.path}' records model {name!r} with arguments that do not "
                              f"build it ({str(err).splitlines()[0] if str(err) else type(err).__name__}); use "
                              "another checkpoint or retrain") from err
    if probe is not None:
        _check_fits(probe, checkpoint)
    model = build_model(name, args, recorded=True)
    restore_model(model, checkpoint)
    return model.to(device).eval(), checkpoint
