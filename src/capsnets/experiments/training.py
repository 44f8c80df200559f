"""What the experiments share for training: models trained through the engine's :func:`~capsnets.engine.fit`
on tensors that already live on the device (generated data sets that the engine's trainer does not know), and
kept in a checkpoint folder between runs.

- :func:`train_classifier`: Adam with a per-epoch exponential learning-rate decay, an optional time limit;
  :func:`train_to_accuracy` stops it at a validation target, :func:`fit_or_load` adds the checkpoint folder.
- :func:`load_or_train`: load a model from ``checkpoint_dir`` or train and save it; with a
  :class:`~capsnets.engine.TrainState`, a training that its time limit cut short is continued by the next run.
- :func:`evaluate_accuracy`: the fraction a model gets right (the engine's :func:`~capsnets.engine.evaluate`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from capsnets.engine.evaluate import accuracy as evaluate_accuracy
from capsnets.engine.fit import TrainState, fit, save_state, training_step
from capsnets.engine.runtime import resolve_amp
from capsnets.io import load_checkpoint, recover_directory
from capsnets.losses import create_loss
from capsnets.models.hub import restore_model

__all__ = ["TensorBatches", "TrainingState", "checkpoint_name", "default_loss_fn",
           "epochs_trained", "evaluate_accuracy", "fit_or_load", "load_or_train", "minutes_to_seconds",
           "recording_cut_short", "train_classifier", "train_to_accuracy"]

_log = logging.getLogger(__name__)
#: while :func:`recording_cut_short` runs: the list to which :func:`load_or_train` adds each training it
#: leaves unfinished
_CUT_SHORT: ContextVar[list[str] | None] = ContextVar("capsnets_cut_short", default=None)
#: the name under which the experiments first knew :class:`~capsnets.engine.TrainState`
TrainingState = TrainState

Targets = Tensor | tuple[Tensor, ...]
LossFn = Callable[[nn.Module, Tensor, Any], Tensor]


def _take(targets: Targets, index: Tensor | slice) -> Targets:
    return tuple(t[index] for t in targets) if isinstance(targets, tuple) else targets[index]


def default_loss_fn(model: nn.Module) -> LossFn:
    """``loss(model, images, labels)`` with the model's default loss (margin + reconstruction, or CE)."""
    criterion = create_loss(getattr(model, "default_loss", "cross_entropy"))

    def loss(model: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
        return criterion(model(images, labels), images, labels)[0]

    return loss


class TensorBatches:
    """``(images, targets)`` batches of tensors on one device, for :func:`~capsnets.engine.fit`: shuffled every
    epoch by a CPU generator seeded from ``(seed, epoch)``, which then draws ``augment``'s randomness too.

    Args:
        images: ``(N, C, H, W)``; targets: ``(N, ...)`` tensor or tuple of such tensors.
        epoch_data: instead (pass None for both), ``epoch -> (images, targets)`` called before each 1-based
            epoch, e.g. to draw a fresh generated set every epoch.
        augment: optional ``(images, generator) -> images`` applied to each batch.
    """

    def __init__(self, images: Tensor | None, targets: Targets | None, batch_size: int, *, seed: int = 0,
                 augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
                 epoch_data: Callable[[int], tuple[Tensor, Targets]] | None = None) -> None:
        if (epoch_data is None) == (images is None):
            raise ValueError("pass either images and targets or epoch_data")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.images, self.targets, self.batch_size, self.seed = images, targets, batch_size, seed
        self.augment, self.epoch_data = augment, epoch_data

    def set_epoch(self, epoch: int) -> None:
        if self.epoch_data is not None:
            self.images, self.targets = self.epoch_data(epoch + 1)
        self.generator = torch.Generator().manual_seed(self.seed * 1000 + epoch + 1)
        self.order = torch.randperm(len(self.images), generator=self.generator).to(self.images.device)

    def __len__(self) -> int:
        return -(-len(self.images) // self.batch_size)

    def iter_from(self, first: int) -> Iterator[tuple[Tensor, Targets]]:
        for k, start in enumerate(range(0, len(self.images), self.batch_size)):
            index = self.order[start:start + self.batch_size]
            images = self.images[index]
            if self.augment is not None:  # also for skipped batches: the generator then stands where it stood
                images = self.augment(images, self.generator)
            if k >= first:
                yield images, _take(self.targets, index)


def train_classifier(model: nn.Module, images: Tensor | None, targets: Targets | None, *,
                     epoch_data: Callable[[int], tuple[Tensor, Targets]] | None = None, loss_fn: LossFn | None = None,
                     epochs: int = 1, batch_size: int = 128, lr: float = 1e-3, lr_decay: float = 0.96,
                     seed: int = 0, augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
                     desc: str = "train", progress: bool = True, amp: str = "auto",
                     after_epoch: Callable[[dict[str, Any]], bool] | None = None,
                     time_limit_s: float | None = None, state: TrainState | None = None) -> list[dict[str, Any]]:
    """Train ``model`` in place with Adam and a per-epoch exponential learning-rate decay.

    Batches are cut on the device holding the data (:class:`TensorBatches`); the model must already be there.

    Args:
        images, targets, epoch_data, augment: the training data (see :class:`TensorBatches`).
        loss_fn: ``loss_fn(model, images, targets) -> scalar``; default :func:`default_loss_fn`.
        amp: ``"auto"`` (bf16 autocast for the forward pass and loss on CUDA, full precision elsewhere),
            ``"bf16"`` or ``"off"``, as in the trainer.
        after_epoch: called with each epoch's record (it may add entries to it, e.g. a validation score);
            returning True ends training after that epoch.
        time_limit_s: wall-clock budget in seconds: training ends after the first epoch that ends past it,
            and that epoch's record gets ``"time_limit": True``.
        state: a :class:`~capsnets.engine.TrainState` to record progress in. If :func:`load_or_train` has put an
            unfinished checkpoint in it, training continues from there with its optimizer, scheduler and RNG
            state (the weights are restored by :func:`load_or_train`), ending where an uninterrupted run would.

    Returns:
        the records (:func:`~capsnets.engine.fit`) of the epochs trained in this call, one per epoch.
    """
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative int, got {epochs!r}")
    batches = TensorBatches(images, targets, batch_size, seed=seed, augment=augment, epoch_data=epoch_data)
    loss_fn = loss_fn or default_loss_fn(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=lr_decay)
    state = state if state is not None else TrainState()
    state.attach(optimizer, scheduler)
    device, first = next(model.parameters()).device, len(state.history)
    step = training_step(lambda batch: {"loss": loss_fn(model, *batch)}, optimizer, device=device,
                         amp_dtype=resolve_amp(amp, device), model=model)
    fit(step, batches, epochs=epochs, state=state, schedulers=[scheduler], time_limit_s=time_limit_s, desc=desc,
        progress=progress, on_evaluation=None if after_epoch is None else lambda record, final: after_epoch(record))
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

    def score(record: dict) -> bool:
        record["val_accuracy"] = evaluate_accuracy(model, val_images, val_labels)
        return record["val_accuracy"] >= target

    history = train_classifier(model, images, labels, epochs=max_epochs, batch_size=batch_size, lr=lr,
                               lr_decay=lr_decay, seed=seed, augment=augment, desc=desc, progress=False,
                               after_epoch=score, time_limit_s=time_limit_s, state=state)
    return {"epochs": len(history), "val_accuracy": history[-1]["val_accuracy"] if history else 0.0,
            "history": history, "time_limit": bool(history and history[-1].get("time_limit"))}


def fit_or_load(model: nn.Module, key: str, checkpoint_dir, images: Tensor, labels: Tensor, val_images: Tensor,
                val_labels: Tensor, **train_args) -> dict:
    """:func:`train_to_accuracy`, or ``checkpoint_dir/<key>.safetensors`` from an earlier run (its training
    record is kept in the checkpoint's sidecar and read back). A training cut short by ``time_limit_s`` is
    continued by the next run with the same ``checkpoint_dir``.

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
    loaded = load_or_train(model, key, train, checkpoint_dir=checkpoint_dir, state=state, recipe=recipe)
    history = state.history
    if loaded:
        return {"epochs": f"{len(history)} (loaded)" if history else "loaded", "trained_epochs": len(history) or None,
                "history": history, "val_accuracy": evaluate_accuracy(model, val_images, val_labels)}
    return {"epochs": epochs_trained(history, train_args["max_epochs"]), "trained_epochs": len(history),
            "history": history, "val_accuracy": history[-1]["val_accuracy"] if history else 0.0}


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


def checkpoint_name(base: str, args: dict[str, Any] | None) -> str:
    """``base``, or ``base_<8 hex digits>`` (a hash of ``args``) for a model built with extra builder arguments:
    runs with other arguments keep their own checkpoints in the same ``--checkpoint-dir``."""
    if not args:
        return base
    return f"{base}_{hashlib.sha1(json.dumps(args, sort_keys=True).encode()).hexdigest()[:8]}"


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
    path = Path(checkpoint_dir) / f"{name}.safetensors" if checkpoint_dir is not None else None
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
        restore_model(model, checkpoint)
        model.eval()
        for key, value in (meta or {}).items():
            if isinstance(value, list) and isinstance(checkpoint.meta.get(key), list):
                value[:] = checkpoint.meta[key]
        if state is None or (checkpoint.meta.get("training") or {}).get("finished", True):
            if state is not None:
                state.load(TrainState.from_meta(checkpoint.meta))
            if meta is not None:
                meta.update({k: v for k, v in checkpoint.meta.items()
                             if k not in meta and k not in ("model", "model_args", "training", "recipe")})
            return True
        try:
            state.load(TrainState.from_meta(checkpoint.meta))
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err
        state.checkpoint = checkpoint
        _log.info("%s: continuing the training its time limit cut short after %d epochs (%s)", name, state.epoch,
                  path)
    train()
    unfinished = state is not None and not state.finished
    if unfinished and _CUT_SHORT.get() is not None:
        _CUT_SHORT.get().append(name)
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


@contextlib.contextmanager
def recording_cut_short() -> Iterator[list[str]]:
    """Within the block, :func:`load_or_train` adds to the yielded list the name of each training that it
    leaves unfinished (cut short by its time limit; a later run can continue it)."""
    names: list[str] = []
    token = _CUT_SHORT.set(names)
    try:
        yield names
    finally:
        _CUT_SHORT.reset(token)
