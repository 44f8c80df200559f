"""A read-only folder for the fault-injection tests, simulated where ``chmod`` cannot make one (importable as
``reliability.read_only``).

A test running as root writes through ``chmod 555``, and mounting a read-only file system needs privileges a test
should not take. :class:`ReadOnly` makes every write under a folder fail as on a read-only file system
(``OSError(EROFS)``, safetensors' ``SafetensorError`` with code 30): ``open`` (``builtins`` and ``io``) for writing,
``os.open`` with a write or create flag, ``mkdir``, ``replace``/``rename``, ``unlink``/``rmdir``, ``chmod``,
``truncate`` and safetensors' ``save_file``. With ``visible=True`` (the default) ``os.access`` and ``os.statvfs``
also say so, as the kernel does; ``visible=False`` leaves them as they are, for code that finds out only when a
write fails (a network file system whose permissions ``access`` cannot see).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import stat
import tempfile
from pathlib import Path

import pytest
from safetensors import SafetensorError

from capsnets import checkpoints as capsnets_checkpoints

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def read_only_error(path) -> OSError:
    return OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))


class ReadOnly:
    """Make ``folder`` (and everything under it) read-only for the block of a ``pytest.MonkeyPatch``;
    :attr:`refused` lists the writes refused."""

    def __init__(self, folder: str | os.PathLike, *, visible: bool = True) -> None:
        self.folder, self.visible, self.refused = Path(os.path.abspath(folder)), visible, []

    def covers(self, path) -> bool:
        if isinstance(path, int):
            return False
        path = Path(os.path.abspath(os.fsdecode(path)))
        return path == self.folder or self.folder in path.parents

    def _refuse(self, path) -> None:
        self.refused.append(str(path))
        raise read_only_error(path)

    def install(self, patch: pytest.MonkeyPatch) -> ReadOnly:
        real = {
            name: getattr(os, name)
            for name in ("open", "mkdir", "replace", "rename", "unlink", "remove", "rmdir", "chmod", "truncate")
        }
        real_open, real_access, real_statvfs, real_save = io.open, os.access, os.statvfs, capsnets_checkpoints.save_file

        def open_(file, mode="r", *args, **kwargs):
            if set(mode) & set("wax+") and self.covers(file):
                self._refuse(file)
            return real_open(file, mode, *args, **kwargs)

        def os_open(path, flags, *args, **kwargs):
            if flags & _WRITE_FLAGS and self.covers(path):
                self._refuse(path)
            return real["open"](path, flags, *args, **kwargs)

        def guarded(name):
            def call(*args, **kwargs):
                if any(self.covers(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
                    self._refuse(args[0])
                return real[name](*args, **kwargs)

            return call

        def access(path, mode, *args, **kwargs):
            if mode & os.W_OK and self.covers(path):
                return False
            return real_access(path, mode, *args, **kwargs)

        def statvfs(path):
            result = real_statvfs(path)
            if not self.covers(path):
                return result
            values = list(result)
            values[8] |= os.ST_RDONLY  # f_flag
            return os.statvfs_result(values)

        def save_file(tensors, filename, metadata=None):
            if self.covers(filename):
                self.refused.append(str(filename))
                raise SafetensorError(
                    'Error while serializing: IoError(Os { code: 30, kind: ReadOnlyFilesystem, message: "Read-only '
                    'file system" })'
                )
            return real_save(tensors, filename, metadata=metadata)

        patch.setattr(builtins, "open", open_)
        patch.setattr(io, "open", open_)
        patch.setattr(os, "open", os_open)
        for name in real:
            if name != "open":
                patch.setattr(os, name, guarded(name))
        patch.setattr(capsnets_checkpoints, "save_file", save_file)
        if self.visible:
            patch.setattr(os, "access", access)
            patch.setattr(os, "statvfs", statvfs)
        return self


def chmod_protects() -> bool:
    """Whether ``chmod`` stops this process from writing into a folder (it does not stop root, who may override
    permissions): tried on a temporary folder."""
    with tempfile.TemporaryDirectory() as root:
        folder = Path(root) / "locked"
        folder.mkdir()
        os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR)
        try:
            (folder / "probe").write_text("")
        except PermissionError:
            return True
        finally:
            os.chmod(folder, stat.S_IRWXU)
        return False
