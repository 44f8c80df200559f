"""A full disk (``ENOSPC``) while ``capsnets`` writes any of its files: the command exits with status 1 and one
line naming the file, without a traceback; what was saved before is intact; and the same command again (with
``--resume`` once the run has a checkpoint), the disk freed, ends bitwise as the run that never failed.

A real full file system needs a mount (root); here the write is made to fail: ``open`` (``builtins`` and ``io``)
returns, for the file chosen (or its temporary file), a handle whose first ``write`` writes half the data and
raises ``OSError(ENOSPC)``, and ``safetensors.torch.save_file`` writes half a checkpoint and raises the
``SafetensorError`` that safetensors raises on a full disk.
"""

from __future__ import annotations

import builtins
import errno
import io
import os

import pytest
from reliability.crash_runner import FIGURES as FIGURE_FUNCTIONS
from reliability.crash_runner import figure_stub
from reliability.faults import (
    assert_same_run,
    copy_run,
    one_error_line,
    records,
    recovery,
    snapshot,
    target_name,
    train_args,
)
from safetensors import SafetensorError

from capsnets import checkpoints as capsnets_checkpoints
from capsnets.cli import main
from capsnets.engine import reporting

FIGURES = ("training_curves.png", "confusion_matrix.png", "reconstructions.png")


class DiskFull:
    """Make the ``nth`` write-open of file ``name`` (its temporary file included) fail as on a full disk;
    ``nth=0`` only counts them (:attr:`seen`)."""

    def __init__(self, name: str, nth: int = 1) -> None:
        self.name, self.nth, self.seen, self.fired = name, nth, 0, False

    def install(self, patch: pytest.MonkeyPatch) -> DiskFull:
        real_open, real_save = io.open, capsnets_checkpoints.save_file

        def open_(file, mode="r", *args, **kwargs):
            handle = real_open(file, mode, *args, **kwargs)
            if isinstance(file, int) or not set(mode) & set("wax") or not self._due(file):
                return handle
            return _FullFile(handle)

        def save_file(tensors, filename, metadata=None):
            real_save(tensors, filename, metadata=metadata)
            if self._due(filename):
                with real_open(filename, "rb+") as handle:
                    handle.truncate(os.path.getsize(filename) // 2)
                raise SafetensorError(
                    "Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                    '"No space left on device" })'
                )

        patch.setattr(builtins, "open", open_)
        patch.setattr(io, "open", open_)
        patch.setattr(capsnets_checkpoints, "save_file", save_file)
        return self

    def _due(self, path) -> bool:
        if target_name(path) != self.name:
            return False
        self.seen += 1
        self.fired = self.fired or self.seen == self.nth
        return self.seen == self.nth


class _FullFile:
    """A file on a full disk: the first write stores half its data and raises ENOSPC."""

    def __init__(self, handle) -> None:
        self._handle = handle

    def write(self, data):
        self._handle.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)


def _no_figures(patch: pytest.MonkeyPatch, figures: bool | str) -> None:
    """No figures (``False``), stand-ins written as they are (``"stub"``), or the real ones (``True``)."""
    from capsnets import plots

    if not figures:
        patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    elif figures == "stub":
        for name in FIGURE_FUNCTIONS:
            patch.setattr(plots, name, figure_stub)


def _fails_then_recovers(argv, run, name, nth, reference, capsys, caplog, *, figures=False) -> None:
    """``argv`` with the ``nth`` write of ``name`` failing: status 1, one line naming the file, the checkpoint
    from before intact, no temporary file; then the recovery command ends as ``reference``."""
    earlier = capsnets_checkpoints.checkpoint_epoch(run / "last.safetensors")
    with pytest.MonkeyPatch.context() as patch:
        _no_figures(patch, figures)
        fault = DiskFull(name, nth).install(patch)
        status = main(argv)
    err = capsys.readouterr().err
    assert fault.fired, f"{name} was written {fault.seen} times, not {nth}"
    line = one_error_line(err)
    assert status == 1 and name in line and "No space left on device" in line, line
    assert "Traceback" not in caplog.text
    if earlier is not None:  # the checkpoint saved before: intact (it loads, checksums included), or the next
        meta = capsnets_checkpoints.load_checkpoint(run / "last.safetensors").meta
        assert meta["epoch"] >= earlier
        assert [
            {k: v for k, v in r.items() if k in records(reference)[0]} for r in meta["training"]["history"]
        ] == records(reference)[: meta["epoch"]]
    assert not [p.name for p in run.glob(".*.tmp")], "temporary files left behind"
    again = recovery(argv, run)
    with pytest.MonkeyPatch.context() as patch:
        _no_figures(patch, figures)
        status = main(again)
        if status == 1 and "--resume" not in again:  # files but no checkpoint: refused, --overwrite
            assert "--overwrite" in one_error_line(capsys.readouterr().err)
            status = main([*again, "--overwrite"])
    assert status == 0, capsys.readouterr().err
    assert_same_run(run, reference, figures=figures)


def _long(*values):
    return pytest.param(*values, marks=pytest.mark.faults_long)


#: Files of a fresh run (2 epochs) and of a run resumed from epoch 1 to 2, each failed at its nth write (those
#: marked faults_long only in the long variant).
FRESH = [
    ("config.yaml", 1),
    _long(".lock", 1),
    ("last.safetensors", 1),
    _long("last.json", 1),
    _long("best.safetensors", 1),
    ("best.json", 1),
    ("metrics.jsonl", 1),
]
RESUMED = [
    _long("config.yaml", 1),
    _long("metrics.jsonl", 1),
    ("last.safetensors", 1),
    ("last.json", 1),
    _long("metrics.jsonl", 2),
    ("summary.json", 1),
]


@pytest.mark.parametrize("name, nth", FRESH)
def test_a_full_disk_in_a_fresh_run(clean_runs, tmp_path, capsys, caplog, name, nth):
    run = tmp_path / "run"
    _fails_then_recovers([*train_args(2), "--out", str(run)], run, name, nth, clean_runs[2], capsys, caplog)


@pytest.mark.parametrize("name, nth", RESUMED)
def test_a_full_disk_in_a_resumed_run(clean_runs, tmp_path, capsys, caplog, name, nth):
    run = copy_run(clean_runs[1], tmp_path / "run")
    _fails_then_recovers(
        ["train", "--resume", "--epochs", "2", "--out", str(run)], run, name, nth, clean_runs[2], capsys, caplog
    )


@pytest.mark.parametrize("name, drawn", [(FIGURES[0], "stub"), *(_long(n, True) for n in FIGURES)])
def test_a_full_disk_while_drawing_the_figures(clean_runs, tmp_path, capsys, caplog, name, drawn):
    """The short version with stand-ins for the figures, written the same way (drawing them takes seconds)."""
    run = copy_run(clean_runs[1], tmp_path / "run")
    _fails_then_recovers(
        ["train", "--resume", "--epochs", "2", "--out", str(run)],
        run,
        name,
        1,
        clean_runs[2],
        capsys,
        caplog,
        figures=drawn,
    )


@pytest.mark.parametrize(
    "command, name",
    [
        ("evaluate", "evaluation_best_digits.json"),
        _long("evaluate", "evaluation_best_digits_confusion.png"),
        _long("reconstruct", "reconstructions_best.png"),
    ],
)
def test_a_full_disk_while_evaluating(clean_runs, tmp_path, capsys, caplog, command, name):
    """evaluate and reconstruct write beside the checkpoint: the run's own files stay as they were."""
    run = copy_run(clean_runs[2], tmp_path / "run")
    before = snapshot(run)
    argv = [command, "--checkpoint", str(run), "--device", "cpu", *(["--n", "4"] if command == "reconstruct" else [])]
    with pytest.MonkeyPatch.context() as patch:
        fault = DiskFull(name).install(patch)
        status = main(argv)
    line = one_error_line(capsys.readouterr().err, command)
    assert fault.fired and status == 1 and name in line and "No space left on device" in line, line
    after = snapshot(run)  # outputs written before the failing one stay (complete: each is written atomically)
    assert {k: v for k, v in after.items() if k in before} == before and not [p for p in after if p.endswith(".tmp")]
    assert main(argv) == 0 and (run / name).is_file()


def _write_counts(argv, run) -> dict[str, int]:
    """How many times an uninterrupted ``argv`` opens each file for writing."""
    counts = {}
    real_open = io.open

    def open_(file, mode="r", *args, **kwargs):
        if not isinstance(file, int) and set(mode) & set("wax"):
            counts[target_name(file)] = counts.get(target_name(file), 0) + 1
        return real_open(file, mode, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        _no_figures(patch, False)
        patch.setattr(builtins, "open", open_)
        patch.setattr(io, "open", open_)
        real_save = capsnets_checkpoints.save_file
        patch.setattr(
            capsnets_checkpoints,
            "save_file",
            lambda tensors, filename, metadata=None: (
                counts.__setitem__(target_name(filename), counts.get(target_name(filename), 0) + 1),
                real_save(tensors, filename, metadata=metadata),
            )[1],
        )
        assert main(argv) == 0
    return counts


@pytest.mark.faults_long
def test_a_full_disk_at_every_write_of_a_run(clean_runs, tmp_path, capsys, caplog):
    """Every write of every file of a fresh 3-epoch run, one after the other."""
    counts = _write_counts([*train_args(3), "--out", str(tmp_path / "count")], tmp_path / "count")
    cases = [(name, nth) for name, count in sorted(counts.items()) for nth in range(1, count + 1)]
    assert len(cases) >= 15, counts  # 3 checkpoints and their sidecars, 3 records, the config, the summary twice...
    for index, (name, nth) in enumerate(cases):
        run = tmp_path / f"run{index}"
        _fails_then_recovers([*train_args(3), "--out", str(run)], run, name, nth, clean_runs[3], capsys, caplog)
