"""The multi-label task: :class:`MultilabelTask`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor, nn

from capsnets.engine import reporting
from capsnets.engine.evaluate import evaluate
from capsnets.engine.tasks.base import adapted_note
from capsnets.engine.tasks.classification import ClassificationTask
from capsnets.engine.tasks.report import class_names, class_table, percent, write_evaluation
from capsnets.inference import Prediction, checkpoint_class_names
from capsnets.models.output import independent_probabilities
from capsnets.validation import ArgumentError

__all__ = ["MULTILABEL_LOSSES", "THRESHOLD_EXAMPLES", "MultilabelTask"]

#: The per-class thresholds are chosen on at most this many training examples (the first ones).
THRESHOLD_EXAMPLES = 10_000
#: A classifier's loss on multi-label data, by its loss on one label per image: the losses that take multi-hot
#: targets stay (the margin loss is the paper's MultiMNIST loss, one term per class present or absent), the others
#: become binary cross-entropy.
MULTILABEL_LOSSES: dict[str, str] = {
    "margin": "margin",
    "binary_cross_entropy": "binary_cross_entropy",
    "cross_entropy": "binary_cross_entropy",
    "spread": "binary_cross_entropy",
}


class MultilabelTask(ClassificationTask):
    """Several classes per image (``TensorData.multilabel``: ``(N, K)`` multi-hot labels).

    A classifier trains with a loss that takes multi-hot targets
    (:data:`~capsnets.engine.tasks.multilabel.MULTILABEL_LOSSES`). Each evaluation first chooses every class's threshold
    to maximise its F1 on the first :data:`~capsnets.engine.tasks.multilabel.THRESHOLD_EXAMPLES` training examples
    (never on the test split), then scores the test split with them
    (:func:`~capsnets.engine.evaluate.multilabel_metrics`: mAP, micro and macro F1, exact-set accuracy as
    ``test_accuracy``); the ``best`` checkpoint is the one of highest test mAP, and every checkpoint records the
    thresholds, which ``capsnets evaluate`` and ``capsnets predict`` apply (0.5 for a checkpoint that records none).
    """

    name = "multilabel"
    best_metric = "test_map"

    def __init__(self, train_data: Any = None) -> None:
        super().__init__(train_data)
        self.threshold_data = None
        if train_data is not None:
            self.threshold_data = train_data.subset(min(len(train_data), THRESHOLD_EXAMPLES))

    # -- a training run ----------------------------------------------------------------------------------------
    def loss_name(self, name: str, default: str, given: bool) -> str:
        """The loss ``name`` if it takes multi-hot targets; the model's own (``given`` False) mapped by
        :data:`~capsnets.engine.tasks.multilabel.MULTILABEL_LOSSES`.

        Raises:
            ArgumentError: a loss asked for that takes one class per image.
        """
        name = super().loss_name(name, default, given)
        takes = sorted(set(MULTILABEL_LOSSES.values()))
        if given and name not in takes or name not in MULTILABEL_LOSSES:
            raise ArgumentError(
                f"loss {name!r} takes one class per image, and the data set has several labels per image; use "
                f"{' or '.join(takes)} (or leave --loss out for the model's own)",
                "loss",
            )
        return MULTILABEL_LOSSES[name]

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

    @classmethod
    def summary_lines(cls, summary: dict[str, Any]) -> list[str]:
        """The exact-set accuracy (as ``test accuracy``), then mAP and F1 where the ``best`` checkpoint has them."""
        lines = super().summary_lines(summary)
        if summary.get("best_test_map") is not None:
            lines.append(
                f"test mAP {percent(summary['test_map'])} (best {percent(summary['best_test_map'])}), micro F1 "
                f"{percent(summary['test_micro_f1'])}, macro F1 {percent(summary['test_macro_f1'])}"
            )
        return lines

    # -- a checkpoint on a test split ----------------------------------------------------------------------------
    def score(self, model: nn.Module, data: Any, *, batch_size: int, device, meta: dict[str, Any]) -> dict[str, Any]:
        """The scores at the thresholds the checkpoint records (0.5 where it records none)."""
        return evaluate(model, data, batch_size, device, thresholds=meta.get("thresholds"))

    def check_ensemble(self) -> None:
        raise ArgumentError(
            "an ensemble of multi-label models has no thresholds of its own; evaluate each checkpoint alone"
        )

    def report_files(self, out: Path, stem: str) -> list[tuple[Path, str]]:
        return [(out / f"{stem}.json", "evaluation")]

    def report(
        self, results: dict[str, Any], data: Any, out: Path, stem: str, record: dict[str, Any], title: str
    ) -> tuple[str, list[Path]]:
        """``OUT/STEM.json`` (``record``, mAP, F1, exact-set accuracy, and per class its average precision, F1 and
        threshold); the text gives them."""
        classes = class_names(data)
        columns = ("average_precision", "per_class_f1", "thresholds")
        per_class = {
            name: dict(zip(columns, values)) for name, *values in zip(classes, *(results[c].tolist() for c in columns))
        }
        entries = {
            "dataset": data.name,
            "count": results["count"],
            **{key: results[key] for key in ("mAP", "micro_f1", "macro_f1", "exact_match")},
            "per_class": per_class,
        }
        written = write_evaluation(out / f"{stem}.json", record, entries)
        table = class_table(
            classes,
            {
                "AP": [percent(row["average_precision"]) for row in per_class.values()],
                "F1": [percent(row["per_class_f1"]) for row in per_class.values()],
                "threshold": [f"{row['thresholds']:.3f}" for row in per_class.values()],
            },
        )
        summary = (
            f"mAP {percent(results['mAP'])}, micro F1 {percent(results['micro_f1'])}, macro F1 "
            f"{percent(results['macro_f1'])}, exact-set accuracy {percent(results['exact_match'])} on "
            f"{results['count']} images"
        )
        return "\n".join([summary, "", *table]), [written]

    def _sample_labels(self, output: Any, data: Any, count: int) -> dict[str, Tensor | None]:
        return {"labels": None, "predictions": None}  # no one class per image

    # -- images -------------------------------------------------------------------------------------------------
    def prediction_header(self, meta: dict[str, Any], model: nn.Module) -> dict[str, Any]:
        """The thresholds applied, by class name (none where the checkpoint records none: 0.5 each)."""
        if meta.get("thresholds") is None:
            return {}
        return {"thresholds": dict(zip(checkpoint_class_names(meta, int(model.num_classes)), meta["thresholds"]))}

    def _thresholds(self, meta: dict[str, Any], model: nn.Module) -> list[float]:
        """The thresholds the checkpoint records, else 0.5 for every class."""
        recorded = meta.get("thresholds")
        return list(recorded) if recorded is not None else [0.5] * int(model.num_classes)

    def format_prediction(self, result: Prediction) -> str:
        """The classes present with their probabilities, then every class's probability."""
        present = ", ".join(f"{name} ({value:.3f})" for name, value in result.labels.items()) or "no label"
        probabilities = "  ".join(f"{name} {value:.3f}" for name, value in result.scores.items())
        return f"{result.path}: {present}{adapted_note(result)}\n    probabilities: {probabilities}"
