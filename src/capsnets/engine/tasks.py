"""What the trainer does differently for each kind of task: one :class:`Task` per kind, chosen from the data.

The :class:`~capsnets.engine.trainer.Trainer` has one loop for every task; a task says which models it trains,
what a model is built with, which losses fit, how a batch is scored during training, how the test split is
evaluated (the entries of each epoch's record), which record entry chooses the ``best`` checkpoint, what the
checkpoints and ``summary.json`` add, and which figures the run leaves. A new task is a subclass registered in
:data:`TASKS` and returned by :func:`task_for` for its data.

- ``classification``: one class per image (:class:`~capsnets.data.base.TensorData`); accuracy, confusion matrix.
- ``multilabel``: several classes per image (``TensorData.multilabel``); thresholds chosen on training examples,
  mAP, F1 (:func:`~capsnets.engine.evaluate.multilabel_metrics`).
- ``segmentation``: a class per pixel (:class:`~capsnets.data.segmentation.SegmentationData`); per-class Dice and
  IoU of the pixels (:func:`~capsnets.engine.evaluate.segmentation_metrics`), ``best`` by their mean Dice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from capsnets.engine import reporting
from capsnets.engine.evaluate import evaluate, evaluate_segmentation
from capsnets.losses import LOSS_TASKS, list_losses, multilabel_loss
from capsnets.models.output import independent_probabilities

__all__ = [
    "ACCURACY_TARGETS",
    "THRESHOLD_EXAMPLES",
    "TASKS",
    "Task",
    "ClassificationTask",
    "MultilabelTask",
    "SegmentationTask",
    "task_for",
    "best_index",
]

#: Test accuracies whose first crossing time is reported in ``summary.json["time_to_accuracy"]``.
ACCURACY_TARGETS = (0.99, 0.995, 0.996)
#: Multi-label data: the per-class thresholds are chosen on at most this many training examples (the first ones).
THRESHOLD_EXAMPLES = 10_000


class Task:
    """The classification task, and the base of the others (see the module docstring).

    Args:
        train_data: the run's training split.
    """

    name: ClassVar[str] = "classification"
    #: The task of the registered models it trains (:func:`~capsnets.models.model_task`).
    model_task: ClassVar[str] = "classification"
    #: The record entry whose highest value makes an evaluation the ``best`` checkpoint.
    best_metric: ClassVar[str] = "test_accuracy"
    #: Whether the images may be shifted or augmented alone (not for targets that are images themselves).
    image_augmentation: ClassVar[bool] = True

    def __init__(self, train_data: Any) -> None:
        self.train_data = train_data

    def model_defaults(self, data: Any) -> dict[str, Any]:
        """Builder arguments a model gets from the data unless the config gives them."""
        return {"num_classes": data.num_classes, "input_size": list(data.input_shape)}

    def check_model(self, model: nn.Module, data: Any, names: tuple[str, str]) -> None:
        """Refuse a model that does not fit the data (``names``: the model's and the data set's, for the message)."""
        expected_shape = tuple(data.input_shape)  # after the data set's own augmentation (e.g. crops)
        if int(model.num_classes) != data.num_classes or tuple(model.input_size) != expected_shape:
            raise ValueError(
                f"model {names[0]!r} expects {model.num_classes} classes of {tuple(model.input_size)} "
                f"images but dataset {names[1]!r} has {data.num_classes} classes of {expected_shape}; "
                f"pick another model or pass --model-arg num_classes=... --model-arg input_size=..."
            )

    def loss_name(self, name: str, default: str, given: bool) -> str:
        """The loss to train with: ``name`` (``given``: asked for, else the model's ``default``), checked."""
        if LOSS_TASKS.get(name, self.model_task) != self.model_task:
            raise ValueError(
                f"loss {name!r} is for {LOSS_TASKS[name]} models, and this is a {self.name} run; use one of "
                f"{', '.join(list_losses(self.model_task))} (or leave --loss out for the model's own, {default!r})"
            )
        return name

    def loader_data(self, data: Any) -> Any:
        """What the :class:`~capsnets.data.DeviceLoader` batches: the data itself (its images, labels and own
        augmentation), or an ``(images, targets)`` pair."""
        return data

    def train_metrics(self, output: Any, targets: Tensor) -> dict[str, Tensor]:
        """A training batch's scores besides its loss."""
        correct = (output.scores.detach().argmax(dim=-1) == targets).sum()
        return {"train_accuracy": correct.double() / len(targets)}

    def evaluate(self, model, data, batch_size: int, device, amp: str, criterion, context) -> dict[str, Any]:
        """The test split's scores, as entries of the epoch's record."""
        evaluation = evaluate(model, data, batch_size, device, amp, criterion, context=context)
        return {"test_loss": evaluation["loss"], "test_accuracy": evaluation["accuracy"]}

    def meta(self, history: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, Any]:
        """What a checkpoint of ``record``'s evaluation records besides the model and config."""
        return {}

    def summary(self, history: list[dict[str, Any]], best: dict[str, Any]) -> dict[str, Any]:
        """The task's entries of ``summary.json`` (``best``: the record of the ``best`` checkpoint, or ``{}``)."""
        tested = [r for r in history if r.get("test_accuracy") is not None]
        reached = {
            str(t): next((r["train_time_s"] for r in tested if r["test_accuracy"] >= t), None) for t in ACCURACY_TARGETS
        }
        return {
            "test_accuracy": tested[-1]["test_accuracy"] if tested else None,
            "best_test_accuracy": best.get("test_accuracy"),
            "time_to_accuracy": reached,
        }

    def figures(
        self, run_dir: Path, model, data, *, batch_size: int, device, amp: str, checkpoint: str
    ) -> tuple[list, str]:
        """Draw the figures of ``model`` into ``run_dir``; ``checkpoint`` says which it is (``"best.safetensors (epoch
        3"``), the task adds its test score (``", test accuracy 98.20%)"``). Returns the paths and that description."""
        evaluation = evaluate(model, data, batch_size, device, amp)
        shown = f"{checkpoint}, test accuracy {100 * evaluation['accuracy']:.2f}%)"
        paths = reporting.save_figures(
            run_dir,
            confusion=evaluation["confusion_matrix"],
            class_names=list(data.classes),
            checkpoint=shown,
            samples=_reconstruction_samples(model, data, device),
        )
        return paths, shown


class ClassificationTask(Task):
    """One class per image (the base :class:`Task`)."""


class MultilabelTask(Task):
    """Several classes per image: a loss that takes multi-hot targets (:func:`~capsnets.losses.multilabel_loss`).
    Each evaluation first chooses every class's threshold to maximise its F1 on the first
    :data:`THRESHOLD_EXAMPLES` training examples (never on the test split), then scores the test split with them
    (mAP, micro and macro F1, exact-set accuracy as ``test_accuracy``); the ``best`` checkpoint is the one of
    highest test mAP, and every checkpoint records the thresholds for ``capsnets predict``."""

    name = "multilabel"
    best_metric = "test_map"

    def __init__(self, train_data: Any) -> None:
        super().__init__(train_data)
        self.threshold_data = train_data.subset(min(len(train_data), THRESHOLD_EXAMPLES))

    def loss_name(self, name: str, default: str, given: bool) -> str:
        return multilabel_loss(super().loss_name(name, default, given), given=given)

    def train_metrics(self, output: Any, targets: Tensor) -> dict[str, Tensor]:
        present = independent_probabilities(output).detach() >= 0.5
        correct = (present == (targets > 0.5)).all(dim=1).sum()
        return {"train_accuracy": correct.double() / len(targets)}

    def evaluate(self, model, data, batch_size: int, device, amp: str, criterion, context) -> dict[str, Any]:
        chosen = evaluate(model, self.threshold_data, batch_size, device, amp, context=context)
        thresholds = chosen["f1_thresholds"]
        test = evaluate(model, data, batch_size, device, amp, criterion, context=context, thresholds=thresholds)
        return {
            "test_loss": test["loss"],
            "test_accuracy": test["exact_match"],
            "test_map": test["mAP"],
            "test_micro_f1": test["micro_f1"],
            "test_macro_f1": test["macro_f1"],
            "thresholds": [round(t, 6) for t in thresholds.tolist()],
        }

    def meta(self, history: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, Any]:
        """That it is multi-label, and the thresholds of ``record``'s evaluation, else of the latest one."""
        chosen = [r["thresholds"] for r in (*history, record) if r.get("thresholds") is not None]
        return {"multilabel": True, "thresholds": record.get("thresholds") or (chosen[-1] if chosen else None)}

    def summary(self, history: list[dict[str, Any]], best: dict[str, Any]) -> dict[str, Any]:
        tested = [r for r in history if r.get("test_map") is not None]
        last = tested[-1] if tested else {}
        entries = {key: last.get(key) for key in ("test_map", "test_micro_f1", "test_macro_f1")}
        entries.update(best_test_map=best.get("test_map"), thresholds=best.get("thresholds"))
        return {**entries, **super().summary(history, best)}

    def figures(
        self, run_dir: Path, model, data, *, batch_size: int, device, amp: str, checkpoint: str
    ) -> tuple[list, str]:
        evaluation = evaluate(model, data, batch_size, device, amp)
        shown = f"{checkpoint}, test mAP {100 * evaluation['mAP']:.2f}%)"
        paths = reporting.save_figures(
            run_dir, confusion=None, class_names=list(data.classes), checkpoint=shown, samples=None
        )
        return paths, shown


class SegmentationTask(Task):
    """A class per pixel (:class:`~capsnets.data.segmentation.SegmentationData`), for segmentation models.

    A data set of 2 classes (background and object) gets the binary model (``num_classes=1``: the object's
    probability), one of K > 2 classes a model of K maps. Each evaluation counts the test split's pixels
    (:func:`~capsnets.engine.evaluate.evaluate_segmentation`): the record gets ``test_mean_dice``,
    ``test_mean_iou`` (over the classes but the background), ``test_pixel_accuracy`` and the per-class
    ``test_dice`` and ``test_iou``; the ``best`` checkpoint is the one of highest mean Dice. Images are not shifted
    or augmented (their masks would not follow).
    """

    name = "segmentation"
    model_task = "segmentation"
    best_metric = "test_mean_dice"
    image_augmentation = False

    def model_defaults(self, data: Any) -> dict[str, Any]:
        maps = 1 if data.num_classes == 2 else data.num_classes
        return {"num_classes": maps, "input_size": list(data.input_shape)}

    def check_model(self, model: nn.Module, data: Any, names: tuple[str, str]) -> None:
        fits = int(model.num_classes) in ({1, 2} if data.num_classes == 2 else {data.num_classes})
        if not fits or tuple(model.input_size) != tuple(data.input_shape):
            raise ValueError(
                f"model {names[0]!r} has {model.num_classes} class map(s) for {tuple(model.input_size)} images but "
                f"dataset {names[1]!r} has {data.num_classes} classes (the background included) of "
                f"{tuple(data.input_shape)}; pass --model-arg num_classes={self.model_defaults(data)['num_classes']} "
                f"and --model-arg input_size=..., or leave them out"
            )

    def loader_data(self, data: Any) -> tuple[Tensor, Tensor]:
        return data.images, data.masks

    def train_metrics(self, output: Any, targets: Tensor) -> dict[str, Tensor]:
        right = (output.predicted_classes().detach() == targets.long()).double().mean()
        return {"train_pixel_accuracy": right}

    def evaluate(self, model, data, batch_size: int, device, amp: str, criterion, context) -> dict[str, Any]:
        scores = evaluate_segmentation(model, data, batch_size, device, amp, criterion, context)
        return {
            "test_loss": scores["loss"],
            "test_mean_dice": scores["mean_dice"],
            "test_mean_iou": scores["mean_iou"],
            "test_pixel_accuracy": scores["pixel_accuracy"],
            "test_dice": scores["dice"].tolist(),
            "test_iou": scores["iou"].tolist(),
        }

    def meta(self, history: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, Any]:
        """How the training masks were written, so that ``capsnets predict`` writes its masks alike."""
        return {"mask_format": getattr(self.train_data, "mask_format", None)}

    def summary(self, history: list[dict[str, Any]], best: dict[str, Any]) -> dict[str, Any]:
        tested = [r for r in history if r.get("test_mean_dice") is not None]
        last, names = (tested[-1] if tested else {}), list(self.train_data.classes)

        def by_class(values):
            return None if values is None else dict(zip(names or map(str, range(len(values))), values))

        return {
            "test_mean_dice": last.get("test_mean_dice"),
            "test_mean_iou": last.get("test_mean_iou"),
            "test_dice": by_class(last.get("test_dice")),
            "test_iou": by_class(last.get("test_iou")),
            "best_test_mean_dice": best.get("test_mean_dice"),
            "best_test_mean_iou": best.get("test_mean_iou"),
            "best_test_dice": by_class(best.get("test_dice")),
            "best_test_iou": by_class(best.get("test_iou")),
        }

    def figures(
        self, run_dir: Path, model, data, *, batch_size: int, device, amp: str, checkpoint: str
    ) -> tuple[list, str]:
        scores = evaluate_segmentation(model, data, batch_size, device, amp)
        shown = f"{checkpoint}, test mean Dice {100 * scores['mean_dice']:.2f}%)"
        paths = reporting.save_segmentation_figures(
            run_dir,
            confusion=scores["confusion_matrix"],
            class_names=list(data.classes) or [str(k) for k in range(data.num_classes)],
            samples=_segmentation_samples(model, data, device),
            checkpoint=shown,
        )
        return paths, shown


#: The tasks by name.
TASKS: dict[str, type[Task]] = {
    "classification": ClassificationTask,
    "multilabel": MultilabelTask,
    "segmentation": SegmentationTask,
}


def task_for(model_name: str, registered: str, data: Any, dataset: str) -> Task:
    """The task of a run of model ``model_name`` (its registered task ``registered``) on ``data`` (the training
    split of ``dataset``): the data's ``task`` attribute if it has one, else multi-label or classification.

    Raises:
        ValueError: the model is not for that task (e.g. a classifier on a folder of masks).
    """
    kind = getattr(data, "task", None) or ("multilabel" if getattr(data, "multilabel", False) else "classification")
    task = TASKS[kind]
    if registered != task.model_task:
        hint = {"segmentation": "segcaps_small or unet_small", "classification": "capsnet_small"}.get(task.model_task)
        raise ValueError(
            f"model {model_name!r} is a {registered} model, and dataset {dataset!r} is {kind} data; train a "
            f"{task.model_task} model on it" + (f" (e.g. {hint})" if hint else "")
        )
    return task(data)


def best_index(history: list[dict[str, Any]], metric: str) -> int | None:
    """Index of the record with the highest ``metric`` (the first of ties), or None if none has it."""
    tested = [i for i, record in enumerate(history) if record.get(metric) is not None]
    return max(tested, key=lambda i: history[i][metric], default=None)


@torch.no_grad()
def _reconstruction_samples(model, data, device, count: int = 16) -> dict[str, Tensor] | None:
    """Inputs, reconstructions, labels and predictions of the first ``count`` examples, or None."""
    was_training = model.training
    model.eval()
    images = data.images[:count].to(device)
    output = model(images)
    model.train(was_training)
    if output.reconstruction is None:
        return None
    return {
        "images": images.cpu(),
        "reconstructions": output.reconstruction.float().cpu(),
        "labels": data.labels[:count].cpu(),
        "predictions": output.scores.argmax(-1).cpu(),
    }


@torch.no_grad()
def _segmentation_samples(model, data, device, count: int = 8) -> dict[str, Tensor]:
    """Inputs, true and predicted class masks of the first ``count`` examples."""
    was_training = model.training
    model.eval()
    images = data.images[:count].to(device)
    predicted = model(images).predicted_classes()
    model.train(was_training)
    return {"images": images.cpu(), "masks": data.masks[:count].long().cpu(), "predictions": predicted.cpu()}
