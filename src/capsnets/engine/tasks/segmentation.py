"""The segmentation task: :class:`SegmentationTask`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from capsnets.engine import reporting
from capsnets.engine.evaluate import evaluate_segmentation
from capsnets.engine.tasks.base import Task, adapted_note
from capsnets.engine.tasks.report import chosen_on, class_names, class_table, percent, write_evaluation
from capsnets.inference import Prediction, mask_path, overlay_path, segment
from capsnets.validation import ArgumentError

__all__ = ["SegmentationTask"]


class SegmentationTask(Task):
    """A class per pixel (:class:`~capsnets.data.segmentation.SegmentationData`), for segmentation models.

    A data set of 2 classes (background and object) gets the binary model (``num_classes=1``: the object's probability),
    one of K > 2 classes a model of K maps. Each evaluation counts the test split's pixels
    (:func:`~capsnets.engine.evaluate.evaluate_segmentation`): the record gets ``test_mean_dice``, ``test_mean_iou``
    (over the classes but the background), ``test_pixel_accuracy`` and the per-class ``test_dice`` and ``test_iou``; the
    ``best`` checkpoint is the one of highest mean Dice. Images are not shifted or augmented (their masks would not
    follow). ``capsnets evaluate`` writes the same scores and the pixel confusion matrix; ``capsnets predict`` writes
    each image's mask and overlay (:func:`~capsnets.inference.segment`), as the training masks were written.
    """

    name = "segmentation"
    model_task = "segmentation"
    best_metric = "test_mean_dice"
    image_augmentation = False

    # -- a training run ----------------------------------------------------------------------------------------
    def model_defaults(self, data: Any) -> dict[str, Any]:
        maps = 1 if data.num_classes == 2 else data.num_classes
        return {"num_classes": maps, "input_size": list(data.input_shape)}

    def fits(self, model: nn.Module, data: Any) -> bool:
        """Whether ``model`` has a map per class of ``data`` (one or two for 2 classes) and its input size."""
        maps = {1, 2} if data.num_classes == 2 else {data.num_classes}
        return int(model.num_classes) in maps and tuple(model.input_size) == tuple(data.input_shape)

    def check_model(self, model: nn.Module, data: Any, names: tuple[str, str]) -> None:
        if not self.fits(model, data):
            raise ArgumentError(
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
        last, names = (tested[-1] if tested else {}), list(getattr(self.train_data, "classes", ()))

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
            class_names=class_names(data),
            samples=_segmentation_samples(model, data, device),
            checkpoint=shown,
        )
        return paths, shown

    @classmethod
    def summary_lines(cls, summary: dict[str, Any]) -> list[str]:
        """The mean Dice and IoU, and the ``best`` checkpoint's Dice of each class."""
        per_class = ", ".join(f"{name} {percent(dice)}" for name, dice in (summary.get("best_test_dice") or {}).items())
        return [
            f"test mean Dice {percent(summary['test_mean_dice'])}, IoU {percent(summary['test_mean_iou'])} (best "
            f"mean Dice {percent(summary['best_test_mean_dice'])} at epoch {summary['best_epoch']}{chosen_on(summary)}; "
            "per class: "
            f"{per_class})"
        ]

    # -- a checkpoint on a test split ----------------------------------------------------------------------------
    def score(self, model: nn.Module, data: Any, *, batch_size: int, device, meta: dict[str, Any]) -> dict[str, Any]:
        return evaluate_segmentation(model, data, batch_size, device)

    def report_files(self, out: Path, stem: str) -> list[tuple[Path, str]]:
        return [*super().report_files(out, stem), (out / f"{stem}_confusion.png", "figure")]

    def report(
        self, results: dict[str, Any], data: Any, out: Path, stem: str, record: dict[str, Any], title: str
    ) -> tuple[str, list[Path]]:
        """``OUT/STEM.json`` (``record``, per-class Dice and IoU, their means) and ``OUT/STEM_confusion.png`` (the
        pixel confusion matrix, rows normalised); the text is the per-class table."""
        # matplotlib is slow to import; only figures need it
        from capsnets.plots import plot_confusion_matrix  # noqa: PLC0415

        classes = class_names(data)
        entries = {
            "dataset": data.name,
            "count": results["count"],
            "mean_dice": _or_none(results["mean_dice"]),
            "mean_iou": _or_none(results["mean_iou"]),
            "pixel_accuracy": results["pixel_accuracy"],
            # NaN (a class neither present nor predicted) is null in JSON
            "dice": {c: _or_none(v) for c, v in zip(classes, results["dice"].tolist())},
            "iou": {c: _or_none(v) for c, v in zip(classes, results["iou"].tolist())},
            "confusion_matrix": results["confusion_matrix"].tolist(),
        }
        written = write_evaluation(out / f"{stem}.json", record, entries)
        png = plot_confusion_matrix(
            results["confusion_matrix"],
            classes,
            out / f"{stem}_confusion.png",
            normalize=True,
            title=f"{title} on {data.name}: pixels (rows: recall)",
        )
        table = class_table(
            classes,
            {
                "Dice": [percent(d) for d in results["dice"].tolist()],
                "IoU": [percent(i) for i in results["iou"].tolist()],
            },
        )
        summary = (
            f"mean Dice {percent(results['mean_dice'])}, mean IoU {percent(results['mean_iou'])} (the background left "
            f"out), pixel accuracy {percent(results['pixel_accuracy'])} on {results['count']} images"
        )
        return "\n".join([summary, "", *table]), [written, png]

    # -- images -------------------------------------------------------------------------------------------------
    def prediction_files(self, files: Sequence[Path], out: Path) -> list[tuple[Path, str, Path]]:
        """Each image's mask and overlay in ``out``.

        Raises:
            ArgumentError: two images would write the same mask (files of one name in different folders).
        """
        written: dict[Path, Path] = {}
        outputs = []
        for index, file in enumerate(files):
            target = mask_path(file, out, index)
            if target in written:
                raise ArgumentError(
                    f"'{written[target]}' and '{file}' would both write their mask to '{target}'; segment them in "
                    "two runs with different --out folders"
                )
            written[target] = file
            outputs += [(target, "mask", file), (overlay_path(file, out, index), "overlay", file)]
        return outputs

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
        """Each image's mask and overlay, written into ``out`` (:func:`~capsnets.inference.segment`)."""
        return segment(model, files, out, dataset=meta.get("dataset"), invert=invert, overwrite=overwrite)

    def format_prediction(self, result: Prediction) -> str:
        """The mask and overlay written, the foreground's share and, for more than 2 classes, each class's."""
        areas = result.areas
        shown = ", ".join(f"{name} {percent(area)}" for name, area in areas.items()) if len(areas) > 2 else ""
        share = f"{percent(result.foreground)} foreground" + (f": {shown}" if shown else "")
        return f"{result.path}: mask {result.mask}, overlay {result.overlay} ({share}){adapted_note(result)}"


def _or_none(value: float) -> float | None:
    """``value``, or None for NaN (JSON has no NaN)."""
    return None if value != value else value


@torch.no_grad()
def _segmentation_samples(model, data, device, count: int = 8) -> dict[str, Tensor]:
    """Inputs, true and predicted class masks of the first ``count`` examples."""
    was_training = model.training
    model.eval()
    images = data.images[:count].to(device)
    predicted = model(images).predicted_classes()
    model.train(was_training)
    return {"images": images.cpu(), "masks": data.masks[:count].long().cpu(), "predictions": predicted.cpu()}
