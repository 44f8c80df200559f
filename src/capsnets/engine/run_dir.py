"""A training's run directory is never replaced by accident, and a resumed run is the run it continues.

- :class:`RunDirectory` claims the directory for one training: it holds a lock (a second training into the same
  directory is refused), cleans up after saves a crash interrupted
  (:func:`~capsnets.engine.checkpoint.recover_directory`), refuses a fresh run into a directory that holds files
  (naming ``--resume`` and ``--overwrite``; ``--overwrite`` replaces only a run, never a folder of other files), and
  with ``overwrite`` moves the old run aside, deleting it only once
  the new run has saved its first checkpoint (a new run that fails before that gets the old one back; after a
  crash, the next training into the directory does it). A directory in which files cannot be made (a read-only
  file system, no permission) is refused before anything is written, naming it and how to go on.
- :func:`check_best` and :func:`repair_best` keep a resumed run's ``best`` checkpoint the history's best.
- :func:`resume_changes` compares the configuration a run is resumed with against the one it was trained with:
  changes that would alter the model or the data it sees are refused, changes it can apply (more epochs, a new
  learning rate, another device) are returned, to be applied and logged.
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capsnets.checkpoints import CheckpointError, checkpoint_epoch, load_checkpoint, peek_sidecar, recover_directory
from capsnets.engine.callbacks import checkpoint_path
from capsnets.engine.fit import TrainState, save_state
from capsnets.files import READ_ONLY_ERRNOS, FileWriteError, folder_write_problem
from capsnets.outputs import written_for

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"

#: TrainConfig fields a resumed run may change: applied from the resumed epoch on, and recorded.
CHANGEABLE = (
    "epochs",
    "lr",
    "lr_decay",
    "weight_decay",
    "device",
    "threads",
    "amp",
    "compile",
    "data_dir",
    "download",
    "limit_test",
    "test_each_epoch",
    "eval_every",
    "checkpoint_every",
    "progress",
    "figures",
    "time_limit_minutes",
    "out",
)
#: Fields whose change would make the resumed run another run (the model, its data or its loss).
FIXED = (
    "model",
    "model_args",
    "dataset",
    "image_size",
    "batch_size",
    "seed",
    "max_shift",
    "augment",
    "limit_train",
    "val_fraction",
    "loss",
    "loss_args",
    "pretrained",
    "classifier_only_epochs",
)


#: Files that make a folder a training run, which ``overwrite`` may replace (with any checkpoint and the
#: ``config.yaml`` a training wrote).
RUN_MARKERS = ("metrics.jsonl", "summary.json")


class RunDirectoryError(ValueError):
    """The run directory cannot be used as asked (it holds another run, or another training holds it)."""


class RunDirectory:
    """Claim ``path`` for one training (see the module docstring); use as a context manager.

    Args:
        path: the run directory.
        resume: the training continues the run in ``path``.
        overwrite: a fresh run may replace the run in ``path``.
    """

    def __init__(self, path: str | os.PathLike, *, resume: bool = False, overwrite: bool = False) -> None:
        if resume and overwrite:
            raise RunDirectoryError("--resume continues the run and --overwrite replaces it: pass one of them")
        self.path, self.resume, self.overwrite = Path(path), resume, overwrite
        self.aside: Path | None = None  # the replaced run, until the new one has its first checkpoint
        self.made: Path | None = None  # the topmost folder this claim created (None: the run directory existed)
        self._lock = None

    def __enter__(self) -> RunDirectory:
        if self.path.exists() and not self.path.is_dir():
            raise RunDirectoryError(f"run directory '{self.path}' is a file; pass another --out")
        if self.path.is_dir() or not self.resume:  # a missing run to resume is reported below
            self._check_writable(self.path)
        self._recover_interrupted_overwrite()
        if self.resume and not self.path.is_dir():
            raise RunDirectoryError(f"cannot resume: no run directory '{self.path}'; train without --resume first")
        held = run_files(self.path)
        if held and not self.resume:
            if not _is_run(self.path, held):
                raise RunDirectoryError(
                    f"--out '{self.path}' holds files that are not a training run ({_describe(self.path, held)}), "
                    "so nothing was written there; a run needs a folder of its own: pass another --out "
                    "(--overwrite replaces only a run)"
                )
            if not self.overwrite:
                raise RunDirectoryError(
                    f"run directory '{self.path}' already holds a run ({_describe(self.path, held)}); continue it with "
                    f"--resume, replace it with --overwrite (the old run is kept aside until the new one has saved "
                    f"its first checkpoint), or pass another --out"
                )
            self._check_writable(self.path.parent, moving=True)
            self._take_lock()  # nobody else may be training there while it moves
            self._release_lock()
            self.aside = self._beside("replaced")
            try:
                os.replace(self.path, self.aside)
            except OSError as err:
                self.aside = None
                if err.errno not in READ_ONLY_ERRNOS:
                    raise
                raise self._not_writable(self.path.parent, err, moving=True) from err
            logger.warning(
                "moved the run in '%s' aside to '%s'; it is deleted once the new run has saved its first checkpoint",
                self.path,
                self.aside,
            )
        self.made = next((p for p in (*reversed(self.path.parents), self.path) if not p.exists()), None)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            if err.errno not in READ_ONLY_ERRNOS:
                raise FileWriteError(self.path, err) from err
            existing = next(p for p in (self.path, *self.path.parents) if p.exists())
            raise self._not_writable(existing, err) from err
        self._take_lock()
        recover_directory(self.path)
        return self

    def _check_writable(self, folder: Path, *, moving: bool = False) -> None:
        """Refuse, before anything is written, a run directory (or, ``moving``, the folder that holds it) in
        which files cannot be made (:func:`~capsnets.files.folder_write_problem`)."""
        problem = folder_write_problem(folder)
        if problem is not None:
            raise self._not_writable(Path(problem.filename), problem, moving=moving)

    def _not_writable(self, folder: Path, err: OSError, *, moving: bool = False) -> RunDirectoryError:
        """The one-line error for a run directory that cannot be written: which folder, that nothing was changed,
        and how to go on."""
        reason = err.strerror or str(err)
        if err.errno == errno.ENOTDIR:
            return RunDirectoryError(
                f"cannot create run directory '{self.path}': '{folder}' is a file, not a folder; pass another --out"
            )
        if moving:
            what = (
                f"cannot move the run in '{self.path}' aside for --overwrite: '{folder}' cannot be written ({reason})"
            )
        elif folder == self.path or self.path.is_dir():
            what = f"run directory '{self.path}' cannot be written ({reason})"
        else:
            what = f"cannot create run directory '{self.path}': '{folder}' cannot be written ({reason})"
        if self.resume:
            how = (
                "to continue the run, copy it to a writable folder and resume it there (--out COPY --resume), "
                f"or make '{folder}' writable"
            )
        else:
            how = f"pass another --out, or make '{folder}' writable"
        return RunDirectoryError(f"{what}; nothing in it was changed; {how}")

    def committed(self) -> None:
        """The new run has saved a checkpoint: delete the run it replaced."""
        if self.aside is not None:
            shutil.rmtree(self.aside, ignore_errors=True)
            logger.info("deleted the replaced run '%s'", self.aside)
            self.aside = None

    def __exit__(self, kind, error, trace) -> None:
        if kind is not None and self.aside is None and not self.resume:
            self._remove_unsaved()
        self._release_lock()
        if self.aside is None:
            return
        if kind is None:  # finished without a checkpoint (cannot happen with the trainer): keep the new run
            self.committed()
            return
        failed = self._beside("failed")
        os.replace(self.path, failed)
        os.replace(self.aside, self.path)
        logger.warning(
            "the new run failed before its first checkpoint: put the replaced run back in '%s' (the "
            "failed run's files are in '%s')",
            self.path,
            failed,
        )
        self.aside = None

    def _remove_unsaved(self) -> None:
        """A fresh run that failed before it saved anything but its configuration leaves nothing it created: the
        folders it made, or else its lock (the lock is removed while held, so no other training takes it)."""
        try:
            names = {p.name for p in self.path.iterdir()}
        except OSError:
            return
        if names - {LOCK_FILE, "config.yaml"} - {p.name for p in self.path.glob(".*.tmp")}:
            return  # a checkpoint, metrics or figures: kept
        if self.made is not None:
            shutil.rmtree(self.made, ignore_errors=True)
        else:
            (self.path / LOCK_FILE).unlink(missing_ok=True)

    def _recover_interrupted_overwrite(self) -> None:
        """Finish an ``overwrite`` that a crash cut short, as it would have ended: the run it moved aside is deleted
        if the new run saved a checkpoint, else put back (the new run's files, only its config and the leftovers of
        an interrupted save without a checkpoint, are deleted; anything more is kept in ``<path>.failed-*``)."""
        leftovers = sorted(self.path.parent.glob(f"{glob.escape(self.path.name)}.replaced-*"))
        leftovers = [p for p in leftovers if p.is_dir()]
        if not leftovers:
            return
        if self.path.is_dir():
            self._take_lock()  # an overwrite still running holds it, and its run aside is no leftover
            self._release_lock()
        if (self.path / "last.safetensors").is_file():
            for aside in leftovers:
                shutil.rmtree(aside, ignore_errors=True)
                logger.warning(
                    "deleted '%s', the run replaced by an --overwrite whose new run saved its first "
                    "checkpoint before a crash",
                    aside,
                )
            return
        aside = leftovers[-1]
        if self.path.is_dir():
            if (
                {p.name for p in self.path.iterdir()}
                - {"config.yaml", LOCK_FILE}
                - {p.name for p in self.path.glob(".*.tmp")}
            ):
                failed = self._beside("failed")
                os.replace(self.path, failed)
                logger.warning("kept the files of the interrupted --overwrite run in '%s'", failed)
            else:
                shutil.rmtree(self.path)
        os.replace(aside, self.path)
        logger.warning(
            "an --overwrite of '%s' was interrupted before its new run saved a checkpoint: put back the "
            "run it replaced (from '%s')",
            self.path,
            aside,
        )

    def _beside(self, kind: str) -> Path:
        """A new name beside the run directory: ``<name>.<kind>-<time>`` (``-2``, ``-3``... if taken)."""
        stem = f"{self.path.name}.{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
        candidate, number = self.path.with_name(stem), 1
        while candidate.exists():
            number += 1
            candidate = self.path.with_name(f"{stem}-{number}")
        return candidate

    def _take_lock(self) -> None:
        try:
            # POSIX only
            import fcntl  # noqa: PLC0415
        except ImportError:  # Windows: no advisory locks; one training per directory is then up to the user
            return
        try:
            handle = open(self.path / LOCK_FILE, "a+")
        except OSError as err:
            if err.errno in READ_ONLY_ERRNOS:
                raise self._not_writable(self.path, err) from err
            raise FileWriteError(self.path / LOCK_FILE, err) from err
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            handle.close()
            raise RunDirectoryError(
                f"run directory '{self.path}' is in use by another training ({owner}); wait for "
                "it to end, or pass another --out"
            ) from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}\n")
            handle.flush()
        except OSError as err:
            handle.close()
            raise FileWriteError(self.path / LOCK_FILE, err) from err
        self._lock = handle

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def run_files(path: str | os.PathLike) -> list[str]:
    """The files in ``path`` that make it a run, which a fresh training refuses to replace without ``overwrite``:
    all but its lock, and none where it holds only the ``config.yaml`` a training wrote (a run stopped by a bad
    flag before its first epoch ended, which lost nothing; a ``config.yaml`` of the user's is kept)."""
    path = Path(path)
    held = sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE) if path.is_dir() else []
    return [] if held == ["config.yaml"] and written_for(path / "config.yaml") == "config" else held


def _is_run(path: Path, names: list[str]) -> bool:
    """Whether the files ``names`` in ``path`` are a training run's: a checkpoint, the metrics or summary, or the
    ``config.yaml`` a training wrote."""
    return any(name in RUN_MARKERS or name.endswith(".safetensors") for name in names) or (
        "config.yaml" in names and written_for(path / "config.yaml") == "config"
    )


def _describe(path: Path, names: list[str]) -> str:
    """What a run directory holds, for an error message: its epochs if it has a checkpoint, else its files."""
    try:
        meta = peek_sidecar(path / "last.safetensors")
        planned = (meta.get("config") or {}).get("epochs")
        return f"epoch {meta['epoch']}" + (f" of {planned}" if planned else "")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        return f"files {shown}"


def resume_changes(
    saved: dict[str, Any], wanted: dict[str, Any], model_defaults: dict[str, Any], where: str
) -> dict[str, tuple[Any, Any]]:
    """The changes a resumed run makes to the configuration it was trained with: ``{field: (old, new)}``.

    Args:
        saved: the trained run's configuration (``TrainConfig.to_dict()`` from its checkpoint).
        wanted: the configuration the run is resumed with (same form). Its ``model_args`` need only name the
            arguments it sets; each must equal the saved value, or the builder's default when the run did not
            record it.
        model_defaults: the model builder's default arguments.
        where: the run directory, for the error message.

    Raises:
        RunDirectoryError: a field in :data:`FIXED` differs; the message lists every such change.
    """
    saved, wanted = _plain(saved), _plain(wanted)
    refused = []
    for name in FIXED:
        if name == "model_args":
            recorded = {**_plain(model_defaults), **(saved.get(name) or {})}
            for key, value in sorted((wanted.get(name) or {}).items()):
                old = recorded.get(key, _MISSING)
                if isinstance(value, dict) and isinstance(old, dict):  # e.g. routing settings: key by key
                    refused += [
                        f"model_args.{key}.{sub} {_show(old.get(sub, _MISSING))} -> {_show(new)}"
                        for sub, new in sorted(value.items())
                        if old.get(sub, _MISSING) != new
                    ]
                elif old != value:
                    refused.append(f"model_args.{key} {_show(old)} -> {_show(value)}")
        elif name in saved and saved.get(name) != wanted.get(name):
            refused.append(f"{name} {_show(saved.get(name))} -> {_show(wanted.get(name))}")
    if refused:
        raise RunDirectoryError(
            f"cannot resume the run in '{where}' with {', '.join(refused)}: that would make it another run; "
            "resume without these changes, or start a new run (another --out, or --overwrite)"
        )
    return {
        name: (saved[name], wanted.get(name))
        for name in CHANGEABLE
        if name in saved and saved[name] != wanted.get(name)
    }


_MISSING = object()


def _show(value: Any) -> str:
    return "(not set)" if value is _MISSING else json.dumps(value)


def _plain(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(value, default=str))


def check_best(run_dir: Path, state: TrainState) -> None:
    """Before anything is written: ``best`` must load, unless it holds the epoch ``last`` holds (then
    :func:`repair_best` saves it again). A damaged one whose epoch is gone is refused, so that it is not
    replaced unseen; a missing one is reported."""
    path = checkpoint_path(run_dir, "best")
    best = state.history[state.best] if state.best is not None else None
    if best is None or best.get("epoch") == state.epoch:
        return
    if not path.is_file():
        logger.warning(
            "%s is missing: the weights of the best epoch so far (%s) are lost; it is saved again when "
            "an epoch beats that one",
            path,
            best.get("epoch"),
        )
        return
    try:
        load_checkpoint(path)
    except CheckpointError as err:
        raise CheckpointError(
            f"cannot resume: {str(err).split('; ')[0]}; it holds the best epoch "
            f"({best.get('epoch')}), which the run cannot save again: restore it from a "
            "copy, or move it away to resume without it"
        ) from err


def repair_best(run_dir: Path, state: TrainState, model, meta: Callable[[TrainState, dict], dict]) -> None:
    """A crash between saving ``last`` and ``best`` leaves ``best`` an epoch behind the history's best, which is
    then the epoch ``last`` holds: save it again from the resumed model (also when it is damaged or missing)."""
    if state.best is None or state.history[state.best].get("epoch") != state.epoch:
        return
    path = checkpoint_path(run_dir, "best")
    saved_epoch = checkpoint_epoch(path) if path.is_file() else None
    if saved_epoch == state.epoch:
        try:
            load_checkpoint(path)
        except CheckpointError:
            saved_epoch = None
    if saved_epoch != state.epoch:
        logger.warning(
            "%s did not hold the best epoch (%d) (a crash interrupted its save, or it is damaged or "
            "missing): saved it again",
            path,
            state.epoch,
        )
        save_state(path, model, state, meta(state, state.history[state.best]), resumable=False)
