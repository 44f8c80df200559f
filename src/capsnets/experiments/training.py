"""How the experiments train: through the engine's one loop, :func:`~capsnets.engine.fit`, with its callbacks
(:mod:`capsnets.engine.callbacks`), on tensors that already live on the device
(:class:`~capsnets.data.DeviceLoader`, as the trainer's). Where the trained models are kept between runs is
:mod:`capsnets.experiments.checkpoints`.

- :func:`train_classifier`: Adam with a per-epoch exponential learning-rate decay
  (:func:`~capsnets.engine.adam_with_decay`, as the trainer) and an optional time limit
  (:class:`~capsnets.engine.TimeLimit`); :func:`train_to_accuracy` stops it at a validation target
  (:class:`~capsnets.engine.Target`).
- :func:`epochs_trained`, :func:`minutes_to_seconds`: a training's length as a report states it, and the
  experiments' ``train_minutes`` setting as a time limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from capsnets.data.device import DeviceLoader, Targets
from capsnets.engine.callbacks import Hook, Target, TimeLimit
from capsnets.engine.evaluate import accuracy as evaluate_accuracy
from capsnets.engine.fit import TrainState, adam_with_decay, fit, training_step
from capsnets.engine.runtime import resolve_amp
from capsnets.losses import create_loss
from capsnets.validation import non_negative_int

__all__ = [
    "default_loss_fn",
    "epochs_trained",
    "evaluate_accuracy",
    "minutes_to_seconds",
    "train_classifier",
    "train_to_accuracy",
]

_log = logging.getLogger(__name__)

LossFn = Callable[[nn.Module, Tensor, Any], Tensor]


def default_loss_fn(model: nn.Module) -> LossFn:
    """``loss(model, images, labels)`` with the model's default loss (margin + reconstruction, or CE)."""
    criterion = create_loss(getattr(model, "default_loss", "cross_entropy"))

    def loss(model: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
        return criterion(model(images, labels), images, labels)[0]

    return loss


def train_classifier(
    model: nn.Module,
    images: Tensor | None,
    targets: Targets | None,
    *,
    epoch_data: Callable[[int], tuple[Tensor, Targets]] | None = None,
    loss_fn: LossFn | None = None,
    epochs: int = 1,
    batch_size: int = 128,
    lr: float = 1e-3,
    lr_decay: float = 0.96,
    seed: int = 0,
    augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
    desc: str = "train",
    progress: bool = True,
    amp: str = "auto",
    after_epoch: Callable[[dict[str, Any]], bool] | None = None,
    time_limit_s: float | None = None,
    state: TrainState | None = None,
    callbacks: Sequence[Any] = (),
) -> list[dict[str, Any]]:
    """Train ``model`` in place with Adam and a per-epoch exponential learning-rate decay.

    Batches are cut on the device holding the data (:class:`~capsnets.data.DeviceLoader`); the model
    must already be there.

    Args:
        images, targets, epoch_data, augment: the training data (see
            :class:`~capsnets.data.DeviceLoader`).
        loss_fn: ``loss_fn(model, images, targets) -> scalar``; default :func:`default_loss_fn`.
        amp: ``"auto"`` (bf16 autocast for the forward pass and loss on CUDA, full precision elsewhere),
            ``"bf16"`` or ``"off"``, as in the trainer.
        after_epoch: called with each epoch's record (it may add entries to it, e.g. a validation score);
            returning True ends training after that epoch.
        time_limit_s: wall-clock budget in seconds: training ends after the first epoch that ends past it,
            and that epoch's record gets ``"time_limit": True``.
        callbacks: further :class:`~capsnets.engine.callbacks.Callback` objects, called after ``after_epoch``.
        state: a :class:`~capsnets.engine.TrainState` to record progress in. If
            :func:`~capsnets.experiments.checkpoints.load_or_train` has put an unfinished checkpoint in it,
            training continues from there with its optimizer, scheduler and RNG state (the weights are restored
            by ``load_or_train``), ending where an uninterrupted run would.

    Returns:
        the records (:func:`~capsnets.engine.fit`) of the epochs trained in this call, one per epoch.
    """
    non_negative_int("epochs", epochs)
    data = None if epoch_data is not None else (images, targets)
    batches = DeviceLoader(data, batch_size, seed=seed, augment=augment or False, epoch_data=epoch_data)
    loss_fn = loss_fn or default_loss_fn(model)
    optimizer, scheduler = adam_with_decay(model.parameters(), lr=lr, lr_decay=lr_decay)
    state = state if state is not None else TrainState()
    state.attach(optimizer, scheduler)
    device, first = next(model.parameters()).device, len(state.history)
    step = training_step(
        lambda batch: {"loss": loss_fn(model, *batch)},
        optimizer,
        device=device,
        amp_dtype=resolve_amp(amp, device),
        model=model,
    )
    hooks = [
        TimeLimit(time_limit_s),
        *([Hook(lambda record, final: after_epoch(record))] if after_epoch else []),
        *callbacks,
    ]
    fit(
        step, batches, epochs=epochs, state=state, schedulers=[scheduler], callbacks=hooks, desc=desc, progress=progress
    )
    model.eval()
    return state.history[first:]


def train_to_accuracy(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    val_images: Tensor,
    val_labels: Tensor,
    *,
    target: float,
    max_epochs: int,
    lr: float = 1e-3,
    lr_decay: float = 0.96,
    batch_size: int = 128,
    seed: int = 0,
    augment: Callable | None = None,
    desc: str = "train",
    time_limit_s: float | None = None,
    state: TrainState | None = None,
) -> dict:
    """Train (one run of :func:`train_classifier`: Adam, learning rate ``lr * lr_decay ** (epoch - 1)``) until
    the validation accuracy, scored after every epoch, reaches ``target`` or ``max_epochs`` pass (or, with
    ``time_limit_s``, the first epoch that ends past that many seconds of training).

    Returns:
        ``{"epochs", "val_accuracy", "history", "time_limit"}`` (``history``: one record per epoch trained in
        this call, with its ``val_accuracy``).
    """
    score = Target(lambda: evaluate_accuracy(model, val_images, val_labels), target, key="val_accuracy")
    history = train_classifier(
        model,
        images,
        labels,
        epochs=max_epochs,
        batch_size=batch_size,
        lr=lr,
        lr_decay=lr_decay,
        seed=seed,
        augment=augment,
        desc=desc,
        progress=False,
        callbacks=[score],
        time_limit_s=time_limit_s,
        state=state,
    )
    return {
        "epochs": len(history),
        "val_accuracy": history[-1]["val_accuracy"] if history else 0.0,
        "history": history,
        "time_limit": bool(history and history[-1].get("time_limit")),
    }


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
