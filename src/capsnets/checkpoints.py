"""The checkpoint format: one safetensors file holding tensors and a JSON sidecar; no models, no pickle.

Checkpoints (:func:`write_checkpoint`, :func:`load_checkpoint`): ``<name>.safetensors`` holds every tensor under a
prefix its writer chooses (``model.<param>`` for a model's weights; the engine adds ``optim.*``, ``rng.*`` and
``extra.*``), and in its header's metadata (entry ``"sidecar"``) the sidecar: everything else (model name and
arguments, epoch, metrics, optimizer hyper-parameters, versions and time) and its ``format_version``
(:data:`FORMAT_VERSION`): a file of another format version is refused with a :class:`CheckpointError` that says
so. No pickle is involved, so loading a checkpoint never runs code. The header records the SHA-256 of the tensors
and of the sidecar, checked on loading: a damaged file is reported, never loaded as other numbers.

A save has one commit point: the file is written to a temporary file in the same directory, fsynced, and moved
over the old one with ``os.replace``. A crash at any moment leaves either the old or the new checkpoint, complete;
:func:`recover_directory` removes the temporary file a crash left. After the commit, the sidecar is exported beside
the checkpoint as ``<name>.json`` for people to read; the library never reads it back.
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
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from capsnets._version import __version__
from capsnets.files import (
    FileWriteError,
    atomic_write,
    fsync_dir,
    one_line_reason,
    write_temp,
)
from capsnets.validation import ArgumentError

logger = logging.getLogger(__name__)

SUFFIX = ".safetensors"
#: The version of the checkpoint format this library writes and reads; a file of another version is refused.
FORMAT_VERSION = 1
#: The safetensors metadata entry holding the sidecar's JSON text.
EMBEDDED_SIDECAR = "sidecar"
#: Metadata entries holding the SHA-256 of the tensors (:func:`tensors_digest`) and of the embedded sidecar.
TENSORS_DIGEST, SIDECAR_DIGEST = "tensors_sha256", "sidecar_sha256"


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, of another format version, or does not fit the model it is loaded into."""


class CheckpointWriteError(FileWriteError):
    """A checkpoint could not be written (a full disk, no permission); the one saved there before, if any, is
    intact, and the message says which."""

    kind = "checkpoint "


@dataclass
class Checkpoint:
    """A loaded checkpoint: ``tensors`` from the safetensors file and ``meta``, the sidecar in its header."""

    path: Path
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]

    def model_state(self) -> dict[str, torch.Tensor]:
        """The model's ``state_dict`` (keys without the ``model.`` prefix)."""
        return {k[len("model.") :]: v for k, v in self.tensors.items() if k.startswith("model.")}


def sidecar_path(path: str | Path) -> Path:
    """The ``.json`` export of a ``.safetensors`` checkpoint's sidecar."""
    return Path(path).with_suffix(".json")


def resolve_checkpoint_path(path: str | Path) -> Path:
    """Accept a run directory (its ``best``, else ``last``, checkpoint), a ``.safetensors`` or ``.json`` file."""
    path = Path(path)
    if path.is_dir():
        for name in ("best", "last"):
            if (path / f"{name}{SUFFIX}").is_file():
                return path / f"{name}{SUFFIX}"
        raise CheckpointError(
            f"no best{SUFFIX} or last{SUFFIX} in run directory '{path}'; train first or pass the checkpoint file itself"
        )
    return path.with_suffix(SUFFIX) if path.suffix == ".json" else path


def write_checkpoint(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Atomically write ``tensors`` to ``path`` and ``meta`` (the sidecar) into its header, then export the sidecar
    beside it (:func:`sidecar_path`).

    The sidecar gets a new ``checkpoint_id``, the :data:`FORMAT_VERSION`, the library, torch and Python versions
    and the time; the header the digests of the tensors and of the sidecar.

    Args:
        path: target ``.safetensors`` file; the sidecar's export goes to the same name with ``.json``.
        tensors: the tensors to store, by name (moved to the CPU).
        meta: JSON-safe information to store (model name and arguments, epoch, metrics...); tuples are stored
            as lists and one-element tensors as numbers.

    Raises:
        CheckpointWriteError: an ``OSError`` stopped the write; the checkpoint saved there before, if any, is
            intact.
        FileWriteError: the checkpoint is saved, but its ``.json`` export could not be written.
    """
    path = Path(path)
    tensors = {key: cpu_copy(value) for key, value in tensors.items()}
    sidecar = {
        **meta,
        "format_version": FORMAT_VERSION,
        "checkpoint_id": uuid.uuid4().hex,
        "versions": _versions(),
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    payload = json.dumps(sidecar, indent=2, default=_json_default)
    metadata = {
        "checkpoint_id": sidecar["checkpoint_id"],
        "format": "capsnets",
        "format_version": str(FORMAT_VERSION),
        EMBEDDED_SIDECAR: payload,
        TENSORS_DIGEST: tensors_digest(tensors),
        SIDECAR_DIGEST: _text_digest(payload),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_tensors = write_temp(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
        os.replace(tmp_tensors, path)  # the commit point
        fsync_dir(path.parent)
    except (OSError, SafetensorError) as err:
        kept = "; the checkpoint saved there before is intact" if path.is_file() else ""
        raise CheckpointWriteError(path, err, kept) from err
    try:
        atomic_write(sidecar_path(path), lambda tmp: Path(tmp).write_text(payload))
    except OSError as err:
        raise FileWriteError(
            sidecar_path(path), err, f"; it is the export of checkpoint '{path}', which is saved and complete"
        ) from err
    return path


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint written by :func:`write_checkpoint` (tensors stay on the CPU).

    The sidecar is read from the checkpoint's header and validated (types of the entries this library reads);
    a ``.json`` beside it is not read.

    Raises:
        CheckpointError: the file is missing, unreadable, damaged, without the checksums of its tensors and
            sidecar, not a capsnets checkpoint, or of another format version than :data:`FORMAT_VERSION`.
    """
    path = resolve_checkpoint_path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist; pass a run directory or a {SUFFIX} file")
    try:
        tensors = load_file(path)
        with safe_open(path, framework="pt") as handle:
            header = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(
            f"checkpoint '{path}' is corrupt or truncated ({one_line_reason(err)}); use another checkpoint, "
            "e.g. last/best of the same run, or retrain"
        ) from err
    check_format_version(header, path)
    _check_digests(path, header, tensors)
    meta = _parse_sidecar(header[EMBEDDED_SIDECAR], f"the sidecar inside '{path}'")
    if not isinstance(meta, dict) or meta.get("checkpoint_id") != header.get("checkpoint_id"):
        raise CheckpointError(
            f"the sidecar inside '{path}' does not match its header; the checkpoint is damaged: "
            "use another checkpoint, e.g. last/best of the same run, or retrain"
        )
    validate_sidecar(meta, f"the sidecar of '{path}'")
    return Checkpoint(path=path, tensors=tensors, meta=meta)


def check_format_version(header: dict[str, str], path: str | Path) -> None:
    """Raise :class:`CheckpointError` unless a safetensors header is a capsnets checkpoint of :data:`FORMAT_VERSION`.

    Examples::

        >>> check_format_version({"format": "capsnets", "format_version": "1", "sidecar": "{}"}, "m.safetensors")
    """
    if header.get("format") != "capsnets" or EMBEDDED_SIDECAR not in header:
        raise CheckpointError(
            f"'{path}' is a safetensors file but not a capsnets checkpoint (its header has no "
            "capsnets sidecar); load its tensors with safetensors.torch.load_file"
        )
    found = header.get("format_version")
    if found != str(FORMAT_VERSION):
        written = f"format version {found}" if found is not None else "no format version"
        raise CheckpointError(
            f"checkpoint '{path}' has {written}; this capsnets {__version__} reads format "
            f"version {FORMAT_VERSION} only. Load it with the capsnets version that wrote it, or "
            "retrain"
        )


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
    """Raise :class:`CheckpointError` if the header lacks a checksum, or the tensors or the embedded sidecar are
    not what was saved."""
    missing = [entry for entry in (TENSORS_DIGEST, SIDECAR_DIGEST) if not header.get(entry)]
    if missing:
        raise CheckpointError(
            f"checkpoint '{path}' records no checksum ({', '.join(missing)} missing from its header), so "
            "it cannot be checked for damage: every checkpoint this format version writes has both; it was "
            "edited or written by another program. Use another checkpoint, e.g. last/best of the same run, "
            "or re-save its tensors with capsnets.checkpoints.write_checkpoint if you trust them"
        )
    damaged = []
    if tensors_digest(tensors) != header.get(TENSORS_DIGEST):
        damaged.append("its tensors")
    if not _embedded_sidecar_intact(header):
        damaged.append("its sidecar")
    if damaged:
        raise CheckpointError(
            f"checkpoint '{path}' is damaged: the checksum of {' and '.join(damaged)} does not match "
            "the one recorded when it was saved; use another checkpoint, e.g. last/best of the same "
            "run, or retrain"
        )


def _embedded_sidecar_intact(header: dict[str, str]) -> bool:
    """Whether a header's embedded sidecar is the one saved."""
    return _text_digest(header.get(EMBEDDED_SIDECAR, "")) == header.get(SIDECAR_DIGEST)


#: Sidecar entries this library reads, and the types they must have when present.
_SIDECAR_TYPES: dict[str, tuple[type, ...]] = {
    "format_version": (int,),
    "checkpoint_id": (str,),
    "model": (str,),
    "model_args": (dict,),
    "dataset": (str,),
    "config": (dict,),
    "epoch": (int, float),
    "metrics": (dict,),
    "training": (dict,),
    "optimizer": (dict,),
    "scheduler": (dict,),
    "history": (list,),
    "recipe": (dict,),
    "classes": (list,),
}


def validate_sidecar(meta: Any, where: str) -> None:
    """Raise :class:`CheckpointError` if ``meta`` is not a mapping whose known entries have the right types."""

    def damaged(what: str) -> CheckpointError:
        return CheckpointError(
            f"{where} is damaged: {what}; use another checkpoint (e.g. last/best of the same run) or retrain"
        )

    if not isinstance(meta, dict):
        raise damaged(f"expected a JSON object, got {type(meta).__name__}")
    for key, types in _SIDECAR_TYPES.items():
        value = meta.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise damaged(f"'{key}' should be {' or '.join(t.__name__ for t in types)}, got {value!r:.60}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise damaged(f"'format_version' is {meta.get('format_version')!r}, the header says {FORMAT_VERSION}")
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
        raise CheckpointError(
            f"{where} is not valid JSON ({err}); the checkpoint is damaged: use another "
            "checkpoint, e.g. last/best of the same run, or retrain"
        ) from err


def _read_header(path: Path) -> dict[str, str] | None:
    """A safetensors file's metadata, or None if the file is missing or its header unreadable."""
    try:
        with safe_open(path, framework="pt") as handle:
            return handle.metadata() or {}
    except (SafetensorError, OSError, ValueError):
        return None


def peek_sidecar(path: str | Path) -> dict[str, Any] | None:
    """The sidecar of a checkpoint, read from its header alone (no tensor is read, so it is not validated against
    them), or None if the file is missing, its header unreadable or damaged, or of another format version."""
    header = _read_header(Path(path))
    if (
        header is None
        or header.get("format_version") != str(FORMAT_VERSION)
        or EMBEDDED_SIDECAR not in header
        or not _embedded_sidecar_intact(header)
    ):
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


def recover_directory(directory: str | Path) -> list[str]:
    """Clean up after saves interrupted by a crash, in ``directory``; returns one message per file removed (also
    logged).

    A temporary file (``.<name>.<random>.tmp``) is what a save left before its commit point: the file beside it is
    the one saved before, complete. It is removed. Each checkpoint's ``.json`` export that is not its sidecar (a
    crash after the commit point, a file edited by hand) is exported again.
    """
    directory = Path(directory)
    messages = []
    if not directory.is_dir():
        return messages
    for leftover in sorted(directory.glob(".*.tmp")):
        if leftover.is_file():
            leftover.unlink()
            messages.append(
                f"removed '{leftover}', left by a write that a crash interrupted (the file it was "
                "to replace is the complete earlier version)"
            )
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        header = _read_header(path)
        embedded = header.get(EMBEDDED_SIDECAR) if header and _embedded_sidecar_intact(header) else None
        export = sidecar_path(path)
        if embedded is not None and (not export.is_file() or export.read_bytes() != embedded.encode()):
            atomic_write(export, lambda tmp, text=embedded: Path(tmp).write_text(text))
    for message in messages:
        logger.warning("%s", message)
    return messages


def cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached, contiguous CPU copy of ``tensor`` (what a checkpoint stores)."""
    return tensor.detach().to("cpu", copy=True).contiguous()


def _versions() -> dict[str, str]:
    return {"capsnets": __version__, "torch": torch.__version__, "python": platform.python_version()}


def _json_default(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    raise ArgumentError(f"cannot store {type(value).__name__} in a checkpoint sidecar")
