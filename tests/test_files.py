"""Atomic writes: permissions of a plain open(), the old file kept when writing fails."""

import os
import stat

import pytest

from capsnets.files import atomic_write, temp_beside


def test_written_files_get_default_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write(tmp_path / "sub" / "report.md", lambda tmp: open(tmp, "w").write("x"))
        assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.read_text() == "x"
        assert stat.S_IMODE(os.stat(temp_beside(tmp_path / "a")).st_mode) == 0o644
    finally:
        os.umask(old)


def test_checkpoints_get_default_permissions(tmp_path):
    """safetensors replaces the file it writes with an owner-only one; a checkpoint must not stay so."""
    import torch

    from capsnets.engine.checkpoint import save_checkpoint

    old = os.umask(0o022)
    try:
        path = save_checkpoint(tmp_path / "m.safetensors", model=torch.nn.Linear(2, 1), meta={})
        for file in (path, path.with_suffix(".json")):
            assert stat.S_IMODE(file.stat().st_mode) == 0o644, file.name
    finally:
        os.umask(old)


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old")

    def broken(tmp):
        open(tmp, "w").write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, broken)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.md"]
