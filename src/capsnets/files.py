"""Files written whole or not at all, and JSON lines read back with a clear error.

Atomic writes (:func:`atomic_write`, :func:`atomic_write_text`): a temporary file beside the target, then
``os.replace`` over it. A reader never sees a half-written file, and a failure while writing leaves the previous
file intact. Temporary files get the permissions a plain ``open(path, "w")`` would (``0o666`` less the umask),
not ``tempfile.mkstemp``'s owner-only ``0o600``, so results stay readable by whoever could read them before.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class DamagedFileError(ValueError):
    """A file the library reads is damaged; the message names it and says how to recover."""


class FileWriteError(OSError):
    """A file could not be written (a full disk, no permission, a read-only folder); the message names it.

    ``errno``, ``strerror`` and ``filename`` are those of the error that stopped the write (``filename`` the
    file meant, not its temporary file; safetensors' own errors give the ``errno`` they carry).

    Args:
        path: the file meant.
        cause: the error that stopped the write (an ``OSError``, or safetensors' ``SafetensorError``).
        consequence: what this means for what was saved before, appended to the message (``"; ..."``).
    """

    #: How the file is named in the message.
    kind = ""

    def __init__(self, path: str | os.PathLike, cause: BaseException, consequence: str = "") -> None:
        code, reason = _error_code(cause)
        super().__init__(code, reason, str(path))
        self.message = f"could not write {self.kind}'{path}' ({reason}){consequence}"

    def __str__(self) -> str:
        return self.message

    @property
    def remedy(self) -> str:
        """The step that frees the way for the write, such as ``"free disk space"`` or
        ``"make '<folder>' writable"``."""
        folder = Path(self.filename).parent
        if self.errno in (errno.ENOSPC, errno.EDQUOT):
            return "free disk space"
        if self.errno in READ_ONLY_ERRNOS:
            return f"make '{folder}' writable"
        return f"fix what stops the write to '{folder}'"


#: The ``errno`` values that say a folder cannot be written at all: a read-only file system, no permission.
READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


def _error_code(err: BaseException) -> tuple[int | None, str]:
    """``(errno, reason)`` of an error that stopped a write; safetensors' errors carry the code in their text."""
    if isinstance(err, OSError) and err.strerror:
        return err.errno, err.strerror
    found = re.search(r"code: (\d+)", str(err))
    if found:
        return int(found.group(1)), os.strerror(int(found.group(1)))
    return getattr(err, "errno", None), (str(err).splitlines()[0] if str(err) else type(err).__name__)


def folder_write_problem(folder: str | os.PathLike) -> OSError | None:
    """Why files cannot be created in ``folder`` (or in the folders that would be made for it, where it does not
    exist yet), or None where nothing stands in the way that ``os.access`` can see.

    The answer is an ``OSError`` whose ``filename`` is the folder that stops the write (``folder`` itself, or its
    nearest existing ancestor): ``EROFS`` for a read-only file system, ``EACCES`` for a folder without write
    permission, ``ENOTDIR`` for a file where a folder is needed. Nothing is written to find out.

    Examples:
        >>> problem = folder_write_problem("runs/new")  # None where runs/new can be made and written
    """
    existing = Path(os.path.abspath(folder))
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows)
        read_only = False
    code = errno.EROFS if read_only else errno.EACCES
    return OSError(code, os.strerror(code), str(existing))


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
        FileWriteError: an ``OSError`` stopped the write (a full disk...), or ``target`` is a folder, a device or
            another file that is not a regular one; ``target`` is as it was before.
    """
    target = Path(target)
    if target.exists() and not target.is_file():  # replacing a folder, a device or a pipe loses it
        code = errno.EISDIR if target.is_dir() else errno.EEXIST
        raise FileWriteError(target, OSError(code, _NOT_A_FILE[code]), "; it is left as it is")
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


def atomic_write_text(target: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``target`` by :func:`atomic_write`: the file holds either the old text or the new one."""
    return atomic_write(target, lambda tmp: Path(tmp).write_text(text))


#: Why :func:`atomic_write` leaves a target alone, by the ``errno`` it reports.
_NOT_A_FILE = {errno.EISDIR: "it is a folder", errno.EEXIST: "it is not a regular file (a device, a pipe...)"}


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
            raise DamagedFileError(
                f"'{path}' line {number} is not a JSON object ({line[:60]!r}); delete that line, or {recover}"
            )
    return records


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, in hex."""
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def write_temp(target: Path, write: Callable[[str], Any]) -> str:
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


def fsync_dir(directory: Path) -> None:
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


def one_line_reason(err: BaseException) -> str:
    """An exception's message in one line (``OSError``: its strerror and file)."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}" + (f": '{err.filename}'" if err.filename else "")
    return str(err).splitlines()[0] if str(err) else type(err).__name__
