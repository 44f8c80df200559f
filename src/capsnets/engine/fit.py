"""The one training loop: :func:`fit` runs a step function over batches, with evaluation points and
callbacks (:mod:`capsnets.engine.callbacks`), and a :class:`TrainState` from which a later process continues
exactly.

A way of training is a *step function* plus *callbacks* (as in Lightning's ``fit``):

- ``step(batch) -> {name: 0-dim tensor}`` does the forward pass, backward pass and optimiser step(s) itself
  (:func:`training_step` builds one for a loss and an optimiser; a GAN's step holds two optimisers). Each value
  is a mean over the batch; the loop keeps their running means, weighted by the batch size (``len(batch[0])``).
- callbacks see each evaluation point (``evaluations_per_epoch`` per epoch, the last at the epoch's end) with
  its record, which they may extend (e.g. a test accuracy) or end the training at (a target reached, a time
  limit passed); see :class:`~capsnets.engine.callbacks.Callback`.

Running sums stay on the device; the host reads them every ``check_every`` steps and at evaluation points (to
check that the losses are finite and to update the progress bar), so a GPU is not synchronised every step.
Each evaluation point is logged through :mod:`logging` (logger ``capsnets.engine.fit``); the bar is tqdm's,
which stays silent when stderr is not a terminal.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from capsnets.checkpoints import CheckpointError
from capsnets.engine.checkpoint import restore_training, save_checkpoint
from capsnets.engine.distributed import DistContext, all_reduce_sum
from capsnets.engine.runtime import autocast, restore_rng_state
from capsnets.validation import ArgumentError, positive_int

__all__ = [
    "Batches",
    "NonFiniteLossError",
    "TrainState",
    "TrainingInterrupted",
    "LR_SCHEDULES",
    "adam_with_decay",
    "cosine_factor",
    "evaluation_points",
    "fit",
    "save_state",
    "training_step",
]

logger = logging.getLogger(__name__)

Step = Callable[[Any], dict[str, Tensor]]


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


class TrainingInterrupted(KeyboardInterrupt):
    """:func:`fit` stopped between two steps because ``interrupt`` asked it to (a signal), after its callbacks'
    ``on_interrupt`` (a resumable checkpoint). A ``KeyboardInterrupt``, so that code that handles Ctrl-C handles
    it too.

    Attributes:
        signum: what ``interrupt`` returned (the signal's number).
        epoch, step: where the training stopped (:class:`TrainState`'s fields).
    """

    def __init__(self, signum: int, epoch: int, step: int) -> None:
        super().__init__(f"training interrupted by signal {signum} at epoch {epoch}, step {step}")
        self.signum, self.epoch, self.step = signum, epoch, step


class Batches(Protocol):
    """What :func:`fit` iterates: :class:`~capsnets.data.DeviceLoader` is one."""

    def set_epoch(self, epoch: int) -> None: ...  # 0-based, before each epoch

    def __len__(self) -> int: ...  # batches per epoch (after set_epoch)

    def iter_from(self, first: int) -> Iterable: ...  # this epoch's batches from batch ``first`` (0-based) on


@dataclass
class TrainState:
    """Where a training stands: what a checkpoint keeps so that a later process continues it exactly.

    The first fields are saved in the checkpoint's sidecar (entry ``"training"``, see :meth:`to_dict`).

    Attributes:
        epoch: epochs finished.
        step: batches of the next epoch already trained (0 at an epoch boundary).
        steps: optimiser steps (batches) over the whole training.
        train_time_s: seconds spent in training steps (evaluation not counted), over every run.
        finished: False until the training ends, and after a time limit cut it short.
        history: one record per evaluation point (see :func:`fit`), over every run.
        best: index in ``history`` of the evaluation chosen so far (set by a hook), or None.
        extra: JSON-safe entries that a step or hook needs to continue (e.g. a second optimizer's settings).
        optimizer, scheduler: registered by :meth:`attach`; a resumable checkpoint stores them.
        tensors: further tensors a resumable checkpoint stores (as ``extra.<key>``).
        checkpoint: the checkpoint this state was read from (:func:`~capsnets.engine.callbacks.resume_state`);
            :meth:`attach` restores from it.
    """

    epoch: int = 0
    step: int = 0
    steps: int = 0
    train_time_s: float = 0.0
    finished: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)
    best: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    optimizer: Any = field(default=None, repr=False)
    scheduler: Any = field(default=None, repr=False)
    tensors: dict[str, Tensor] = field(default_factory=dict, repr=False)
    checkpoint: Any = field(default=None, repr=False)

    _SAVED = ("epoch", "step", "steps", "train_time_s", "finished", "history", "best", "extra")

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe part (a checkpoint sidecar's ``"training"`` entry)."""
        return {name: getattr(self, name) for name in self._SAVED}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> TrainState:
        """The state recorded in a checkpoint sidecar; a sidecar without one holds a finished model."""
        saved = meta.get("training")
        if saved is None:
            return cls(finished=True)
        unknown = sorted(set(saved) - set(cls._SAVED))
        if unknown:
            raise CheckpointError(
                f"the checkpoint records an unfinished training in a form this version of capsnets "
                f"does not read ({', '.join(unknown)}); delete the checkpoint to train the model again"
            )
        for name, value in saved.items():
            if not _SAVED_TYPES[name](value):
                raise CheckpointError(
                    f"the checkpoint's training.{name} is {value!r:.60}, which is not a valid value; the "
                    "checkpoint is damaged: use another checkpoint (e.g. best) or train again"
                )
        return cls(**saved)

    def load(self, other: TrainState) -> None:
        """Take over the saved fields of ``other`` (the caller's object stays the one it holds)."""
        for name in self._SAVED:
            setattr(self, name, getattr(other, name))

    def attach(self, optimizer: torch.optim.Optimizer, scheduler: Any = None):
        """Register the training's optimizer (and scheduler) for the checkpoint and, when continuing
        (:attr:`checkpoint` set), load their state and the RNG state from it. Returns that checkpoint (a
        step may read its own entries from it), or None for a fresh start."""
        self.optimizer, self.scheduler = optimizer, scheduler
        checkpoint, self.checkpoint = self.checkpoint, None
        if checkpoint is not None:
            restore_training(checkpoint, optimizer, scheduler)
            restore_rng_state(checkpoint.tensors)
        return checkpoint

    def fraction(self, steps_per_epoch: int, epochs: int) -> float:
        """The fraction of ``epochs`` trained before the current step (for a loss schedule)."""
        return (self.epoch + self.step / steps_per_epoch) / epochs


def fit(
    step: Step,
    batches: Batches,
    *,
    epochs: int,
    state: TrainState | None = None,
    schedulers: Sequence[Any] = (),
    evaluations_per_epoch: int = 1,
    callbacks: Sequence[Any] = (),
    desc: str = "train",
    progress: bool = True,
    context: DistContext | None = None,
    check_every: int = 20,
    interrupt: Callable[[], int | None] | None = None,
) -> TrainState:
    """Train until ``state.epoch == epochs`` or a callback ends the training; see the module docstring.

    Args:
        step: ``step(batch) -> {name: 0-dim tensor}``; the values are means over the batch.
        batches: the training batches (:class:`Batches`); ``set_epoch`` gets the 0-based epoch.
        epochs: epochs to train in all (over every run of a continued training).
        state: where to start (:class:`TrainState`; a continued one starts mid-epoch if it stopped there);
            updated in place and returned.
        schedulers: stepped at the end of every epoch (before the callbacks see that point), or after every step
            for one whose ``interval`` is ``"step"`` (Lightning's name); the first gives the record's ``lr``.
        evaluations_per_epoch: evaluation points per epoch, evenly spaced, the last at the epoch's end.
        callbacks: :class:`~capsnets.engine.callbacks.Callback` objects, called in this order. When one's
            ``time_up`` ends the training, that point's record gets ``"time_limit": True`` and
            ``state.finished`` stays False.
        desc: names the training in the progress bar, log lines and errors.
        progress: show a tqdm bar (only on a terminal, only on rank 0).
        context: the data-parallel group; the running sums are shared.
        check_every: steps between host-side checks of the losses.
        interrupt: ``() -> signal number or None``, asked before each step: a number stops the training there.
            The running means of the epoch so far go into ``state.extra`` (a training continued from the state
            finishes the epoch's record as if never stopped), every callback's ``on_interrupt`` is called (a
            checkpoint), and :class:`TrainingInterrupted` is raised.

    Each record holds ``epoch`` (epochs done: a whole number at an epoch's end, a fraction within one),
    ``step`` (optimiser steps done), the mean of each step value since the previous point, ``lr`` (with a
    scheduler) and ``time_s`` (training seconds since the previous point); it is appended to ``state.history``.

    Raises:
        NonFiniteLossError: a step value was NaN or infinite (naming the epoch and step).
        TrainingInterrupted: ``interrupt`` asked to stop.
    """
    positive_int("evaluations_per_epoch", evaluations_per_epoch)
    state = state if state is not None else TrainState()
    context = context or DistContext()
    stop, out_of_time = False, False
    per_step = [scheduler for scheduler in schedulers if _per_step(scheduler)]
    per_epoch = [scheduler for scheduler in schedulers if not _per_step(scheduler)]
    for callback in callbacks:
        callback.on_fit_start(state)
    while state.epoch < epochs and not (stop or out_of_time):
        batches.set_epoch(state.epoch)
        total = len(batches)
        points = evaluation_points(total, evaluations_per_epoch)
        bar = tqdm(
            total=total,
            initial=state.step,
            desc=f"{desc} epoch {state.epoch + 1}",
            leave=False,
            dynamic_ncols=True,
            disable=None if (progress and context.is_main) else True,
        )
        sums, pending, since, names = None, [], time.perf_counter(), []
        partial = state.extra.pop(_PARTIAL, None) if state.step else None
        if partial is not None:  # an interrupted epoch: its running sums and time so far
            sums, since = torch.tensor(partial["sums"], dtype=torch.float64), since - partial["time_s"]
        for batch in batches.iter_from(state.step):
            signum = interrupt() if interrupt is not None else None
            if signum is not None:
                _interrupted(state, sums, since, pending, names, desc, callbacks, signum)
            values = step(batch)
            for scheduler in per_step:
                scheduler.step()
            names = list(values)
            stacked = torch.stack([v.detach().double() for v in values.values()])
            n = stacked.new_tensor([len(batch[0])])
            addend = torch.cat([stacked * n, n])
            sums = addend if sums is None else sums.to(addend.device) + addend
            pending.append(stacked)
            state.step += 1
            state.steps += 1
            if state.step % check_every and state.step not in points:
                continue
            _check_finite(pending, list(values), desc, state.epoch + 1, state.step)
            pending.clear()
            _update_bar(bar, state.step, values, sums)
            if state.step not in points:
                continue
            record, elapsed = _point_record(state, total, values, sums, context, schedulers), time.perf_counter()
            record["time_s"] = elapsed - since
            state.train_time_s += record["time_s"]
            if state.step == total:  # the epoch's end: a checkpoint taken here starts the next epoch
                for scheduler in per_epoch:
                    scheduler.step()
                state.epoch, state.step = state.epoch + 1, 0
            last = state.epoch == epochs and state.step == 0
            out_of_time = not last and any([callback.time_up(state) for callback in callbacks])
            if out_of_time:
                record["time_limit"] = True
            state.history.append(record)
            stop = any([bool(callback.on_evaluation(state, record, last or out_of_time)) for callback in callbacks])
            if stop:
                record.pop("time_limit", None)
                out_of_time = False
            if context.is_main:
                logger.info("%s epoch %s/%d: %s", desc, f"{record['epoch']:g}", epochs, _format(record))
            if stop or out_of_time:
                break
            sums, since = None, time.perf_counter()
        bar.close()
    state.finished = not out_of_time
    for callback in callbacks:
        callback.on_fit_end(state)
    return state


#: The ``state.extra`` entry of an epoch interrupted between two steps: its running sums and training seconds.
_PARTIAL = "interrupted_epoch"


def _interrupted(state, sums, since, pending, names, desc, callbacks, signum: int):
    """Keep the epoch's running sums in ``state``, let the callbacks checkpoint it, raise TrainingInterrupted."""
    if pending:
        _check_finite(pending, names, desc, state.epoch + 1, state.step)
    if state.step:
        state.extra[_PARTIAL] = {"sums": sums.tolist(), "time_s": time.perf_counter() - since}
    for callback in callbacks:
        callback.on_interrupt(state)
    state.extra.pop(_PARTIAL, None)
    raise TrainingInterrupted(signum, state.epoch, state.step)


def save_state(path, model: nn.Module, state: TrainState, meta: dict[str, Any], *, resumable: bool = True):
    """Checkpoint ``model`` with ``state`` in its sidecar (``"training"``). A ``resumable`` checkpoint also keeps
    what a later process needs to continue: the attached optimizer and scheduler and ``state.tensors``."""
    parts = {"optimizer": state.optimizer, "scheduler": state.scheduler, "extra_tensors": state.tensors}
    return save_checkpoint(
        path, model=model, meta={**meta, "training": state.to_dict()}, **(parts if resumable else {})
    )


def training_step(
    compute: Callable[[Any], dict[str, Tensor]],
    optimizer: torch.optim.Optimizer,
    *,
    device: torch.device,
    amp_dtype: torch.dtype | None = None,
    model: nn.Module | None = None,
    frozen: Callable[[], Iterable[Tensor]] | None = None,
) -> Step:
    """A :func:`fit` step for one loss and one optimizer: ``compute(batch)`` under autocast (``amp_dtype`` on
    ``device``; None: full precision), then the backward pass of its first value and an optimizer step.

    Args:
        compute: ``batch -> {name: 0-dim tensor}``, the first entry the loss minimised.
        model: put in training mode before each step if it is not (an evaluation may have left it in eval mode).
        frozen: the parameters this step leaves as they are, asked before each step: their gradients are dropped
            before the optimizer's step (which then skips them, weight decay and moments included).
    """

    def step(batch) -> dict[str, Tensor]:
        if model is not None and not model.training:
            model.train()
        with autocast(device, amp_dtype):
            values = compute(batch)
        optimizer.zero_grad(set_to_none=True)
        next(iter(values.values())).backward()
        if frozen is not None:
            for parameter in frozen():
                parameter.grad = None
        optimizer.step()
        return values

    return step


#: The learning-rate schedules of :func:`adam_with_decay` (and ``TrainConfig.lr_schedule``).
LR_SCHEDULES = ("exponential", "cosine")


def adam_with_decay(
    parameters,
    *,
    lr: float,
    lr_decay: float | None = None,
    weight_decay: float = 0.0,
    schedule: str = "exponential",
    total_steps: int | None = None,
):
    """Adam and its learning-rate schedule. Returns ``(optimizer, scheduler)``.

    - ``"exponential"``: decayed once per epoch (Sabour et al. 2017, Sec. 4): epoch ``e`` (0-based) trains at
      ``lr * lr_decay ** e``.
    - ``"cosine"``: annealed after every step along a half cosine from ``lr`` to 0 over ``total_steps``
      (Loshchilov & Hutter 2017, without restarts): step ``t`` (0-based) trains at
      ``lr * (1 + cos(pi * t / total_steps)) / 2``, so a run of any length ends annealed. The scheduler's
      ``interval`` is ``"step"``, which :func:`fit` reads.
    """
    optimizer = torch.optim.Adam(parameters, lr=lr, weight_decay=weight_decay)
    if schedule == "exponential":
        return optimizer, torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=lr_decay)
    if schedule != "cosine":
        raise ArgumentError(f"schedule must be one of {LR_SCHEDULES}, got {schedule!r}", "schedule")
    total = positive_int("total_steps", total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: cosine_factor(t, total))
    scheduler.interval = "step"
    return optimizer, scheduler


def cosine_factor(step: int, total_steps: int) -> float:
    """The cosine schedule's share of the initial learning rate at 0-based ``step`` of ``total_steps``."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))


def _per_step(scheduler: Any) -> bool:
    return getattr(scheduler, "interval", "epoch") == "step"


def evaluation_points(steps: int, per_epoch: int) -> list[int]:
    """The 1-based steps of an epoch of ``steps`` batches after which :func:`fit` evaluates: ``per_epoch``
    evenly spaced, the last the epoch's end."""
    return sorted({max(1, round(steps * k / per_epoch)) for k in range(1, per_epoch + 1)})


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: What each saved field of a TrainState may hold.
_SAVED_TYPES: dict[str, Callable[[Any], bool]] = {
    "epoch": _count,
    "step": _count,
    "steps": _count,
    "train_time_s": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
    "finished": lambda v: isinstance(v, bool),
    "history": lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v),
    "best": lambda v: v is None or _count(v),
    "extra": lambda v: isinstance(v, dict),
}


def _point_record(
    state: TrainState, total: int, values: dict, sums: Tensor, context: DistContext, schedulers: Sequence[Any]
) -> dict[str, Any]:
    """The record of an evaluation point: position, mean step values since the last point, learning rate."""
    *value_sums, count = all_reduce_sum(sums, context).tolist()
    done = state.epoch + state.step / total
    record = {"epoch": state.epoch + 1 if state.step == total else round(done, 4), "step": state.steps}
    record.update({name: s / max(count, 1) for name, s in zip(values, value_sums)})
    if schedulers:
        record["lr"] = schedulers[0].get_last_lr()[0]
    return record


def _check_finite(pending: list[Tensor], names: list[str], desc: str, epoch: int, last_step: int) -> None:
    """Raise if a value of the steps ``last_step - len(pending) + 1 .. last_step`` is not finite."""
    finite = torch.isfinite(torch.stack(pending))
    if bool(finite.all()):
        return
    row, column = (~finite).nonzero()[0].tolist()
    value = float(pending[row][column])
    raise NonFiniteLossError(
        f"{desc}: training {names[column]} is {value} at epoch {epoch}, step "
        f"{last_step - len(pending) + 1 + row}: lower the learning rate or turn mixed precision off"
    )


def _update_bar(bar, step: int, values: dict, sums: Tensor) -> None:
    if bar.disable:
        return
    *value_sums, count = sums.tolist()
    bar.set_postfix({name: f"{s / count:.4g}" for name, s in zip(values, value_sums)})
    bar.update(step - bar.n)


def _format(record: dict[str, Any]) -> str:
    """The log line of a record: its numbers and flags (a callback's mappings and lists, such as a model's
    reconstruction limits, stay in ``metrics.jsonl``)."""
    shown = {k: v for k, v in record.items() if k != "epoch" and not isinstance(v, (dict, list, tuple))}
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())
