"""What a run leaves in its directory: ``metrics.jsonl``, ``summary.json`` and figures.

An evaluation's entries are named by the split scored: ``test_*`` for the test split, ``val_*`` for the validation
split (:func:`validation_entries`), which alone chooses the ``best`` checkpoint (:func:`best_entries` says so in
the summary). Only rank 0 writes files. Figures come from :mod:`capsnets.plots`; the trainer passes plain tensors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from torch import Tensor

from capsnets.files import FileWriteError, atomic_write_text, read_json_lines

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CURVES_FILE = "training_curves.png"
CONFUSION_FILE = "confusion_matrix.png"
RECONSTRUCTIONS_FILE = "reconstructions.png"
SEGMENTATIONS_FILE = "segmentations.png"


#: The prefix of a task's evaluation entries (``test_accuracy``), and of the same entries on the validation split.
TEST_PREFIX, VALIDATION_PREFIX = "test_", "val_"


def validation_key(metric: str) -> str:
    """The record entry of ``metric`` (a task's ``test_*`` name) on the validation split.

    Examples:
        >>> validation_key("test_accuracy")
        'val_accuracy'
    """
    return VALIDATION_PREFIX + metric.removeprefix(TEST_PREFIX)


def validation_entries(entries: dict[str, Any]) -> dict[str, Any]:
    """A task's evaluation entries (``test_loss``, ``test_accuracy``...) as the validation split's (``val_loss``...);
    entries not named by a split (a multi-label run's ``thresholds``) are kept as they are."""
    return {validation_key(k) if k.startswith(TEST_PREFIX) else k: v for k, v in entries.items()}


def best_entries(best: dict[str, Any], metric: str, validation: Any) -> dict[str, Any]:
    """The summary's account of the ``best`` checkpoint: the split that chose it (``"validation"``, or None when
    the run had no validation split and its result is the last epoch), the entry that chose it and its value, and
    the validation split's size."""
    key = validation_key(metric)
    return {
        "best_chosen_on": "validation" if best else None,
        "best_chosen_by": key if best else None,
        f"best_{key}": best.get(key),
        "validation_examples": None if validation is None else len(validation),
    }


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one epoch's record as a JSON line to ``metrics.jsonl``.

    Raises:
        FileWriteError: the line could not be written (a full disk...); the checkpoint holds the record, and
            ``--resume`` rewrites the file from it (dropping what part of the line was written).
    """
    path = run_dir / METRICS_FILE
    try:
        with open(path, "a") as handle:
            handle.write(json.dumps(_finite_or_none(record)) + "\n")
    except OSError as err:
        raise FileWriteError(path, err) from err


def read_metrics(run_dir: Path, last_epoch: int | None = None) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` (up to ``last_epoch``), or [] if there is none; a torn last line is left
    out with a warning (:func:`capsnets.files.read_json_lines`)."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return []
    records = read_json_lines(path, recover="delete the file: --resume rewrites it from the checkpoint")
    return [r for r in records if last_epoch is None or _epoch(r) <= last_epoch]


def _epoch(record: dict[str, Any]) -> float:
    epoch = record.get("epoch", 0)
    return epoch if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) else 0


def write_metrics(run_dir: Path, records: list[dict[str, Any]]) -> None:
    """Replace ``metrics.jsonl`` by ``records``, atomically."""
    text = "".join(json.dumps(_finite_or_none(record)) + "\n" for record in records)
    atomic_write_text(run_dir / METRICS_FILE, text)


def write_summary(run_dir: Path, summary: dict[str, Any]) -> Path:
    """Write ``summary.json`` (atomically)."""
    text = json.dumps(_finite_or_none(summary), indent=2) + "\n"
    return atomic_write_text(run_dir / SUMMARY_FILE, text)


def drawn_figures(run_dir: Path) -> dict[str, Any] | None:
    """The ``figures`` and ``figures_checkpoint`` entries of the run's ``summary.json`` when every figure it lists
    is there; None when a figure is missing, or the summary is (a run killed while drawing them)."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    figures = summary.get("figures") if isinstance(summary, dict) else None
    if not isinstance(figures, list) or not all(
        isinstance(p, str) and (run_dir / Path(p).name).is_file() for p in figures
    ):
        return None
    return {"figures": figures, "figures_checkpoint": summary.get("figures_checkpoint")}


def save_figures(
    run_dir: Path,
    *,
    confusion: Tensor | None,
    class_names: list[str],
    samples: dict[str, Tensor] | None,
    checkpoint: str,
) -> list[Path]:
    """Training curves, confusion matrix and (if ``samples`` is given) inputs vs reconstructions.

    Args:
        confusion: ``(K, K)`` confusion matrix of the checkpoint shown, or None (multi-label data: none is drawn).
        class_names: ``K`` names.
        samples: ``images``, ``reconstructions``, ``labels``, ``predictions`` of a few test examples,
            or None when the model has no decoder.
        checkpoint: which checkpoint the confusion matrix and reconstructions show (in their titles).
    """
    # matplotlib is slow to import; only the end of a run draws figures
    from capsnets import plots  # noqa: PLC0415

    paths = [plots.plot_training_curves(run_dir / METRICS_FILE, run_dir / CURVES_FILE)]
    if confusion is not None:
        paths.append(
            plots.plot_confusion_matrix(
                confusion, class_names, run_dir / CONFUSION_FILE, title=f"Confusion matrix of {checkpoint}"
            )
        )
    if samples is not None:
        paths.append(
            plots.plot_reconstructions(
                samples["images"],
                samples["reconstructions"],
                run_dir / RECONSTRUCTIONS_FILE,
                labels=samples["labels"],
                predictions=samples["predictions"],
                title=f"Inputs and reconstructions of {checkpoint}",
                class_names=class_names or None,
            )
        )
    return [Path(p) for p in paths]


def save_segmentation_figures(
    run_dir: Path, *, confusion: Tensor, class_names: list[str], samples: dict[str, Tensor], checkpoint: str
) -> list[Path]:
    """Training curves, the pixel confusion matrix (rows normalised: each class's recall) and a few test images
    with their true and predicted masks.

    Args:
        confusion: ``(K, K)`` pixel confusion matrix of the checkpoint shown.
        class_names: ``K`` names.
        samples: ``images``, ``masks`` and ``predictions`` (class indices) of a few test images.
        checkpoint: which checkpoint the figures show (in their titles).
    """
    # matplotlib is slow to import; only the end of a run draws figures
    from capsnets import plots  # noqa: PLC0415

    return [
        Path(plots.plot_training_curves(run_dir / METRICS_FILE, run_dir / CURVES_FILE)),
        Path(
            plots.plot_confusion_matrix(
                confusion,
                class_names,
                run_dir / CONFUSION_FILE,
                normalize=True,
                title=f"Pixel confusion matrix (rows: recall) of {checkpoint}",
            )
        ),
        Path(
            plots.plot_segmentations(
                samples["images"],
                samples["masks"],
                samples["predictions"],
                run_dir / SEGMENTATIONS_FILE,
                class_names=class_names,
                title=f"Test images, true and predicted masks of {checkpoint}",
            )
        ),
    ]


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN/inf: replace them with None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value
