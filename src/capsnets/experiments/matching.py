"""Training a model until its error on one test set matches a target: the rule by which the viewpoints
experiment compares models at equal familiar-view error (Hinton, Sabour & Frosst 2018, Sec. 5.2: "We
stopped training the capsule model when its performance on the familiar viewpoints matched the baseline
CNN").

- :func:`train_matched`: train, score on the familiar views a few times per epoch, keep the chosen
  evaluation; a training its time limit cut short can be continued by a later process.
- :func:`error_rate`: the fraction of a data set a model gets wrong.
"""
from __future__ import annotations

import copy
import math
import time

import torch
from torch import nn

from capsnets.data import DeviceLoader, TensorData
from capsnets.engine.runtime import autocast, resolve_amp
from capsnets.experiments.training import TrainingState, check_time_limit, evaluate_accuracy
from capsnets.losses import create_loss

__all__ = ["train_matched", "error_rate"]


def error_rate(model: nn.Module, data: TensorData) -> float:
    """The fraction of ``data`` that ``model`` gets wrong."""
    return 1.0 - evaluate_accuracy(model, data.images, data.labels)


def train_matched(model: nn.Module, views: dict[str, TensorData], *, epochs: int, target: float | None,
                  batch_size: int, lr: float, lr_decay: float = 0.96, seed: int = 0, amp: str = "auto",
                  evals_per_epoch: int = 1, time_limit_s: float | None = None, novel_every: int = 1,
                  state: TrainingState | None = None, compile: bool = False) -> dict:
    """Train ``model`` on ``views["train"]`` (with its ``augment``), scoring it on ``views["familiar"]``
    ``evals_per_epoch`` times per epoch (evenly spaced, the last at the end of the epoch), and leave it at the
    chosen evaluation.

    ``views["novel"]`` is scored at every ``novel_every``-th evaluation (0: none) and always at the chosen
    one, after training: it is only recorded (for the curves), never used to choose, and on the viewpoint
    sets it is twice the size of the familiar part, so scoring it less often saves most of the evaluation
    time. Evaluations without it have ``novel_error`` None.

    Chosen evaluation: with ``target=None``, the lowest familiar-view error (first of ties); else the first
    whose familiar-view error is ``<= target`` (training stops there), or, if none is, the one nearest to
    ``target``. Losses with ``set_progress`` (spread loss) see the fraction of ``epochs`` done.
    ``amp``: autocast of the training forward pass and loss, as in the trainer (``"auto"``: bf16 on CUDA).
    ``time_limit_s``: training also stops at the first evaluation past that many seconds (``"time_limit"``
    in the result says whether it did). ``state``: a :class:`~capsnets.experiments.training.TrainingState`;
    training stopped by the time limit records in it what a later process needs to continue from that
    evaluation (the weights it stopped at, the step, the chosen evaluation so far), and a state that
    :func:`~capsnets.experiments.training.load_or_train` filled from such a checkpoint is continued, the
    returned history then including the earlier runs' evaluations. ``compile``: run the training steps'
    forward passes through ``torch.compile(model)`` (same weights; scoring stays eager, so evaluation batches
    cost no compilation).

    Returns:
        ``{"history": [{"epoch", "step", "loss", "familiar_error", "novel_error"}, ...], "epoch",
        "familiar_error", "novel_error", "reached", "time_limit"}`` (``epoch`` and the two errors are the
        chosen evaluation's). ``epoch`` counts the epochs done: a whole number at the end of an epoch, a
        fraction within one; ``loss`` is the mean training loss since the previous evaluation; ``step``
        counts optimiser steps.
    """
    if evals_per_epoch < 1:
        raise ValueError(f"evals_per_epoch must be >= 1, got {evals_per_epoch}")
    if isinstance(novel_every, bool) or not isinstance(novel_every, int) or novel_every < 0:
        raise ValueError(f"novel_every must be an integer >= 0 (0: only at the chosen evaluation), got {novel_every!r}")
    criterion = create_loss(getattr(model, "default_loss", "cross_entropy"))
    forward = torch.compile(model) if compile else model  # shares the parameters: train, score, save ``model``
    loader = DeviceLoader(views["train"], batch_size, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=lr_decay)
    steps, amp_dtype = max(len(loader), 1), resolve_amp(amp, views["train"].device)
    # the steps (1-based, within an epoch) after which the model is scored; the last is the end of the epoch
    checks = sorted({max(1, round(steps * k / evals_per_epoch)) for k in range(1, evals_per_epoch + 1)})
    check_time_limit(time_limit_s)
    history, best, best_state, reached, done = [], None, None, False, 0
    first_epoch, first_step = 1, 0  # where training starts: (1, 0), or where a continued run stopped
    checkpoint = state.attach(optimizer, scheduler) if state is not None else None
    if checkpoint is not None:
        first_epoch, first_step, done, history, best, best_state = _continue_matched(model, state, checkpoint,
                                                                                     target, steps)
    began, out_of_time = time.perf_counter(), False
    total = torch.zeros((), dtype=torch.float64, device=views["train"].device)
    seen = 0
    for epoch in range(first_epoch, epochs + 1):
        if state is not None:
            state.epoch = epoch  # the last epoch begun
        model.train()
        loader.set_epoch(epoch)
        skip = first_step if epoch == first_epoch else 0
        for step, (images, labels) in enumerate(loader.iter_from(skip), start=skip + 1):
            if hasattr(criterion, "set_progress"):
                criterion.set_progress((epoch - 1 + (step - 1) / steps) / epochs)
            with autocast(views["train"].device, amp_dtype):
                loss = criterion(forward(images, labels), images, labels)[0]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done += 1
            total += loss.detach().double() * len(labels)
            seen += len(labels)
            if step not in checks:
                continue
            mean = total.item() / max(seen, 1)
            if not math.isfinite(mean):
                raise FloatingPointError(f"training loss is {mean} in epoch {epoch}; lower the learning rate")
            novel = novel_every and (len(history) + 1) % novel_every == 0
            record = {"epoch": epoch if step == steps else round(epoch - 1 + step / steps, 4), "step": done,
                      "loss": mean, "familiar_error": error_rate(model, views["familiar"]),
                      "novel_error": error_rate(model, views["novel"]) if novel else None}
            total.zero_()
            seen = 0
            history.append(record)
            reached = target is not None and record["familiar_error"] <= target
            score = record["familiar_error"] if target is None else abs(record["familiar_error"] - target)
            if reached or best is None or score < best[0]:
                best, best_state = (score, record), copy.deepcopy(model.state_dict())
            last = epoch == epochs and step == steps  # training ends here anyway: not cut short
            out_of_time = time_limit_s is not None and not last and time.perf_counter() - began >= time_limit_s
            if reached or out_of_time:
                break
        if reached or out_of_time:
            break
        scheduler.step()
    if state is not None:
        state.finished = not (out_of_time and not reached)
        if not state.finished:  # what a later run needs to continue from this evaluation
            if step == steps:  # stopped at the end of an epoch: take the learning-rate step it would take
                scheduler.step()
            state.position = {"step": step, "done": done, "best": next(i for i, r in enumerate(history)
                                                                       if r is best[1])}
            state.tensors = {f"last.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    chosen = best[1] if best else {"epoch": 0, "familiar_error": error_rate(model, views["familiar"]),
                                   "novel_error": None}
    if chosen["novel_error"] is None:  # the chosen state was restored above; the record is in ``history``
        chosen["novel_error"] = error_rate(model, views["novel"])
    return {"history": history, "epoch": chosen["epoch"], "familiar_error": chosen["familiar_error"],
            "novel_error": chosen["novel_error"], "reached": reached, "time_limit": out_of_time and not reached}


def _continue_matched(model: nn.Module, state: TrainingState, checkpoint, target: float | None,
                      steps: int) -> tuple:
    """Restore what :func:`train_matched` recorded when its time limit stopped it (optimizer, scheduler and
    RNG are restored by ``state.attach``): the weights it stopped at (``model`` holds the chosen ones, which
    become the best state so far), history and position. Returns ``(epoch, step to start after, optimiser
    steps done, history, best, best_state)``."""
    position = state.position
    history = [dict(record) for record in checkpoint.meta.get("history") or []]
    chosen = history[position["best"]]
    score = chosen["familiar_error"] if target is None else abs(chosen["familiar_error"] - target)
    best, best_state = (score, chosen), copy.deepcopy(model.state_dict())
    model.load_state_dict({k[len("extra.last."):]: v for k, v in checkpoint.tensors.items()
                           if k.startswith("extra.last.")})
    epoch, step = state.epoch, position["step"]
    if step >= steps:  # it stopped at the end of an epoch (and took that epoch's learning-rate step)
        epoch, step = epoch + 1, 0
    return epoch, step, position["done"], history, best, best_state
