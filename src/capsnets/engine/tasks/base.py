"""The base of the tasks: what every task says, with the defaults of a task that neither trains here nor is scored.

A task has three audiences. The :class:`~capsnets.engine.trainer.Trainer` asks how to build, train, evaluate,
checkpoint and summarise a run; ``capsnets evaluate`` and ``reconstruct`` ask how to score a checkpoint on a test
split and report it; ``capsnets predict`` asks how to answer for image files and show the answers. A subclass
overrides what its task does; what it leaves to this base is refused with a message that says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from capsnets.inference import Prediction
from capsnets.losses import LOSS_TASKS, list_losses
from capsnets.validation import ArgumentError

__all__ = ["Task", "adapted_note"]


class Task:
    """What differs between tasks (see :mod:`capsnets.engine.tasks`).

    Args:
        train_data: the run's training split (None outside a training run: scoring or using a checkpoint).
    """

    #: The task's name: its key in :data:`~capsnets.engine.tasks.TASKS`, ``summary.json["task"]``.
    name: ClassVar[str]
    #: The task of the registered models it uses (:func:`~capsnets.models.model_task`).
    model_task: ClassVar[str]
    #: The record entry whose highest value makes an evaluation the ``best`` checkpoint.
    best_metric: ClassVar[str] = "test_accuracy"
    #: Whether the images may be shifted or augmented alone (not for targets that are images themselves).
    image_augmentation: ClassVar[bool] = True

    def __init__(self, train_data: Any = None) -> None:
        self.train_data = train_data

    # -- a training run ----------------------------------------------------------------------------------------
    def model_defaults(self, data: Any) -> dict[str, Any]:
        """Builder arguments a model gets from the data unless the config gives them."""
        return {"num_classes": data.num_classes, "input_size": list(data.input_shape)}

    def fits(self, model: nn.Module, data: Any) -> bool:
        """Whether ``model``'s classes and input size are those of ``data``."""
        return int(model.num_classes) == data.num_classes and tuple(model.input_size) == tuple(data.input_shape)

    def check_model(self, model: nn.Module, data: Any, names: tuple[str, str]) -> None:
        """Refuse a model that does not fit the data (``names``: the model's and the data set's, for the message)."""
        if not self.fits(model, data):
            raise ArgumentError(
                f"model {names[0]!r} expects {model.num_classes} classes of {tuple(model.input_size)} "
                f"images but dataset {names[1]!r} has {data.num_classes} classes of {tuple(data.input_shape)}; "
                f"pick another model or pass --model-arg num_classes=... --model-arg input_size=..."
            )

    def loss_name(self, name: str, default: str, given: bool) -> str:
        """The loss to train with: ``name`` (``given``: asked for, else the model's ``default``), checked."""
        if LOSS_TASKS.get(name, self.model_task) != self.model_task:
            raise ArgumentError(
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
        return {}

    def evaluate(self, model, data, batch_size: int, device, amp: str, criterion, context) -> dict[str, Any]:
        """The test split's scores, as entries of the epoch's record."""
        raise self._unsupported("are not trained by capsnets.engine")

    def meta(self, history: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, Any]:
        """What a checkpoint of ``record``'s evaluation records besides the model and config."""
        return {}

    def summary(self, history: list[dict[str, Any]], best: dict[str, Any]) -> dict[str, Any]:
        """The task's entries of ``summary.json`` (``best``: the record of the ``best`` checkpoint, or ``{}``)."""
        return {}

    def figures(
        self, run_dir: Path, model, data, *, batch_size: int, device, amp: str, checkpoint: str
    ) -> tuple[list, str]:
        """Draw the figures of ``model`` into ``run_dir``; ``checkpoint`` says which it is (``"best.safetensors (epoch
        3"``), the task adds its test score (``", test accuracy 98.20%)"``). Returns the paths and that description."""
        return [], f"{checkpoint})"

    @classmethod
    def summary_lines(cls, summary: dict[str, Any]) -> list[str]:
        """What ``capsnets train`` prints of a run's scores, from its ``summary.json``."""
        return []

    # -- a checkpoint on a test split ----------------------------------------------------------------------------
    def score(self, model: nn.Module, data: Any, *, batch_size: int, device, meta: dict[str, Any]) -> dict[str, Any]:
        """The scores of ``model`` (of a checkpoint whose metadata is ``meta``) on every example of ``data``."""
        raise self._unsupported("are not scored by capsnets evaluate")

    def check_ensemble(self) -> None:
        """Refuse to score an ensemble of this task's models (those tasks whose scores can be averaged allow it)."""
        raise ArgumentError(f"an ensemble of {self.name} models is not scored; evaluate each checkpoint alone")

    def report_files(self, out: Path, stem: str) -> list[tuple[Path, str]]:
        """The files :meth:`report` writes, each with its purpose (for :func:`~capsnets.outputs.check_output`)."""
        return [(out / f"{stem}.json", "evaluation")]

    def report(
        self, results: dict[str, Any], data: Any, out: Path, stem: str, record: dict[str, Any], title: str
    ) -> tuple[str, list[Path]]:
        """Write the report of ``results`` (:meth:`score` of ``data``) as :meth:`report_files` says.

        Args:
            results: the scores.
            data: the split scored (its name and classes).
            out, stem: the folder and the file names' stem.
            record: which checkpoint(s) were scored: the first entries of the JSON file.
            title: which model the figures show.

        Returns:
            The text to print, and the files written.
        """
        raise self._unsupported("are not scored by capsnets evaluate")

    @torch.no_grad()
    def reconstructions(self, model: nn.Module, data: Any, count: int, device) -> dict[str, Tensor | None] | None:
        """The first ``count`` images of ``data`` and their reconstructions by ``model`` (in eval mode), on the
        CPU; ``labels`` and ``predictions`` where the task has one class per image, else None. None when the model
        has no decoder."""
        was_training = model.training
        model.eval()
        images = data.images[:count].to(device)
        output = model(images)
        model.train(was_training)
        if getattr(output, "reconstruction", None) is None:
            return None
        return {
            "images": images.cpu(),
            "reconstructions": output.reconstruction.float().cpu(),
            **self._sample_labels(output, data, count),
        }

    def _sample_labels(self, output: Any, data: Any, count: int) -> dict[str, Tensor | None]:
        return {"labels": None, "predictions": None}

    # -- images -------------------------------------------------------------------------------------------------
    def prediction_files(self, files: Sequence[Path], out: Path) -> list[tuple[Path, str, Path]]:
        """The files :meth:`predict` writes into ``out`` for the images ``files``: ``(path, purpose, image)``
        each; none for a task that answers in words."""
        return []

    def predict(
        self,
        model: nn.Module,
        files: Sequence[Path],
        *,
        meta: dict[str, Any],
        out: Path,
        batch_size: int,
        invert: str,
        overwrite: bool,
    ) -> list[Prediction]:
        """Answer for the image ``files`` with ``model`` (of a checkpoint whose metadata is ``meta``).

        Args:
            model, files, meta: as above.
            out: the folder of the files :meth:`prediction_files` names.
            batch_size: images per forward pass.
            invert: ``"auto"``, ``"yes"`` or ``"no"`` (:func:`~capsnets.images.prepare_image`).
            overwrite: replace files in ``out`` that capsnets did not write.
        """
        name = meta.get("model", getattr(model, "model_name", type(model).__name__))
        raise ArgumentError(f"model {name!r} is for {self.model_task}; predict classifies or segments images")

    def prediction_header(self, meta: dict[str, Any], model: nn.Module) -> dict[str, Any]:
        """Entries of the predictions' JSON besides the checkpoint, model and data set (what was applied)."""
        return {}

    def format_prediction(self, result: Prediction) -> str:
        """One image's answer as text."""
        return f"{result.path}: {result.to_dict()}"

    def _unsupported(self, what: str) -> ArgumentError:
        return ArgumentError(
            f"{self.name} models {what}, which handles classifiers (one class per image or several) and "
            "segmentation models"
        )


def adapted_note(result: Prediction) -> str:
    """What was adapted to fit the image to the model, as the end of its line (empty when nothing was)."""
    return f"  [{'; '.join(result.adapted)}]" if result.adapted else ""
