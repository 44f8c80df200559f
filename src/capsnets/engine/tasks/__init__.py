"""What differs between tasks: one :class:`Task` per task, registered in :data:`TASKS`.

A task owns what its runs, its checkpoints and its answers do differently (Lightning's ``validation_step``,
``test_step`` and ``predict_step`` of a module): which models it trains and what they are built with, which losses
fit, how a training batch is scored, how the test split is evaluated (the entries of each epoch's record), which
entry chooses the ``best`` checkpoint, what checkpoints and ``summary.json`` add, the run's figures and the lines
``capsnets train`` prints (:class:`~capsnets.engine.trainer.Trainer`); how a checkpoint is scored on a test split
and reported (``capsnets evaluate``: the JSON, the figure and the text), and how image files are answered and the
answers shown (``capsnets predict``). The command line parses, loads and calls the task; a new task is a subclass
registered here and returned by :func:`task_for` for its data.

- ``classification``: one class per image (:class:`~capsnets.data.base.TensorData`); accuracy, confusion matrix.
- ``multilabel``: several classes per image (``TensorData.multilabel``); thresholds chosen on training examples,
  mAP, F1 (:func:`~capsnets.engine.evaluate.multilabel_metrics`).
- ``segmentation``: a class per pixel (:class:`~capsnets.data.segmentation.SegmentationData`); per-class Dice and
  IoU of the pixels (:func:`~capsnets.engine.evaluate.segmentation_metrics`), ``best`` by their mean Dice.
- ``autoencoder`` and ``synthesis``: models that make images, trained elsewhere (:class:`ReconstructionTask`,
  :class:`SynthesisTask`).

Every task's :attr:`Task.model_task` is one of :data:`capsnets.models.registry.MODEL_TASKS`, the tasks a model is
registered for, and every one of those is the ``model_task`` of a task here.
"""

from __future__ import annotations

from typing import Any

from capsnets.engine.tasks.base import Task
from capsnets.engine.tasks.classification import (
    ACCURACY_TARGETS,
    CALIBRATION_EXAMPLES,
    ClassificationTask,
    format_report,
)
from capsnets.engine.tasks.generative import ReconstructionTask, SynthesisTask
from capsnets.engine.tasks.multilabel import MULTILABEL_LOSSES, THRESHOLD_EXAMPLES, MultilabelTask
from capsnets.engine.tasks.segmentation import SegmentationTask
from capsnets.models import model_task
from capsnets.validation import ArgumentError

__all__ = [
    "ACCURACY_TARGETS",
    "CALIBRATION_EXAMPLES",
    "MULTILABEL_LOSSES",
    "THRESHOLD_EXAMPLES",
    "TASKS",
    "Task",
    "ClassificationTask",
    "MultilabelTask",
    "SegmentationTask",
    "ReconstructionTask",
    "SynthesisTask",
    "data_task",
    "task_for",
    "checkpoint_task",
    "task_named",
    "best_index",
    "format_report",
]

#: The tasks by name.
TASKS: dict[str, type[Task]] = {
    "classification": ClassificationTask,
    "multilabel": MultilabelTask,
    "segmentation": SegmentationTask,
    "autoencoder": ReconstructionTask,
    "synthesis": SynthesisTask,
}

#: Models whose data name no task: the example of a model of each task, for messages.
_EXAMPLES = {"segmentation": "segcaps_small or unet_small", "classification": "capsnet_small"}


def data_task(data: Any) -> str:
    """The name of the task of ``data``: its ``task`` attribute if it has one, else ``"multilabel"`` for data of
    several classes per image, else ``"classification"``."""
    return getattr(data, "task", None) or ("multilabel" if getattr(data, "multilabel", False) else "classification")


def task_for(model_name: str, registered: str, data: Any, dataset: str, *, training: bool = True) -> Task:
    """The task of model ``model_name`` (its registered task ``registered``) on ``data`` (a split of ``dataset``),
    :func:`data_task`: for a training run on ``data`` (``training``), or for scoring a trained model on it.

    Raises:
        ValueError: the model is not for that task (e.g. a classifier on a folder of masks).
    """
    kind = data_task(data)
    task = task_named(kind)
    if registered != task.model_task:
        hint = _EXAMPLES.get(task.model_task)
        article = "an" if registered[:1] in tuple("aeiou") else "a"
        raise ArgumentError(
            f"model {model_name!r} is {article} {registered} model, and dataset {dataset!r} is {kind} data; use a "
            f"{task.model_task} model with it" + (f" (e.g. {hint})" if hint else "")
        )
    return task(data if training else None)


def checkpoint_task(meta: dict[str, Any]) -> Task:
    """The task of a checkpoint whose metadata (sidecar) is ``meta``: multi-label if it says so, else the first task
    of its model's registered task (:func:`~capsnets.models.model_task` of ``meta["model"]``)."""
    if meta.get("multilabel"):
        return MultilabelTask()
    registered = model_task(meta["model"])
    return next(task for task in TASKS.values() if task.model_task == registered)()


def task_named(name: str) -> type[Task]:
    """The task registered as ``name`` in :data:`TASKS`.

    Raises:
        ArgumentError: no task has that name.
    """
    if name not in TASKS:
        raise ArgumentError(f"unknown task {name!r}; the tasks are {', '.join(TASKS)}", "task")
    return TASKS[name]


def best_index(history: list[dict[str, Any]], metric: str) -> int | None:
    """Index of the record with the highest ``metric`` (the first of ties), or None if none has it."""
    tested = [i for i, record in enumerate(history) if record.get(metric) is not None]
    return max(tested, key=lambda i: history[i][metric], default=None)
