"""Training a model until its error on one test set matches a target: the rule by which the viewpoints
experiment compares models at equal familiar-view error (Hinton, Sabour & Frosst 2018, Sec. 5.2: "We
stopped training the capsule model when its performance on the familiar viewpoints matched the baseline
CNN").

- :func:`train_matched`: train, score on the familiar views a few times per epoch, keep the chosen
  evaluation; a training its time limit cut short can be continued by a later process.
- :func:`error_rate`: the fraction of a data set a model gets wrong.
- the paper's viewpoint splits (:func:`familiar_mask`, :func:`viewpoint_split`: the familiar and novel views
  of the azimuth and elevation splits) and :func:`load_norb_like` (smallNORB, else the offline viewpoint set),
  shared by the experiments that compare models on novel viewpoints.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from capsnets.data import DatasetError, DeviceLoader, TensorData, load_dataset, norb_protocol
from capsnets.data.viewpoints import render_viewpoints, split_instances
from capsnets.engine.callbacks import Hook, TimeLimit
from capsnets.engine.evaluate import evaluate
from capsnets.engine.fit import TrainState, adam_with_decay, fit, training_step
from capsnets.engine.runtime import resolve_amp
from capsnets.losses import create_loss

__all__ = [
    "train_matched",
    "error_rate",
    "AZIMUTH_FAMILIAR",
    "ELEVATION_FAMILIAR",
    "SPLITS",
    "familiar_mask",
    "viewpoint_split",
    "load_norb_like",
]

#: smallNORB azimuth field values (x10 degrees) of the paper's training views: 300 .. 40 degrees.
AZIMUTH_FAMILIAR = (30, 32, 34, 0, 2, 4)
#: Elevation indices of the training views: the three lowest (30, 35, 40 degrees).
ELEVATION_FAMILIAR = (0, 1, 2)
SPLITS = ("azimuth", "elevation")


def error_rate(model: nn.Module, data: TensorData) -> float:
    """The fraction of ``data`` that ``model`` gets wrong."""
    return 1.0 - evaluate(model, data)["accuracy"]


def train_matched(
    model: nn.Module,
    views: dict[str, TensorData],
    *,
    epochs: int,
    target: float | None,
    batch_size: int,
    lr: float,
    lr_decay: float = 0.96,
    weight_decay: float = 0.0,
    loss: str | None = None,
    loss_args: dict | None = None,
    seed: int = 0,
    amp: str = "auto",
    evals_per_epoch: int = 1,
    time_limit_s: float | None = None,
    novel_every: int = 1,
    state: TrainState | None = None,
    compile: bool = False,
) -> dict:
    """Train ``model`` on ``views["train"]`` (with its ``augment``), scoring it on ``views["familiar"]``
    ``evals_per_epoch`` times per epoch (evenly spaced, the last at the end of the epoch), and leave it at the
    chosen evaluation.

    Adam at ``lr`` with ``weight_decay``, decayed by ``lr_decay`` per epoch; ``loss`` (None: the model's
    ``default_loss``) built with ``loss_args``.

    ``views["novel"]`` is scored at every ``novel_every``-th evaluation (0: none) and always at the chosen
    one, after training: it is only recorded (for the curves), never used to choose, and on the viewpoint
    sets it is twice the size of the familiar part, so scoring it less often saves most of the evaluation
    time. Evaluations without it have ``novel_error`` None.

    Chosen evaluation: with ``target=None``, the lowest familiar-view error (first of ties); else the first
    whose familiar-view error is ``<= target`` (training stops there), or, if none is, the one nearest to
    ``target``. Losses with ``set_progress`` (spread loss) see the fraction of ``epochs`` done.
    ``amp``: autocast of the training forward pass and loss, as in the trainer (``"auto"``: bf16 on CUDA).
    ``time_limit_s``: training also stops at the first evaluation past that many seconds (``"time_limit"``
    in the result says whether it did). ``state``: a :class:`~capsnets.engine.TrainState`; training stopped by
    the time limit keeps in it the weights it stopped at (the model is left at the chosen ones), and a state
    that :meth:`~capsnets.experiments.checkpoints.Checkpoints.load_or_train` filled from such a checkpoint is
    continued, the history then including the earlier runs' evaluations. ``compile``: run the training steps'
    forward passes through ``torch.compile(model)`` (same weights; scoring stays eager, so evaluation batches
    compile nothing).

    Returns:
        ``{"history": [{"epoch", "step", "loss", "familiar_error", "novel_error", ...}, ...], "epoch",
        "familiar_error", "novel_error", "reached", "time_limit"}`` (``epoch`` and the two errors are the
        chosen evaluation's): the records of :func:`~capsnets.engine.fit`.
    """
    if evals_per_epoch < 1:
        raise ValueError(f"evals_per_epoch must be >= 1, got {evals_per_epoch}")
    if isinstance(novel_every, bool) or not isinstance(novel_every, int) or novel_every < 0:
        raise ValueError(f"novel_every must be an integer >= 0 (0: only at the chosen evaluation), got {novel_every!r}")
    criterion = create_loss(loss or getattr(model, "default_loss", "cross_entropy"), **(loss_args or {}))
    limit = TimeLimit(time_limit_s)
    forward = torch.compile(model) if compile else model  # shares the parameters: train, score, save ``model``
    loader = DeviceLoader(views["train"], batch_size, seed=seed)
    optimizer, scheduler = adam_with_decay(model.parameters(), lr=lr, lr_decay=lr_decay, weight_decay=weight_decay)
    state, best_state = state if state is not None else TrainState(), None
    checkpoint = state.attach(optimizer, scheduler)
    if checkpoint is not None:  # the model holds the chosen weights; the checkpoint those it stopped at
        best_state = copy.deepcopy(model.state_dict())
        model.load_state_dict(
            {k[len("extra.last.") :]: v for k, v in checkpoint.tensors.items() if k.startswith("extra.last.")}
        )
    schedule, device = hasattr(criterion, "set_progress"), views["train"].device

    def compute(batch):
        images, labels = batch
        if schedule:
            criterion.set_progress(state.fraction(len(loader), epochs), epochs)
        return {"loss": criterion(forward(images, labels), images, labels)[0]}

    def score(record: dict, final: bool) -> bool:
        nonlocal best_state
        record["familiar_error"] = error_rate(model, views["familiar"])
        scored = novel_every and len(state.history) % novel_every == 0
        record["novel_error"] = error_rate(model, views["novel"]) if scored else None
        reached = target is not None and record["familiar_error"] <= target
        if reached or state.best is None or _distance(record, target) < _distance(state.history[state.best], target):
            state.best, best_state = len(state.history) - 1, copy.deepcopy(model.state_dict())
        return reached

    step = training_step(compute, optimizer, device=device, amp_dtype=resolve_amp(amp, device), model=model)
    fit(
        step,
        loader,
        epochs=epochs,
        state=state,
        schedulers=[scheduler],
        evaluations_per_epoch=evals_per_epoch,
        callbacks=[limit, Hook(score)],
        desc=f"matched {getattr(model, 'model_name', 'model')}",
    )
    if not state.finished:  # what a later run needs to continue from this evaluation
        state.tensors = {f"last.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    chosen = (
        state.history[state.best]
        if state.best is not None
        else {"epoch": 0, "familiar_error": error_rate(model, views["familiar"]), "novel_error": None}
    )
    if chosen["novel_error"] is None:  # the chosen state was restored above; the record is in the history
        chosen["novel_error"] = error_rate(model, views["novel"])
    return {
        "history": state.history,
        "epoch": chosen["epoch"],
        "familiar_error": chosen["familiar_error"],
        "novel_error": chosen["novel_error"],
        "reached": target is not None and chosen["familiar_error"] <= target,
        "time_limit": not state.finished,
    }


def _distance(record: dict, target: float | None) -> float:
    """How far an evaluation is from the goal: its familiar-view error, or its distance to ``target``."""
    return record["familiar_error"] if target is None else abs(record["familiar_error"] - target)


# --------------------------------------------------------------------------------------------------------
# The viewpoint splits (Hinton, Sabour & Frosst 2018, Sec. 5.2)


def familiar_mask(info: dict[str, Tensor], split: str) -> Tensor:
    """``(N,)`` bool: which examples are at the training (familiar) views of ``split``."""
    if split == "azimuth":
        return torch.isin(info["azimuth"], torch.tensor(AZIMUTH_FAMILIAR, device=info["azimuth"].device))
    if split == "elevation":
        return torch.isin(info["elevation"], torch.tensor(ELEVATION_FAMILIAR, device=info["elevation"].device))
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def viewpoint_split(train: TensorData, test: TensorData, split: str) -> dict[str, TensorData]:
    """``{"train": train split at familiar views, "familiar": test split at familiar views, "novel": the rest
    of the test split}``, selected on the ``info`` fields."""
    familiar = familiar_mask(test.info, split)
    return {
        "train": train.select(familiar_mask(train.info, split)),
        "familiar": test.select(familiar),
        "novel": test.select(~familiar),
    }


def load_norb_like(
    data_dir, device: str, *, render_instances: int | None = None, render_lightings=None
) -> tuple[TensorData, TensorData, str]:
    """``(train, test, source)``: smallNORB if its files are under ``data_dir``, else the viewpoint set
    (the whole cached grid, or, with ``render_instances`` / ``render_lightings``, a smaller one rendered now)."""
    try:
        return (
            load_dataset("smallnorb", root=data_dir, train=True, device=device),
            load_dataset("smallnorb", root=data_dir, train=False, device=device),
            "smallNORB",
        )
    except DatasetError as err:
        reason = str(err).splitlines()[0].split(". Fix:")[0]
    if render_instances is None and render_lightings is None:
        splits = [load_dataset("viewpoints", root=data_dir, train=t, device=device) for t in (True, False)]
        return (*splits, f"the offline rendered viewpoint set (smallNORB not found: {reason})")
    splits = []
    for train in (True, False):
        name = "train" if train else "test"
        instances = None if render_instances is None else list(split_instances(name)[:render_instances])
        raw = render_viewpoints(name, instances=instances, lightings=render_lightings)
        splits.append(norb_protocol(raw, train, name="viewpoints").to(device))
    return (
        *splits,
        f"the offline rendered viewpoint set, a reduced grid ({render_instances or 5} toy(s) per class "
        f"and split, lightings {render_lightings or 'all'}; smallNORB not found: {reason})",
    )
