"""Novel viewpoints: the paper's splits of smallNORB into familiar and novel views, and training a model until its
error on the familiar views matches a target, the rule by which the ``viewpoints`` and ``routers`` experiments
compare models at equal familiar-view error (Hinton, Sabour & Frosst 2018, Sec. 5.2: "We stopped training the
capsule model when its performance on the familiar viewpoints matched the baseline CNN").

- :func:`fit_matched`: train through the engine's trainer, choosing on the familiar views, scoring the novel ones.
- :func:`error_rate`: the fraction of a data set a model gets wrong.
- the paper's viewpoint splits (:func:`familiar_mask`, :func:`viewpoint_split`: the familiar and novel views
  of the azimuth and elevation splits) and :func:`load_norb_like` (smallNORB, else the offline viewpoint set),
  shared by the experiments that compare models on novel viewpoints.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from capsnets.data import DatasetError, TensorData, load_dataset, norb_protocol
from capsnets.data.viewpoints import render_viewpoints, split_instances
from capsnets.engine.evaluate import evaluate
from capsnets.experiments.runs import Runs

__all__ = [
    "fit_matched",
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


def fit_matched(
    runs: Runs,
    key: str,
    model: nn.Module,
    views: dict[str, TensorData],
    *,
    target: float | None,
    novel_each_epoch: bool = True,
    **settings: Any,
) -> dict[str, Any]:
    """Train ``model`` on ``views["train"]`` through the engine's trainer (:meth:`Runs.fit`), choosing on the familiar
    views (the validation data) and scoring the novel views (the test data).

    Chosen epoch: with ``target=None``, the lowest familiar-view error; else the first whose familiar-view error is
    ``<= target`` (training stops there), or, if none is, the lowest (the nearest to ``target``). The novel views
    are scored at every epoch with ``novel_each_epoch`` (for the curves; never to choose), and at the chosen
    epoch after training. ``settings``: :meth:`Runs.fit`'s (``epochs``, ``batch_size``, ``lr``, ``seed``...).

    Returns:
        ``{"history": [{"epoch", "loss", "familiar_error", "novel_error"}, ...], "epoch", "familiar_error",
        "novel_error", "reached", "time_limit", "training"}``: the chosen epoch's errors.
    """
    training = runs.fit(
        key,
        model,
        views["train"],
        views["familiar"],
        test=views["novel"],
        target=None if target is None else 1.0 - target,
        test_each_epoch=novel_each_epoch,
        max_shift=0,
        **settings,
    )
    history = [
        {
            "epoch": r["epoch"],
            "loss": r.get("train_loss"),
            "familiar_error": 1.0 - r["val_accuracy"],
            "novel_error": None if r.get("test_accuracy") is None else 1.0 - r["test_accuracy"],
        }
        for r in training.history
    ]
    familiar = 1.0 - training.chosen("val_accuracy")
    return {
        "history": history,
        "epoch": training.summary.get("best_epoch"),
        "familiar_error": familiar,
        "novel_error": 1.0 - training.summary["best_test_accuracy"],
        "reached": target is not None and familiar <= target,
        "time_limit": training.cut_short,
        "training": training,
    }


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
