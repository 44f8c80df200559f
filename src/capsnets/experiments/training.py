"""Training and scoring models on tensors that already live on the device (generated data sets that the
engine's trainer does not know), and keeping them in a checkpoint folder between runs.

- :func:`train_classifier`: Adam with a per-epoch exponential learning-rate decay, an optional time limit.
- :func:`evaluate_accuracy`: the fraction a model gets right, batch by batch.
- :func:`load_or_train`: load a model from ``checkpoint_dir`` or train and save it; with a
  :class:`TrainingState`, a training that its time limit cut short is continued by the next run.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from capsnets.engine.runtime import autocast, resolve_amp, restore_rng_state

_log = logging.getLogger(__name__)
#: while :func:`recording_cut_short` runs: the list to which :func:`load_or_train` adds each training it
#: leaves unfinished
_CUT_SHORT: ContextVar[list[str] | None] = ContextVar("capsnets_cut_short", default=None)

Targets = Tensor | tuple[Tensor, ...]
LossFn = Callable[[nn.Module, Tensor, Any], Tensor]


def _take(targets: Targets, index: Tensor | slice) -> Targets:
    return tuple(t[index] for t in targets) if isinstance(targets, tuple) else targets[index]


def default_loss_fn(model: nn.Module) -> LossFn:
    """``loss(model, images, labels)`` with the model's default loss (margin + reconstruction, or CE)."""
    from capsnets.losses import create_loss

    criterion = create_loss(getattr(model, "default_loss", "cross_entropy"))

    def loss(model: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
        return criterion(model(images, labels), images, labels)[0]

    return loss


@dataclass
class TrainingState:
    """The optimiser side of a :func:`train_classifier` run, kept so that a run its time limit cut short can be
    continued by a later process: pass the same object to :func:`train_classifier` and :func:`load_or_train`,
    which saves it with the model and, on the next run, hands the checkpoint back to continue from.

    Attributes:
        epoch: epochs done so far (over every run that trained this model).
        finished: False while the training was cut short by its time limit and can be continued.
        optimizer, scheduler: set by the training loop through :meth:`attach` (for the checkpoint).
        checkpoint: set by :func:`load_or_train` to the unfinished checkpoint that the next training loop
            continues from; :meth:`attach` restores its optimizer, scheduler and RNG state.
        position: JSON-safe entries another training loop needs to continue (saved in the sidecar's
            ``training`` entry beside ``epoch`` and ``finished``), e.g. the step within the epoch.
        tensors: tensors another training loop needs to continue, e.g. the weights it stopped at when the
            model itself holds an earlier, chosen state (saved as the checkpoint's ``extra.*`` tensors).
    """

    epoch: int = 0
    finished: bool = True
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    checkpoint: Any = None
    position: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, Tensor] = field(default_factory=dict)

    def attach(self, optimizer: torch.optim.Optimizer, scheduler: Any = None):
        """Called by a training loop once it has built its optimizer (and scheduler): keeps them for the
        checkpoint and, when continuing, loads their state and the RNG state from :attr:`checkpoint`.
        Returns that checkpoint (the loop may read its own entries from it), or None for a fresh start."""
        self.optimizer, self.scheduler = optimizer, scheduler
        checkpoint, self.checkpoint = self.checkpoint, None
        if checkpoint is not None:
            from capsnets.engine.checkpoint import restore_training

            restore_training(checkpoint, optimizer, scheduler)
            restore_rng_state(checkpoint.tensors)
        return checkpoint


def train_classifier(model: nn.Module, images: Tensor | None, targets: Targets | None, *,
                     epoch_data: Callable[[int], tuple[Tensor, Targets]] | None = None, loss_fn: LossFn | None = None,
                     epochs: int = 1, batch_size: int = 128, lr: float = 1e-3, lr_decay: float = 0.96,
                     seed: int = 0, augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
                     desc: str = "train", progress: bool = True, amp: str = "auto",
                     after_epoch: Callable[[dict[str, Any]], bool] | None = None,
                     time_limit_s: float | None = None,
                     state: TrainingState | None = None) -> list[dict[str, float]]:
    """Train ``model`` in place with Adam and a per-epoch exponential learning-rate decay.

    Batches are cut on the device holding ``images`` (shuffled by a CPU generator seeded from
    ``(seed, epoch)``); the model must already be there.

    Args:
        images: ``(N, C, H, W)`` training images.
        targets: ``(N, ...)`` tensor or tuple of such tensors, batched together with ``images``.
        epoch_data: instead of ``images, targets`` (pass None for both), ``epoch -> (images, targets)``
            called before each (1-based) epoch, e.g. to draw a fresh generated set every epoch.
        loss_fn: ``loss_fn(model, images, targets) -> scalar``; default :func:`default_loss_fn`.
        augment: optional ``(images, generator) -> images`` applied to each batch.
        amp: ``"auto"`` (bf16 autocast for the forward pass and loss on CUDA, full precision elsewhere),
            ``"bf16"`` or ``"off"``, as in the trainer.
        after_epoch: called with each epoch's record (it may add entries to it, e.g. a validation score);
            returning True ends training after that epoch.
        time_limit_s: wall-clock budget in seconds: training ends after the first epoch (``after_epoch``
            included) that ends past it, and that epoch's record gets ``"time_limit": True``. For runs on
            machines lent for a fixed time; the caller should report how many epochs were trained.
        state: a :class:`TrainingState` to record progress in. If :func:`load_or_train` has put an unfinished
            checkpoint in it, training continues from that checkpoint's epoch with its optimizer, scheduler
            and RNG state (the model's weights are restored by :func:`load_or_train`), so a run continued in
            another process ends where an uninterrupted one would.

    Returns:
        one ``{"epoch", "loss", "lr", "time_s"}`` dict per epoch trained in this call.
    """
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative int, got {epochs!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    check_time_limit(time_limit_s)
    loss_fn = loss_fn or default_loss_fn(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=lr_decay)
    if (epoch_data is None) == (images is None):
        raise ValueError("pass either images and targets or epoch_data")
    first_epoch = 1
    if state is not None and state.attach(optimizer, scheduler) is not None:
        first_epoch = state.epoch + 1
    history, began = [], time.perf_counter()
    model.train()
    for epoch in range(first_epoch, epochs + 1):
        if epoch_data is not None:
            images, targets = epoch_data(epoch)
        count, amp_dtype = len(images), resolve_amp(amp, images.device)
        generator = torch.Generator().manual_seed(seed * 1000 + epoch)
        order = torch.randperm(count, generator=generator).to(images.device)
        total = torch.zeros((), dtype=torch.float64, device=images.device)
        start = time.perf_counter()
        steps = range(0, count, batch_size)
        for first in tqdm(steps, desc=f"{desc} epoch {epoch}", leave=False, disable=None if progress else True):
            index = order[first:first + batch_size]
            batch = images[index] if augment is None else augment(images[index], generator)
            with autocast(images.device, amp_dtype):
                loss = loss_fn(model, batch, _take(targets, index))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach().double() * len(index)
        mean = total.item() / max(count, 1)
        if not math.isfinite(mean):
            raise FloatingPointError(f"{desc}: training loss is {mean} in epoch {epoch}; lower the learning rate")
        history.append({"epoch": epoch, "loss": mean, "lr": scheduler.get_last_lr()[0],
                        "time_s": time.perf_counter() - start})
        scheduler.step()
        if state is not None:
            state.epoch = epoch
        if after_epoch is not None:
            stop = after_epoch(history[-1])
            model.train()
            if stop:
                break
        if time_limit_s is not None and epoch < epochs and time.perf_counter() - began >= time_limit_s:
            history[-1]["time_limit"] = True
            break
    if state is not None:
        state.finished = not (history and history[-1].get("time_limit"))
    model.eval()
    return history


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0  # NaN is not > 0


def check_time_limit(time_limit_s: float | None) -> None:
    """Refuse a training time limit that is not a positive number of seconds (None means no limit)."""
    if time_limit_s is not None and not _positive_number(time_limit_s):
        raise ValueError(f"the training time limit must be a positive number of seconds (or None), "
                         f"got {time_limit_s!r}; the experiments take it as train_minutes")


def minutes_to_seconds(minutes: float | None) -> float | None:
    """The ``train_minutes`` setting of an experiment as :func:`train_classifier`'s ``time_limit_s``."""
    if minutes is not None and not _positive_number(minutes):
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


@torch.no_grad()
def evaluate_accuracy(model: nn.Module, images: Tensor, targets: Targets, *, batch_size: int = 256,
                      correct: Callable[[Any, Any], Tensor] | None = None) -> float:
    """Fraction of examples the model gets right, in eval mode, batch by batch in stored order.

    Args:
        correct: ``correct(output, batch_targets) -> (B,) bool``; default
            ``output.scores.argmax(-1) == labels``.
    """
    correct = correct or (lambda output, labels: output.scores.argmax(dim=-1) == labels)
    was_training = model.training
    model.eval()
    hits = torch.zeros((), dtype=torch.long, device=images.device)
    try:
        for first in range(0, len(images), batch_size):
            output = model(images[first:first + batch_size])
            hits += correct(output, _take(targets, slice(first, first + batch_size))).sum()
    finally:
        model.train(was_training)
    return hits.item() / max(len(images), 1)


def checkpoint_name(base: str, args: dict[str, Any] | None) -> str:
    """``base``, or ``base_<8 hex digits>`` (a hash of ``args``) for a model built with extra builder arguments:
    runs with other arguments keep their own checkpoints in the same ``--checkpoint-dir``."""
    if not args:
        return base
    return f"{base}_{hashlib.sha1(json.dumps(args, sort_keys=True).encode()).hexdigest()[:8]}"


def load_or_train(model: nn.Module, name: str, train: Callable[[], Any], *,
                  checkpoint_dir: str | os.PathLike | None, meta: dict[str, Any] | None = None,
                  state: TrainingState | None = None, recipe: dict[str, Any] | None = None) -> bool:
    """Load ``checkpoint_dir/<name>.safetensors`` into ``model`` if it exists, else call ``train()``
    and save the model there (when ``checkpoint_dir`` is given). Returns True when it was loaded (and not
    trained further).

    ``meta``: extra entries for the checkpoint's sidecar, taken after ``train()`` (so ``train`` may fill
    them). When the model is loaded, every list in ``meta`` is filled in place from the sidecar's entry of
    the same key (e.g. a training ``history`` the caller's report reads), and when it is loaded as finished
    (True is returned), ``meta`` also gets the sidecar's other entries (what ``train()`` recorded then), so the
    caller need not read the checkpoint again.

    ``state``: the :class:`TrainingState` that ``train()`` passes to :func:`train_classifier`. With it, a
    training cut short by its time limit is saved with its optimizer, scheduler and RNG state, and a later
    run that finds that checkpoint continues it (``train()`` is called again, and ``meta``'s lists already
    hold the earlier runs' entries) instead of taking the model as finished.

    ``recipe``: the settings that decide what ``train()`` does (epochs, learning rate, data sizes, seed...;
    not a time limit), kept in the sidecar. A checkpoint trained with another recipe is refused with an
    error naming the settings that differ, rather than loaded as if this run had trained it (checkpoints
    written without a recipe are loaded as they are)."""
    from capsnets.engine.checkpoint import load_checkpoint, restore_model, save_checkpoint

    path = Path(checkpoint_dir) / f"{name}.safetensors" if checkpoint_dir is not None else None
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
        progress = checkpoint.meta.get("training") or {}
        if state is None or progress.get("finished", True):
            if meta is not None:
                meta.update({k: v for k, v in checkpoint.meta.items()
                             if k not in meta and k not in ("model", "model_args", "training", "recipe")})
            return True
        state.epoch, state.checkpoint = int(progress["epoch"]), checkpoint
        state.position = {k: v for k, v in progress.items() if k not in ("epoch", "finished")}
        _log.info("%s: continuing the training its time limit cut short in epoch %d (%s)", name, state.epoch, path)
    train()
    unfinished = state is not None and not state.finished
    if unfinished and _CUT_SHORT.get() is not None:
        _CUT_SHORT.get().append(name)
    if path is not None:
        extra = {} if state is None else {"training": {**(state.position if unfinished else {}),
                                                       "epoch": state.epoch, "finished": state.finished}}
        save_checkpoint(path, model=model, meta={"model": getattr(model, "model_name", name),
                                                 "model_args": getattr(model, "model_args", {}),
                                                 **(meta or {}), **extra,
                                                 **({"recipe": _jsonable(recipe)} if recipe is not None else {})},
                        optimizer=state.optimizer if unfinished else None,
                        scheduler=state.scheduler if unfinished else None,
                        extra_tensors=state.tensors if unfinished else None)
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
