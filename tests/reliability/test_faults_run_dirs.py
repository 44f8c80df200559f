"""Fault class "run directories": a training whose run directory cannot be written, or fills the disk, says what
is kept and gives the command that goes on, and that command works.

- A full disk (``ENOSPC``, made as in ``test_disk_full.py``) before the run's first checkpoint: the message says
  that no checkpoint was saved yet and gives the command that starts the run again (with ``--overwrite`` where
  the files left would be refused); after a checkpoint, it names that checkpoint (epoch, and step where it was
  saved mid-epoch) and the ``--resume`` command. Running the command given ends bitwise as the run that never
  failed.
- A read-only run directory (a fresh run, ``--resume``, ``--overwrite``), a read-only folder above a new one,
  ``evaluate`` and ``reconstruct`` writing their reports into a read-only run: status 1, one line naming the
  folder, saying that nothing in it was changed and how to go on, no file of the run changed. Simulated
  (:class:`reliability.read_only.ReadOnly`) where the tests run as root, whom ``chmod`` does not stop; with a
  real ``chmod`` otherwise.

Everything runs in-process through :func:`capsnets.cli.main`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import stat

import pytest
from reliability.faults import assert_same_run, copy_run, one_error_line, snapshot, train_args
from reliability.read_only import ReadOnly, chmod_protects
from reliability.test_disk_full import DiskFull

from capsnets.cli import main
from capsnets.engine import reporting, trainer
from capsnets.engine.tasks import TASKS


@pytest.fixture(autouse=True)
def _no_figures(monkeypatch):
    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])


def _command(line: str, after: str) -> list[str]:
    """The command a message gives after ``after``, as the argument list of :func:`main`."""
    found = re.search(re.escape(after) + r" capsnets (.+)$", line)
    assert found, line
    return shlex.split(found.group(1))


def _fail_with_a_full_disk(argv, name, capsys, nth=1) -> str:
    with pytest.MonkeyPatch.context() as patch:
        fault = DiskFull(name, nth).install(patch)
        status = main(argv)
    line = one_error_line(capsys.readouterr().err)
    assert fault.fired and status == 1 and "No space left on device" in line, line
    return line


def test_a_full_disk_before_the_first_checkpoint_says_so_and_gives_the_command_that_starts_again(
    clean_runs, tmp_path, capsys
):
    run = tmp_path / "run"
    argv = [*train_args(2), "--out", str(run)]
    line = _fail_with_a_full_disk(argv, "last.safetensors", capsys)
    assert "no checkpoint of the run was saved yet; free disk space, then start it again with:" in line, line
    assert "intact" not in line and "--resume" not in line, line
    again = _command(line, "start it again with:")
    assert again == argv  # config.yaml alone is no run: no --overwrite needed
    assert main(again) == 0
    assert_same_run(run, clean_runs[2])


def test_a_full_disk_before_the_first_checkpoint_of_a_run_with_files_adds_overwrite(clean_runs, tmp_path, capsys):
    """A run directory holding files but no checkpoint (a run that failed before its first checkpoint, with its
    config, its metrics and a stray file): the command to start again must carry --overwrite, or it is refused."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: capsnet_digits\n")
    (run / "metrics.jsonl").write_text("")
    (run / "notes.txt").write_text("mine")
    argv = [*train_args(2), "--out", str(run)]
    assert main(argv) == 1 and "--overwrite" in one_error_line(capsys.readouterr().err)
    line = _fail_with_a_full_disk([*argv, "--overwrite"], "last.safetensors", capsys)
    # the run --overwrite was replacing (the stray file) is put back: the message says so and repeats the command
    assert "the run that --overwrite was to replace is back in place, unchanged" not in line  # it had no checkpoint
    assert "no checkpoint of the run was saved yet" in line, line
    again = _command(line, "start it again with:")
    assert again == [*argv, "--overwrite"] and (run / "notes.txt").read_text() == "mine"
    assert main(again) == 0
    assert_same_run(run, clean_runs[2])


def test_a_full_disk_in_an_overwrite_puts_the_old_run_back_and_says_so(clean_runs, tmp_path, capsys):
    run = copy_run(clean_runs[1], tmp_path / "run")
    before = snapshot(run)
    argv = [*train_args(2), "--out", str(run), "--overwrite"]
    line = _fail_with_a_full_disk(argv, "last.safetensors", capsys)
    assert "the run that --overwrite was to replace is back in place, unchanged" in line, line
    assert snapshot(run) == before
    assert main(_command(line, "start the new one again with:")) == 0
    assert_same_run(run, clean_runs[2])


@pytest.mark.parametrize("name", ["last.safetensors", "metrics.jsonl"])
def test_a_full_disk_after_a_checkpoint_names_it_and_the_resume_command(clean_runs, tmp_path, capsys, name):
    run = copy_run(clean_runs[1], tmp_path / "run")
    line = _fail_with_a_full_disk(["train", "--resume", "--epochs", "2", "--out", str(run)], name, capsys)
    assert "the last checkpoint (epoch 1) is kept; free disk space, then continue with:" in line, line
    if name == "last.safetensors":
        assert "the checkpoint saved there before is intact" in line, line
    again = _command(line, "continue with:")
    assert again == ["train", "--out", str(run), "--resume"]
    assert main(again) == 0  # config.yaml, written when the run resumed, holds --epochs 2
    assert_same_run(run, clean_runs[2])


def test_a_full_disk_after_a_mid_epoch_checkpoint_names_its_step(clean_runs, tmp_path, capsys, monkeypatch):
    """A checkpoint saved by SIGTERM one step into epoch 1, then a full disk at the end of that epoch."""
    run = tmp_path / "run"
    asked = []

    @contextlib.contextmanager
    def sigterm_after_one_step():
        yield lambda: asked.append(1) or (signal.SIGTERM if len(asked) > 1 else None)

    with monkeypatch.context() as patch:
        patch.setattr(trainer, "stop_on_signals", sigterm_after_one_step)
        assert main([*train_args(2), "--out", str(run)]) == 128 + signal.SIGTERM
    assert "a checkpoint (epoch 1, step 1) is saved" in capsys.readouterr().err
    line = _fail_with_a_full_disk(["train", "--resume", "--out", str(run)], "last.safetensors", capsys)
    assert "the last checkpoint (epoch 1, step 1) is kept; free disk space, then continue with:" in line, line
    assert main(_command(line, "continue with:")) == 0
    assert_same_run(run, clean_runs[2])


def test_a_full_disk_on_the_first_best_checkpoint_does_not_call_it_intact(tmp_path, capsys):
    """best.safetensors had never been saved: no "intact" promise about it; the last checkpoint is named."""
    run = tmp_path / "run"
    line = _fail_with_a_full_disk([*train_args(2), "--out", str(run)], "best.safetensors", capsys)
    assert "could not write checkpoint" in line and "intact" not in line, line
    assert "the last checkpoint (epoch 1) is kept" in line, line


# -- read-only run directories ------------------------------------------------------------------------------


def _refused(argv, capsys, command="train") -> str:
    status = main(argv)
    line = one_error_line(capsys.readouterr().err, command)
    assert status == 1, line
    return line


def _tree(folder):
    """Every path under ``folder`` with its bytes (files) or None (folders), the lock file included."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("visible", [True, False], ids=["access-sees-it", "found-at-first-write"])
@pytest.mark.parametrize("how", ["resume", "fresh", "overwrite"])
def test_a_read_only_run_directory_is_refused_before_anything_is_written(clean_runs, tmp_path, capsys, how, visible):
    run = copy_run(clean_runs[1], tmp_path / "run")
    (run / ".lock").write_text("pid 1\n")  # a finished run keeps its lock file
    before = _tree(tmp_path)
    argv = {
        "resume": ["train", "--resume", "--epochs", "2", "--out", str(run)],
        "fresh": [*train_args(2), "--out", str(run)],
        "overwrite": [*train_args(2), "--out", str(run), "--overwrite"],
    }[how]
    with pytest.MonkeyPatch.context() as patch:
        ReadOnly(tmp_path, visible=visible).install(patch)
        line = _refused(argv, capsys)
    if how == "fresh" and not visible:  # a run is there: refused as always, before any write
        assert "already holds a run" in line, line
    else:
        assert f"'{run}' cannot be written (Read-only file system); nothing in it was changed" in line, line
        advice = "copy it to a writable folder and resume it there" if how == "resume" else "pass another --out"
        assert advice in line, line
    assert _tree(tmp_path) == before
    if how == "resume":  # the advice, followed: a copy resumes and ends as the uninterrupted run
        copy = copy_run(run, tmp_path / "copy")
        assert main(["train", "--out", str(copy), "--resume", "--epochs", "2"]) == 0
        assert_same_run(copy, clean_runs[2])


@pytest.mark.parametrize("visible", [True, False], ids=["access-sees-it", "found-at-first-write"])
def test_a_new_run_under_a_read_only_folder_is_refused_and_nothing_is_created(tmp_path, capsys, visible):
    parent = tmp_path / "shared"
    parent.mkdir()
    run = parent / "new" / "run"
    with pytest.MonkeyPatch.context() as patch:
        ReadOnly(parent, visible=visible).install(patch)
        line = _refused([*train_args(1), "--out", str(run)], capsys)
    assert f"'{parent}' cannot be written (Read-only file system)" in line, line
    assert "nothing in it was changed; pass another --out" in line, line
    assert list(parent.iterdir()) == []


@pytest.mark.parametrize("visible", [True, False], ids=["access-sees-it", "found-at-the-move"])
def test_an_overwrite_whose_parent_folder_is_read_only_is_refused(clean_runs, tmp_path, capsys, visible):
    """--overwrite moves the old run aside, in its parent folder: a read-only parent is refused."""
    parent = tmp_path / "shared"
    parent.mkdir()
    run = copy_run(clean_runs[1], parent / "run")
    before = _tree(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        shield = ReadOnly(parent, visible=visible)
        shield.install(patch)
        patch.setattr(shield, "covers", lambda path: ReadOnly(parent).covers(path) and not ReadOnly(run).covers(path))
        line = _refused([*train_args(2), "--out", str(run), "--overwrite"], capsys)
    assert f"cannot move the run in '{run}' aside for --overwrite: '{parent}' cannot be written" in line, line
    after = _tree(tmp_path)
    if not visible:  # the lock was taken in the (writable) run before the move failed: its only trace
        after.pop("shared/run/.lock")
    assert after == before


@pytest.mark.parametrize("command", ["evaluate", "reconstruct"])
def test_reports_into_a_read_only_run_are_refused_before_the_work(clean_runs, tmp_path, capsys, command):
    run = copy_run(clean_runs[1], tmp_path / "run")
    before = _tree(tmp_path)
    argv = [command, "--checkpoint", str(run), "--device", "cpu", *(["--n", "4"] if command == "reconstruct" else [])]
    with pytest.MonkeyPatch.context() as patch:
        ReadOnly(run).install(patch)
        for task in TASKS.values():
            for work in ("score", "reconstructions"):
                patch.setattr(task, work, lambda *a, **k: pytest.fail("worked before the folder was checked"))
        line = _refused(argv, capsys, command)
    assert f"cannot write in '{run}' (Read-only file system); nothing in it was changed" in line, line
    assert "pass --out DIR to write the files elsewhere" in line, line
    assert _tree(tmp_path) == before
    assert main([*argv, "--out", str(tmp_path / "reports")]) == 0  # the advice, followed


@pytest.mark.skipif(
    not chmod_protects(), reason="chmod does not stop this process (root); the simulated cases above cover it"
)
@pytest.mark.parametrize("how", ["resume", "overwrite", "evaluate"])
def test_a_run_directory_made_read_only_with_chmod(clean_runs, tmp_path, capsys, how):
    run = copy_run(clean_runs[1], tmp_path / "run")
    before = _tree(tmp_path)
    argv = {
        "resume": ["train", "--resume", "--epochs", "2", "--out", str(run)],
        "overwrite": [*train_args(2), "--out", str(run), "--overwrite"],
        "evaluate": ["evaluate", "--checkpoint", str(run), "--device", "cpu"],
    }[how]
    mode = run.stat().st_mode
    os.chmod(run, stat.S_IRUSR | stat.S_IXUSR)
    try:
        line = _refused(argv, capsys, argv[0])
    finally:
        os.chmod(run, mode)
    assert f"'{run}' (Permission denied)" in line or f"'{run}' cannot be written (Permission denied)" in line, line
    assert "nothing in it was changed" in line, line
    assert _tree(tmp_path) == before


def test_a_run_directory_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    line = _refused([*train_args(1), "--out", str(tmp_path / "afile" / "run")], capsys)
    assert f"'{tmp_path / 'afile'}' is a file, not a folder; pass another --out" in line, line
    assert (tmp_path / "afile").read_text() == "x" and sorted(tmp_path.iterdir()) == [tmp_path / "afile"]
