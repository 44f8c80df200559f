"""Atomic file writes: a temporary file beside the target, then ``os.replace`` over it.

A reader never sees a half-written file, and a failure while writing leaves the previous file intact.
Temporary files get the permissions a plain ``open(path, "w")`` would (``0o666`` less the umask), not
``tempfile.mkstemp``'s owner-only ``0o600``, so results stay readable by whoever could read them before.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

logger = logging.getLogger(__name__)


class DamagedFileError(ValueError):
    """A file the library reads is damaged; the message names it and says how to recover."""


class FileWriteError(OSError):
    """A file could not be written (a full disk, no permission, a read-only folder); the message names it.

    ``errno``, ``strerror`` and ``filename`` are those of the error that stopped the write (``filename`` the
    file meant, not its temporary file)."""

    def __init__(self, path: str | os.PathLike, cause: OSError, consequence: str = "") -> None:
        reason = cause.strerror or str(cause) or type(cause).__name__
        super().__init__(cause.errno, reason, str(path))
        self.message = f"could not write '{path}' ({reason}){consequence}"

    def __str__(self) -> str:
        return self.message


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def default_permissions(path: str | os.PathLike) -> None:
    """Give ``path`` the permissions a plain ``open(path, "w")`` would have created it with."""
    os.chmod(path, 0o666 & ~_umask())


def temp_beside(target: str | os.PathLike, suffix: str = ".tmp") -> str:
    """Create an empty temporary file in ``target``'s folder, with default permissions; return its path."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    default_permissions(tmp)
    return tmp


def atomic_write(target: str | os.PathLike, write: Callable[[str], object], *, fsync: bool = False) -> Path:
    """Call ``write(tmp_path)`` to fill a temporary file, then move it over ``target`` (folders created).

    ``write`` may replace the file rather than fill it (safetensors does, creating it owner-only): the
    default permissions are set again afterwards.

    Raises:
        FileWriteError: an ``OSError`` stopped the write (a full disk...); ``target`` is as it was before.
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_beside(target)
    except OSError as err:
        raise FileWriteError(target, err) from err
    try:
        write(tmp)
        default_permissions(tmp)
        if fsync:
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and not isinstance(err, FileWriteError):
            raise FileWriteError(target, err, "; the file there before is intact" if target.exists() else "") from err
        raise
    return target


def read_json_lines(path: str | os.PathLike, *, recover: str = "delete the file") -> list[dict[str, Any]]:
    """The JSON objects of an append-only JSON-lines file, one per non-blank line.

    A last line that does not parse is what a write cut by a crash leaves: it is left out, with a warning.
    Any other line that is not a JSON object raises :class:`DamagedFileError` naming the file and line, and
    ``recover`` (how to repair it) ends the message."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedFileError(f"cannot read '{path}' ({err}); {recover}") from err
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    records = []
    for number, line in numbered:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif record is None and number == numbered[-1][0]:
            logger.warning("'%s': left out its last line, torn by an interrupted write (%r)", path, line[:60])
        else:
            raise DamagedFileError(f"'{path}' line {number} is not a JSON object ({line[:60]!r}); delete that "
                                   f"line, or {recover}")
    return records
