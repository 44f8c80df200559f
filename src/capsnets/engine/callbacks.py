"""Callbacks of the one training loop, :func:`~capsnets.engine.fit`, in the manner of Lightning's
(``callbacks/timer.py``, ``early_stopping.py``, ``model_checkpoint.py``): a way of training is a step function
plus callbacks, not a new loop.

:func:`~capsnets.engine.fit` calls, in the order the callbacks are given:

- ``on_fit_start(state)`` once, before the first batch;
- ``time_up(state)`` at each evaluation point that is not the training's last: True ends the training there,
  the point's record gets ``"time_limit": True`` and the state stays unfinished (:class:`TimeLimit`);
- ``on_evaluation(state, record, final)`` at each evaluation point; it may extend ``record`` (e.g. a validation
  score) and returns True to stop the training there (:class:`Target`). ``final`` says that the training ends at
  this point anyway (its last epoch, or the time limit), so that a callback can evaluate and checkpoint;
- ``on_fit_end(state)`` once, after the last batch;
- ``on_interrupt(state)`` when ``fit``'s ``interrupt`` stops the training between two steps (a signal), before
  it raises :class:`~capsnets.engine.fit.TrainingInterrupted` (:class:`ModelCheckpoint` saves the state there).

Checkpoints are named ``<directory>/<name>.safetensors`` (:func:`checkpoint_path`) by both the trainer
(``last``, ``best``) and the experiments; :class:`ModelCheckpoint` saves them and :func:`resume_state` reads
the :class:`~capsnets.engine.TrainState` a later process continues from.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsnets.checkpoints import SUFFIX, Checkpoint, load_checkpoint
from capsnets.engine.distributed import DistContext
from capsnets.engine.fit import TrainState, save_state
from capsnets.models.hub import restore_model
from capsnets.validation import ArgumentError, positive_int

__all__ = [
    "Callback",
    "Hook",
    "ModelCheckpoint",
    "Target",
    "TimeLimit",
    "checkpoint_name",
    "checkpoint_path",
    "resume_state",
]


class Callback:
    """Base class of the callbacks of :func:`~capsnets.engine.fit`; every hook does nothing by default (see the
    module docstring for when each is called)."""

    def on_fit_start(self, state: TrainState) -> None:
        pass

    def time_up(self, state: TrainState) -> bool:
        return False

    def on_evaluation(self, state: TrainState, record: dict[str, Any], final: bool) -> bool | None:
        return None

    def on_fit_end(self, state: TrainState) -> None:
        pass

    def on_interrupt(self, state: TrainState) -> None:
        pass


class Hook(Callback):
    """A callback from a function ``fn(record, final) -> stop`` called at each evaluation point.

    Examples:
        >>> scores = []
        >>> hook = Hook(lambda record, final: scores.append(record["loss"]))
    """

    def __init__(self, fn: Callable[[dict[str, Any], bool], bool | None]) -> None:
        self.fn = fn

    def on_evaluation(self, state: TrainState, record: dict[str, Any], final: bool) -> bool | None:
        return self.fn(record, final)


class TimeLimit(Callback):
    """End the training at the first evaluation point at least ``seconds`` after :func:`~capsnets.engine.fit`
    began (evaluation included); the training's last point is never cut. Every process of a data-parallel group
    follows rank 0's clock.

    Args:
        seconds: a positive number of seconds, or None for no limit.
        context: the data-parallel group (default: a single process).
        device: where the flag that rank 0 broadcasts lives (the group's device; default CPU).
    """

    def __init__(
        self, seconds: float | None, *, context: DistContext | None = None, device: torch.device | str = "cpu"
    ) -> None:
        ok = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0
        if seconds is not None and not ok:  # NaN is not > 0
            raise ArgumentError(
                f"the training time limit must be a positive number of seconds (or None), got "
                f"{seconds!r}; the experiments take it as train_minutes"
            )
        self.seconds, self.context, self.device = seconds, context or DistContext(), torch.device(device)
        self.began = time.perf_counter()

    def on_fit_start(self, state: TrainState) -> None:
        self.began = time.perf_counter()

    def time_up(self, state: TrainState) -> bool:
        if self.seconds is None:
            return False
        flag = torch.tensor(float(time.perf_counter() - self.began >= self.seconds), device=self.device)
        if self.context.enabled:
            torch.distributed.broadcast(flag, src=0)
        return bool(flag.item())


class Target(Callback):
    """Score the model at each evaluation point and stop the training once the score reaches ``target``.

    Args:
        score: ``() -> float``, e.g. the accuracy on a validation set; stored in the record as ``key``.
        target: the score at which training stops (``score >= target``); None: score only, never stop.
        key: the record's entry for the score.
    """

    def __init__(self, score: Callable[[], float], target: float | None, key: str = "val_accuracy") -> None:
        self.score, self.target, self.key = score, target, key

    def on_evaluation(self, state: TrainState, record: dict[str, Any], final: bool) -> bool:
        record[self.key] = self.score()
        return self.target is not None and record[self.key] >= self.target


class ModelCheckpoint(Callback):
    """Save ``model`` with the :class:`~capsnets.engine.TrainState` in ``path``'s sidecar (:func:`save_state`).

    Args:
        path: the checkpoint (see :func:`checkpoint_path`).
        model: the model whose weights are saved.
        meta: ``(state, record) -> dict``, the sidecar's further entries.
        every: save at every ``every``-th epoch's end, and always at a point that ends the training.
        best_only: save only when the state's :attr:`~capsnets.engine.TrainState.best` is the newest record (a
            weights-only checkpoint of the best evaluation so far); ``every`` is then not used. Otherwise the
            state is also saved where the training is interrupted (``on_interrupt``).
        on_save: called after each save (e.g. to commit a run directory).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        model: nn.Module,
        meta: Callable[[TrainState, dict], dict],
        *,
        every: int = 1,
        best_only: bool = False,
        on_save: Callable[[], None] | None = None,
    ) -> None:
        self.path, self.model, self.meta, self.every = Path(path), model, meta, positive_int("every", every)
        self.best_only, self.on_save = best_only, on_save

    def on_evaluation(self, state: TrainState, record: dict[str, Any], final: bool) -> None:
        if self.best_only:
            if state.best == len(state.history) - 1:
                save_state(self.path, self.model, state, self.meta(state, record), resumable=False)
            return
        if final or (state.step == 0 and state.epoch % self.every == 0):
            self._save(state, record)

    def on_interrupt(self, state: TrainState) -> None:
        """A resumable checkpoint of the state where the training stopped (not for ``best_only``)."""
        if not self.best_only:
            self._save(state, state.history[-1] if state.history else {})

    def _save(self, state: TrainState, record: dict[str, Any]) -> None:
        save_state(self.path, self.model, state, self.meta(state, record))
        if self.on_save is not None:
            self.on_save()


def checkpoint_name(name: str, args: dict[str, Any] | None = None) -> str:
    """``name``, or ``name_<8 hex digits>`` (a hash of ``args``) for a model built with extra builder arguments,
    so that runs with other arguments keep their own checkpoints in the same folder.

    Examples:
        >>> checkpoint_name("seg_unet")
        'seg_unet'
    """
    if not args:
        return name
    return f"{name}_{hashlib.sha1(json.dumps(args, sort_keys=True).encode()).hexdigest()[:8]}"


def checkpoint_path(directory: str | os.PathLike, name: str, args: dict[str, Any] | None = None) -> Path:
    """``directory/<checkpoint_name(name, args)>.safetensors``: where the trainer (``last``, ``best``) and the
    experiments keep a checkpoint.

    Examples:
        >>> checkpoint_path("runs/a", "last").name
        'last.safetensors'
    """
    return Path(directory) / f"{checkpoint_name(name, args)}{SUFFIX}"


def resume_state(checkpoint: Checkpoint | str | os.PathLike, model: nn.Module | None = None) -> TrainState:
    """The :class:`~capsnets.engine.TrainState` that ``checkpoint`` records, holding the checkpoint so that
    :meth:`~capsnets.engine.TrainState.attach` restores the optimizer, scheduler and RNG state from it when the
    training goes on; with ``model``, its weights are loaded too.

    Raises:
        ValueError: the sidecar's ``training`` entry is not one this version writes.
    """
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = load_checkpoint(checkpoint)
    state = TrainState.from_meta(checkpoint.meta)
    if model is not None:
        restore_model(model, checkpoint)
    state.checkpoint = checkpoint
    return state
