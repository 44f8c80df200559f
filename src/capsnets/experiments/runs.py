"""How an experiment trains its models: through the engine's trainer (:class:`~capsnets.engine.Trainer`), each model
in a run directory of its own (``config.yaml``, ``metrics.jsonl``, the ``last`` and ``best`` checkpoints,
``summary.json``) under the ``--checkpoint-dir`` folder, or under a temporary folder deleted after the experiment.

:meth:`Runs.fit` reuses a complete run, resumes a run that a time limit cut short, and otherwise trains afresh; the
model is left at its ``best`` checkpoint (chosen on the validation data) or, without validation data, at its last
epoch. Two ways of training that the trainer's settings do not name are a sequence of trainer calls of one epoch
each, every call resuming the run (the trainer continues a run exactly, with more epochs): training that stops at a
validation ``target`` (the models compared at equal accuracy), and a training set drawn afresh every epoch
(``epoch_data``).

A run directory is named after its key and a hash of what decides its training and the model's builder arguments
(:func:`~capsnets.engine.callbacks.checkpoint_name`), so that a run with other settings, or another model, trains a
model of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from capsnets.checkpoints import load_checkpoint
from capsnets.engine import Trainer
from capsnets.engine.callbacks import checkpoint_name, checkpoint_path
from capsnets.engine.reporting import METRICS_FILE, SUMMARY_FILE
from capsnets.models.hub import restore_model

__all__ = ["Runs", "Training", "epochs_trained"]


@dataclass
class Training:
    """What :meth:`Runs.fit` did.

    Attributes:
        history: the run's records, one per epoch (as ``metrics.jsonl`` holds them), over every call.
        summary: the run's ``summary.json``.
        loaded: this call trained nothing: the run was complete.
        cut_short: the time limit ended the training before its epochs (or its target).
        planned: the epochs planned.
    """

    history: list[dict[str, Any]]
    summary: dict[str, Any]
    loaded: bool
    cut_short: bool
    planned: int

    def chosen(self, key: str = "val_accuracy") -> Any:
        """``key`` of the epoch the model was left at: the ``best`` checkpoint's, else the last epoch's."""
        epoch = self.summary.get("best_epoch") or len(self.history)
        return self.history[epoch - 1].get(key) if self.history else None

    @property
    def epochs(self) -> str:
        """The training's length as a report states it (:func:`epochs_trained`)."""
        return epochs_trained(len(self.history), self.planned, self.cut_short, self.loaded)


class Runs:
    """An experiment's run folder (``--checkpoint-dir``), and the names of the trainings a time limit cut short.

    Args:
        directory: the folder, or None for a temporary one that :meth:`close` deletes.

    Examples:
        >>> with Runs(None) as runs:
        ...     runs.cut_short
        []
    """

    def __init__(self, directory: str | os.PathLike | None) -> None:
        self.directory = None if directory is None else Path(directory)
        self.cut_short: list[str] = []
        self._temporary: str | None = None

    def __enter__(self) -> Runs:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Delete the temporary folder, if one was made."""
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
            self._temporary = None

    def folder(self) -> Path:
        """The folder runs are kept in (a temporary one without ``directory``)."""
        if self.directory is not None:
            return self.directory
        if self._temporary is None:
            self._temporary = tempfile.mkdtemp(prefix="capsnets-experiment-")
        return Path(self._temporary)

    def fit(
        self,
        key: str,
        model: nn.Module,
        train: Any,
        val: Any = None,
        *,
        test: Any = None,
        epochs: int,
        loss: Any = None,
        target: float | None = None,
        target_key: str = "val_accuracy",
        epoch_data: Callable[[int], Any] | None = None,
        train_minutes: float | None = None,
        recipe: dict[str, Any] | None = None,
        **settings: Any,
    ) -> Training:
        """Train ``model`` on ``train`` (validation: ``val``) for ``epochs`` in the run ``key``, or reuse or resume it.

        Args:
            key: the run's name (the folder adds a hash of the settings, ``target``, ``recipe`` and the model's
                ``model_args``, so that a model built otherwise trains in a run of its own).
            train, val, test: the data given to :meth:`~capsnets.engine.Trainer.fit` (``val`` chooses the ``best``
                checkpoint; None: the trainer holds out a share of ``train``).
            loss: the loss given to :meth:`~capsnets.engine.Trainer.fit` (None: the model's).
            target: stop at the first epoch whose ``target_key`` entry is at least this (e.g. a validation accuracy).
            epoch_data: ``epoch -> train data`` (1-based) instead of ``train``: a training set drawn every epoch.
            train_minutes: the training's time limit in minutes; a later run with the same folder continues it.
            recipe: what else decides the training (data sizes...), for the folder's name.
            **settings: :class:`~capsnets.engine.TrainConfig` fields (``batch_size``, ``lr``, ``seed``...). The
                trainings draw no figures unless ``figures=True``: the experiment's report draws its own.
        """
        check_minutes(train_minutes)
        named = {**settings, "epochs": epochs, "target": target, **(recipe or {})}
        named["model_args"] = getattr(model, "model_args", None)
        settings = {"figures": False, **settings}
        out = self.folder() / checkpoint_name(key, json.loads(json.dumps(named, default=str)))
        before = len(_records(out))
        if _complete(out, epochs):  # reused as it is: nothing in its folder is written
            summary, cut = json.loads((out / SUMMARY_FILE).read_text()), False
        elif target is None and epoch_data is None:
            resume = checkpoint_path(out, "last").is_file()
            limit = {"time_limit_minutes": train_minutes}
            trainer = Trainer(out=str(out), epochs=epochs, resume=resume, overwrite=not resume, **limit, **settings)
            trainer.fit(model, train, val, test_data=test, loss=loss)
            summary = json.loads((out / SUMMARY_FILE).read_text())
            cut = bool(summary.get("time_limited"))
        else:
            stop = (epochs, target, target_key, train_minutes)
            cut = self._stepwise(out, model, (train, val, test, epoch_data), loss, stop, settings)
            summary = json.loads((out / SUMMARY_FILE).read_text())
        history = _records(out)
        if cut:
            self.cut_short.append(out.name)
        chosen = checkpoint_path(out, "best" if checkpoint_path(out, "best").is_file() else "last")
        restore_model(model, load_checkpoint(chosen))
        model.eval()
        return Training(history, summary, loaded=len(history) == before and before > 0, cut_short=cut, planned=epochs)

    def _stepwise(self, out: Path, model: nn.Module, data: tuple, loss: Any, stop: tuple, settings: dict) -> bool:
        """Train one epoch per trainer call until ``epochs``, ``target`` or the time limit; True if cut short."""
        (train, val, test, epoch_data), (epochs, target, target_key, minutes) = data, stop
        began, history, trained = time.perf_counter(), _records(out), 0
        while not _done(history, epochs, target, target_key):
            if trained and minutes is not None and time.perf_counter() - began >= 60.0 * minutes:
                return True
            epoch = len(history) + 1
            data = epoch_data(epoch) if epoch_data is not None else train
            resume = checkpoint_path(out, "last").is_file()
            trainer = Trainer(out=str(out), epochs=epoch, resume=resume, overwrite=not resume, **settings)
            trainer.fit(model, data, val, test_data=test, loss=loss)
            history, trained = _records(out), trained + 1
        return False


def _complete(out: Path, epochs: int) -> bool:
    """Whether the run in ``out`` trained its ``epochs`` (a run of one trainer call; a stepwise run is judged by its
    records)."""
    if not checkpoint_path(out, "last").is_file() or not (out / SUMMARY_FILE).is_file():
        return False
    summary = json.loads((out / SUMMARY_FILE).read_text())
    return not summary.get("time_limited") and summary.get("epochs", 0) >= epochs


def _done(history: Sequence[dict], epochs: int, target: float | None, key: str) -> bool:
    reached = bool(history) and target is not None and history[-1].get(key, float("-inf")) >= target
    return len(history) >= epochs or reached


def _records(out: Path) -> list[dict[str, Any]]:
    """The run's records (``metrics.jsonl``), or none before its first checkpoint."""
    if not checkpoint_path(out, "last").is_file() or not (out / METRICS_FILE).is_file():
        return []
    return [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines() if line.strip()]


def check_minutes(minutes: Any) -> float | None:
    """``minutes`` (an experiment's ``train_minutes``) if it is None or a positive number, else a ``ValueError``."""
    positive = isinstance(minutes, (int, float)) and not isinstance(minutes, bool) and minutes > 0
    if minutes is not None and not positive:
        raise ValueError(f"train_minutes must be a positive number of minutes (or null for no limit), got {minutes!r}")
    return minutes


def epochs_trained(trained: int, planned: int, cut_short: bool = False, loaded: bool = False) -> str:
    """How a report states a training's length: ``"12"``, ``"7 of 50 (time limit)"``, ``"12 (loaded)"``."""
    text = f"{trained} of {planned} (time limit)" if cut_short else str(trained)
    return f"{text} (loaded)" if loaded else text
