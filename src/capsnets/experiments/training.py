"""How the experiments train: through the engine's one loop, :func:`~capsnets.engine.fit`, with its callbacks
(:mod:`capsnets.engine.callbacks`), on tensors that already live on the device
(:class:`~capsnets.engine.batches.TensorBatches`), and kept in a checkpoint folder between runs.

- :func:`train_classifier`: Adam with a per-epoch exponential learning-rate decay
  (:func:`~capsnets.engine.adam_with_decay`, as the trainer) and an optional time limit;
  :func:`train_to_accuracy` stops it at a validation target.
- :class:`Checkpoints`: an experiment's checkpoint folder. :meth:`Checkpoints.load_or_train` loads a model from
  it or trains and saves it; with a :class:`~capsnets.engine.TrainState`, a training that its time limit cut
  short is continued by the next run, and the folder records its name in :attr:`Checkpoints.cut_short`.
  :meth:`Checkpoints.fit_or_load` is :func:`train_to_accuracy` kept there.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from capsnets.engine.batches import Targets, TensorBatches
from capsnets.engine.callbacks import Hook, Target, TimeLimit, checkpoint_path, resume_state
from capsnets.engine.checkpoint import load_checkpoint, recover_directory
from capsnets.engine.evaluate import accuracy as evaluate_accuracy
from capsnets.engine.fit import TrainState, adam_with_decay, fit, save_state, training_step
from capsnets.engine.runtime import resolve_amp
from capsnets.losses import create_loss
from capsnets.validation import non_negative_int

__all__ = ["Checkpoints", "default_loss_fn", "epochs_trained", "evaluate_accuracy", "load_or_train",
           "minutes_to_seconds", "train_classifier", "train_to_accuracy"]

_log = logging.getLogger(__name__)

LossFn = Callable[[nn.Module, Tensor, Any], Tensor]


def default_loss_fn(model: nn.Module) -> LossFn:
    """``loss(model, images, labels)`` with the model's default loss (margin + reconstruction, or CE)."""
    criterion = create_loss(getattr(model, "default_loss", "cross_entropy"))

    def loss(model: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
        return criterion(model(images, labels), images, labels)[0]

    return loss


def train_classifier(model: nn.Module, images: Tensor | None, targets: Targets | None, *,
                     epoch_data: Callable[[int], tuple[Tensor, Targets]] | None = None, loss_fn: LossFn | None = None,
                     epochs: int = 1, batch_size: int = 128, lr: float = 1e-3, lr_decay: float = 0.96,
                     seed: int = 0, augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
                     desc: str = "train", progress: bool = True, amp: str = "auto",
                     after_epoch: Callable[[dict[str, Any]], bool] | None = None,
                     time_limit_s: float | None = None, state: TrainState | None = None,
                     callbacks: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Train ``model`` in place with Adam and a per-epoch exponential learning-rate decay.

    Batches are cut on the device holding the data (:class:`~capsnets.engine.batches.TensorBatches`); the model
    must already be there.

    Args:
        images, targets, epoch_data, augment: the training data (see
            :class:`~capsnets.engine.batches.TensorBatches`).
        loss_fn: ``loss_fn(model, images, targets) -> scalar``; default :func:`default_loss_fn`.
        amp: ``"auto"`` (bf16 autocast for the forward pass and loss on CUDA, full precision elsewhere),
            ``"bf16"`` or ``"off"``, as in the trainer.
        after_epoch: called with each epoch's record (it may add entries to it, e.g. a validation score);
            returning True ends training after that epoch.
        time_limit_s: wall-clock budget in seconds: training ends after the first epoch that ends past it,
            and that epoch's record gets ``"time_limit": True``.
        callbacks: further :class:`~capsnets.engine.callbacks.Callback` objects, called after ``after_epoch``.
        state: a :class:`~capsnets.engine.TrainState` to record progress in. If :func:`load_or_train` has put an
            unfinished checkpoint in it, training continues from there with its optimizer, scheduler and RNG
            state (the weights are restored by :func:`load_or_train`), ending where an uninterrupted run would.

    Returns:
        the records (:func:`~capsnets.engine.fit`) of the epochs trained in this call, one per epoch.
    """
    non_negative_int("epochs", epochs)
    batches = TensorBatches(images, targets, batch_size, seed=seed, augment=augment, epoch_data=epoch_data)
    loss_fn = loss_fn or default_loss_fn(model)
    optimizer, scheduler = adam_with_decay(model.parameters(), lr=lr, lr_decay=lr_decay)
    state = state if state is not None else TrainState()
    state.attach(optimizer, scheduler)
    device, first = next(model.parameters()).device, len(state.history)
    step = training_step(lambda batch: {"loss": loss_fn(model, *batch)}, optimizer, device=device,
                         amp_dtype=resolve_amp(amp, device), model=model)
    hooks = [TimeLimit(time_limit_s), *([Hook(lambda record, final: after_epoch(record))] if after_epoch else []),
             *callbacks]
    fit(step, batches, epochs=epochs, state=state, schedulers=[scheduler], callbacks=hooks, desc=desc,
        progress=progress)
    model.eval()
    return state.history[first:]


def train_to_accuracy(model: nn.Module, images: Tensor, labels: Tensor, val_images: Tensor, val_labels: Tensor, *,
                      target: float, max_epochs: int, lr: float = 1e-3, lr_decay: float = 0.96, batch_size: int = 128,
                      seed: int = 0, augment: Callable | None = None, desc: str = "train",
                      time_limit_s: float | None = None, state: TrainState | None = None) -> dict:
    """Train (one run of :func:`train_classifier`: Adam, learning rate ``lr * lr_decay ** (epoch - 1)``) until
    the validation accuracy, scored after every epoch, reaches ``target`` or ``max_epochs`` pass (or, with
    ``time_limit_s``, the first epoch that ends past that many seconds of training).

    Returns:
        ``{"epochs", "val_accuracy", "history", "time_limit"}`` (``history``: one record per epoch trained in
        this call, with its ``val_accuracy``).
    """
    score = Target(lambda: evaluate_accuracy(model, val_images, val_labels), target, key="val_accuracy")
    history = train_classifier(model, images, labels, epochs=max_epochs, batch_size=batch_size, lr=lr,
                               lr_decay=lr_decay, seed=seed, augment=augment, desc=desc, progress=False,
                               callbacks=[score], time_limit_s=time_limit_s, state=state)
    return {"epochs": len(history), "val_accuracy": history[-1]["val_accuracy"] if history else 0.0,
            "history": history, "time_limit": bool(history and history[-1].get("time_limit"))}


def minutes_to_seconds(minutes: float | None) -> float | None:
    """The ``train_minutes`` setting of an experiment as :func:`train_classifier`'s ``time_limit_s``."""
    positive = isinstance(minutes, (int, float)) and not isinstance(minutes, bool) and minutes > 0
    if minutes is not None and not positive:
        raise ValueError(f"train_minutes must be a positive number of minutes (or null for no limit), got {minutes!r}")
    return None if minutes is None else 60.0 * minutes


def epochs_trained(history: Sequence[dict], planned: int) -> str:
    """How a report states a training run's length: ``"12"``, ``"7 of 50 (time limit)"``, or, for a training
    continued over several runs (each earlier run's last record has ``"time_limit"``), ``"50 (3 runs)"``."""
    runs = 1 + sum(1 for record in history[:-1] if record.get("time_limit"))
    across = f"{runs} runs" if runs > 1 else ""
    if history and history[-1].get("time_limit"):
        return f"{len(history)} of {planned} (time limit{'; ' + across if across else ''})"
    return f"{len(history)} ({across})" if across else str(len(history))


def load_or_train(model: nn.Module, name: str, train: Callable[[], Any], *,
                  checkpoint_dir: str | os.PathLike | None, meta: dict[str, Any] | None = None,
                  state: TrainState | None = None, recipe: dict[str, Any] | None = None) -> bool:
    """Load ``checkpoint_dir/<name>.safetensors`` into ``model`` if it exists, else call ``train()``
    and save the model there (when ``checkpoint_dir`` is given). Returns True when it was loaded (and not
    trained further).

    ``meta``: extra entries for the checkpoint's sidecar, taken after ``train()`` (so ``train`` may fill
    them). When the model is loaded, every list in ``meta`` is filled in place from the sidecar's entry of
    the same key, and when it is loaded as finished (True is returned), ``meta`` also gets the sidecar's other
    entries (what ``train()`` recorded then), so the caller need not read the checkpoint again.

    ``state``: the :class:`~capsnets.engine.TrainState` that ``train()`` trains with (it is saved in the
    sidecar; a loaded model's state, its history included, is read back into it). With it, a training cut
    short by its time limit is saved with its optimizer, scheduler and RNG state, and a later run that finds
    that checkpoint continues it (``train()`` is called again) instead of taking the model as finished.

    ``recipe``: the settings that decide what ``train()`` does (epochs, learning rate, data sizes, seed...;
    not a time limit), kept in the sidecar. A checkpoint trained with another recipe is refused with an
    error naming the settings that differ, rather than loaded as if this run had trained it (checkpoints
    written without a recipe are loaded as they are)."""
    path = checkpoint_path(checkpoint_dir, name) if checkpoint_dir is not None else None
    if path is not None:
        recover_directory(path.parent)  # what a crash in an earlier save left
    if path is not None and path.is_file():
        checkpoint = load_checkpoint(path)
        saved = checkpoint.meta.get("model_args")
        wanted = _jsonable(getattr(model, "model_args", {}))
        if saved is not None and saved != wanted:
            raise ValueError(f"{path} holds a model built with {json.dumps(saved, sort_keys=True)}, but this run "
                             f"builds it with {json.dumps(wanted, sort_keys=True)}; pass another --checkpoint-dir "
                             f"(or delete that file) to train this one")
        _check_recipe(path, checkpoint.meta.get("recipe"), recipe)
        try:
            found = resume_state(checkpoint, model)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err
        model.eval()
        for key, value in (meta or {}).items():
            if isinstance(value, list) and isinstance(checkpoint.meta.get(key), list):
                value[:] = checkpoint.meta[key]
        if state is None or found.finished:
            if state is not None:
                state.load(found)
            if meta is not None:
                meta.update({k: v for k, v in checkpoint.meta.items()
                             if k not in meta and k not in ("model", "model_args", "training", "recipe")})
            return True
        state.load(found)
        state.checkpoint = checkpoint
        _log.info("%s: continuing the training its time limit cut short after %d epochs (%s)", name, state.epoch,
                  path)
    train()
    unfinished = state is not None and not state.finished
    if path is not None:
        meta = {"model": getattr(model, "model_name", name), "model_args": getattr(model, "model_args", {}),
                **(meta or {}), **({"recipe": _jsonable(recipe)} if recipe is not None else {})}
        save_state(path, model, state if state is not None else TrainState(finished=True), meta,
                   resumable=unfinished)
    return False


def _jsonable(value: Any) -> Any:
    """``value`` as it reads back from a JSON sidecar (tuples become lists)."""
    return json.loads(json.dumps(value))


_UNSET = object()


def _check_recipe(path: Path, saved: dict[str, Any] | None, wanted: dict[str, Any] | None) -> None:
    """Refuse a checkpoint whose training recipe is not this run's (see :func:`load_or_train`)."""
    if saved is None or wanted is None:
        return
    wanted = _jsonable(wanted)
    differ = [k for k in sorted(set(saved) | set(wanted)) if saved.get(k, _UNSET) != wanted.get(k, _UNSET)]
    if not differ:
        return

    def show(recipe: dict[str, Any]) -> str:
        return ", ".join(f"{k}={json.dumps(recipe[k]) if k in recipe else '(unset)'}" for k in differ)

    raise ValueError(f"{path} holds a model trained with {show(saved)}, but this run trains it with {show(wanted)}; "
                     f"pass another --checkpoint-dir (or delete that file) to train this one")


class Checkpoints:
    """An experiment's checkpoint folder (``--checkpoint-dir``): models are kept there between runs as
    ``<directory>/<name>.safetensors`` (:func:`~capsnets.engine.callbacks.checkpoint_path`), and the names of
    the trainings that a time limit left unfinished are recorded in :attr:`cut_short`.

    Args:
        directory: the folder, or None to train every model and keep nothing.

    Examples:
        >>> Checkpoints(None).cut_short
        []
    """

    def __init__(self, directory: str | os.PathLike | None) -> None:
        self.directory = None if directory is None else Path(directory)
        self.cut_short: list[str] = []

    def load_or_train(self, model: nn.Module, name: str, train: Callable[[], Any], **kwargs) -> bool:
        """:func:`load_or_train` in this folder (``kwargs``: ``meta``, ``state``, ``recipe``); a training that
        ends unfinished is added to :attr:`cut_short`."""
        loaded = load_or_train(model, name, train, checkpoint_dir=self.directory, **kwargs)
        state = kwargs.get("state")
        if not loaded and state is not None and not state.finished:
            self.cut_short.append(name)
        return loaded

    def fit_or_load(self, model: nn.Module, key: str, images: Tensor, labels: Tensor, val_images: Tensor,
                    val_labels: Tensor, **train_args) -> dict:
        """:func:`train_to_accuracy`, or ``<directory>/<key>.safetensors`` from an earlier run (its training
        record is kept in the checkpoint's sidecar and read back). A training cut short by ``time_limit_s`` is
        continued by the next run with the same folder.

        Returns:
            ``{"epochs" (for a report: "12", "7 of 50 (time limit)", "3 (loaded)"), "trained_epochs",
            "val_accuracy", "history"}``.
        """
        state = TrainState()
        augment = train_args.get("augment")
        recipe = {"train_images": len(images), "val_images": len(val_images),
                  "augment": None if augment is None else type(augment).__name__,
                  **{k: v for k, v in train_args.items() if k not in ("augment", "desc", "time_limit_s")}}
        train = lambda: train_to_accuracy(model, images, labels, val_images, val_labels, state=state,  # noqa: E731
                                          **train_args)
        loaded = self.load_or_train(model, key, train, state=state, recipe=recipe)
        history = state.history
        if loaded:
            return {"epochs": f"{len(history)} (loaded)" if history else "loaded",
                    "trained_epochs": len(history) or None, "history": history, "val_accuracy": evaluate_accuracy(model, val_images, val_labels)}
        return {"epochs": epochs_trained(history, train_args["max_epochs"]), "trained_epochs": len(history),
                "history": history, "val_accuracy": history[-1]["val_accuracy"] if history else 0.0}
