"""The classification task: :class:`ClassificationTask`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from capsnets.engine import reporting
from capsnets.engine.evaluate import evaluate
from capsnets.engine.tasks.base import Task, adapted_note
from capsnets.engine.tasks.report import chosen_on, class_names, class_table, percent, write_evaluation
from capsnets.inference import Prediction, calibrate_reconstruction, checkpoint_class_names, predict

__all__ = ["ACCURACY_TARGETS", "CALIBRATION_EXAMPLES", "ClassificationTask", "format_report"]

#: Test accuracies whose first crossing time is reported in ``summary.json["time_to_accuracy"]``.
ACCURACY_TARGETS = (0.99, 0.995, 0.996)
#: The training examples (the first, as stored) on which each evaluation sets the limits of a good
#: reconstruction (:func:`~capsnets.inference.calibrate_reconstruction`), for models with a decoder.
CALIBRATION_EXAMPLES = 2_000


class ClassificationTask(Task):
    """One class per image (:class:`~capsnets.data.base.TensorData`): accuracy, per-class accuracy, confusion matrix.

    The ``best`` checkpoint is the one of highest test accuracy; ``summary.json`` records when each of
    :data:`~capsnets.engine.tasks.classification.ACCURACY_TARGETS` was first reached. ``capsnets evaluate`` writes the
    accuracy, per-class accuracy and confusion matrix (``STEM.json``, ``STEM_confusion.png``); ``capsnets predict``
    answers with a class and whether it is uncertain (:func:`~capsnets.inference.predict`). For a model with a
    decoder, each evaluation also sets the limits of a good reconstruction on the first
    :data:`~capsnets.engine.tasks.classification.CALIBRATION_EXAMPLES` training examples, which its checkpoints
    record (``reconstruction_limits``) and ``predict`` holds every answer to; not where the training images are
    stored at another size than the test split's (cropped by the loader, as smallNORB's are).

    Args:
        train_data: the run's training split (None outside a training run); its ``images`` set the limits.
    """

    name = "classification"
    model_task = "classification"
    best_metric = "test_accuracy"

    def __init__(self, train_data: Any = None) -> None:
        super().__init__(train_data)
        images = getattr(train_data, "images", None)
        self.calibration_images = images[:CALIBRATION_EXAMPLES] if isinstance(images, Tensor) else None

    # -- a training run ----------------------------------------------------------------------------------------
    def train_metrics(self, output: Any, targets: Tensor) -> dict[str, Tensor]:
        correct = (output.scores.detach().argmax(dim=-1) == targets).sum()
        return {"train_accuracy": correct.double() / len(targets)}

    def evaluate(self, model, data, batch_size: int, device, amp: str, criterion, context) -> dict[str, Any]:
        evaluation = evaluate(model, data, batch_size, device, amp, criterion, context=context)
        record = {"test_loss": evaluation["loss"], "test_accuracy": evaluation["accuracy"]}
        if self._calibrates(data):
            limits = calibrate_reconstruction(model, self.calibration_images, batch_size=batch_size)
            if limits is not None:
                record["reconstruction_limits"] = limits
        return record

    def _calibrates(self, data: Any) -> bool:
        """Whether the training images are stored as the model reads the test split's: not where the loader crops
        or resizes them first (the smallNORB protocol's random crops)."""
        images = self.calibration_images
        tested = getattr(data, "images", None)
        return (
            images is not None
            and len(images) > 0
            and isinstance(tested, Tensor)
            and images.shape[1:] == tested.shape[1:]
        )

    def meta(self, history: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, Any]:
        """The limits of a good reconstruction set at ``record``'s evaluation, if it set them."""
        limits = record.get("reconstruction_limits")
        return {"reconstruction_limits": limits} if limits is not None else {}

    def summary(self, history: list[dict[str, Any]], best: dict[str, Any]) -> dict[str, Any]:
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
        evaluation = evaluate(model, data, batch_size, device, amp)
        shown = f"{checkpoint}, test accuracy {100 * evaluation['accuracy']:.2f}%)"
        paths = reporting.save_figures(
            run_dir,
            confusion=evaluation["confusion_matrix"],
            class_names=class_names(data),
            checkpoint=shown,
            samples=self.reconstructions(model, data, 16, device),
        )
        return paths, shown

    @classmethod
    def summary_lines(cls, summary: dict[str, Any]) -> list[str]:
        return [
            f"test accuracy {percent(summary['test_accuracy'])} (best {percent(summary['best_test_accuracy'])} "
            f"at epoch {summary['best_epoch']}{chosen_on(summary)})"
        ]

    # -- a checkpoint on a test split ----------------------------------------------------------------------------
    def score(self, model: nn.Module, data: Any, *, batch_size: int, device, meta: dict[str, Any]) -> dict[str, Any]:
        return evaluate(model, data, batch_size, device)

    def check_ensemble(self) -> None:
        """Classifiers' scores can be averaged: an ensemble of them is scored."""

    def report_files(self, out: Path, stem: str) -> list[tuple[Path, str]]:
        return [*super().report_files(out, stem), (out / f"{stem}_confusion.png", "figure")]

    def report(
        self, results: dict[str, Any], data: Any, out: Path, stem: str, record: dict[str, Any], title: str
    ) -> tuple[str, list[Path]]:
        """``OUT/STEM.json`` (``record`` and the results) and ``OUT/STEM_confusion.png``; the text is
        :func:`~capsnets.engine.tasks.format_report`."""
        # matplotlib is slow to import; only figures need it
        from capsnets.plots import plot_confusion_matrix  # noqa: PLC0415

        classes = class_names(data)
        entries = {
            "dataset": data.name,
            "count": results["count"],
            "accuracy": results["accuracy"],
            "per_class_accuracy": dict(zip(classes, results["per_class_accuracy"].tolist())),
            "confusion_matrix": results["confusion_matrix"].tolist(),
        }
        written = write_evaluation(out / f"{stem}.json", record, entries)
        png = plot_confusion_matrix(
            results["confusion_matrix"],
            classes,
            out / f"{stem}_confusion.png",
            title=f"{title} on {data.name or 'test'}",
        )
        return format_report(results, classes), [written, png]

    def _sample_labels(self, output: Any, data: Any, count: int) -> dict[str, Tensor | None]:
        return {"labels": data.labels[:count].cpu(), "predictions": output.scores.argmax(-1).cpu()}

    # -- images -------------------------------------------------------------------------------------------------
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
        """Each image's class (:func:`~capsnets.inference.predict`), named as the checkpoint names them."""
        return predict(
            model,
            files,
            classes=checkpoint_class_names(meta, int(model.num_classes)),
            dataset=meta.get("dataset"),
            batch_size=batch_size,
            invert=invert,
            thresholds=self._thresholds(meta, model),
        )

    def _thresholds(self, meta: dict[str, Any], model: nn.Module) -> list[float] | None:
        """The per-class thresholds :meth:`predict` applies (None: one class per image)."""
        return None

    def format_prediction(self, result: Prediction) -> str:
        """The class, its score and why it is uncertain if it is, what was adapted, and every class capsule's
        length."""
        unsure = f", unsure: {result.doubt}" if result.uncertain else ""
        line = f"{result.path}: {result.label} (score {result.score:.3f}{unsure}){adapted_note(result)}"
        if result.lengths:
            line += "\n    lengths: " + "  ".join(f"{name} {value:.3f}" for name, value in result.lengths.items())
        return line


def format_report(results: dict[str, Any], classes: list[str]) -> str:
    """Accuracy, per-class accuracy and the confusion matrix (:func:`~capsnets.engine.evaluate.evaluate`'s
    ``results``) as a plain-text table."""
    width = max(6, *(len(c) for c in classes))
    lines = [f"accuracy {percent(results['accuracy'])} on {results['count']} images", ""]
    lines += class_table(classes, {"accuracy": [percent(a) for a in results["per_class_accuracy"].tolist()]})
    lines += [
        "",
        "confusion matrix (rows: true class, columns: predicted)",
        " " * width + " ".join(f"{c:>{width}}" for c in classes),
    ]
    for name, row in zip(classes, results["confusion_matrix"].tolist()):
        lines.append(f"{name:>{width}}" + " ".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)
