"""The tasks without the command line: each task scores a model, writes its report, answers for image files and
shows the answers; one registry names them all; the command line prints what the task returns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import capsnets
from capsnets.cli import main
from capsnets.data import load_dataset
from capsnets.data.base import TensorData
from capsnets.data.segmentation import SegmentationData
from capsnets.engine.checkpoint import save_checkpoint
from capsnets.engine.tasks import (
    TASKS,
    ClassificationTask,
    MultilabelTask,
    ReconstructionTask,
    SegmentationTask,
    SynthesisTask,
    checkpoint_task,
    data_task,
    task_for,
    task_named,
)
from capsnets.inference import Prediction
from capsnets.losses import LOSS_TASKS
from capsnets.models.registry import MODEL_TASKS
from capsnets.outputs import MARK
from capsnets.validation import ArgumentError


@pytest.fixture(scope="module")
def digits():
    torch.manual_seed(0)
    return capsnets.create_model("capsnet_digits").eval(), load_dataset("digits", train=False).subset(40)


def _png(path: Path, size: int, seed: int = 0) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(path)
    return path


# one registry ---------------------------------------------------------------------------------------------------


def test_one_registry_names_every_task_and_covers_every_model_task():
    assert all(TASKS[name].name == name for name in TASKS)
    assert {task.model_task for task in TASKS.values()} == set(MODEL_TASKS)
    assert set(LOSS_TASKS.values()) <= set(MODEL_TASKS)
    assert task_named("segmentation") is SegmentationTask
    with pytest.raises(ArgumentError, match="unknown task 'pixels'; the tasks are classification, multilabel"):
        task_named("pixels")


def test_the_task_follows_the_data_and_the_checkpoint(digits):
    _, data = digits
    several = TensorData(data.images, torch.zeros(len(data), 10), 10, name="pairs")
    masks = SegmentationData(data.images, torch.zeros(len(data), 1, 8, 8), num_classes=2)
    assert [data_task(d) for d in (data, several, masks)] == ["classification", "multilabel", "segmentation"]
    assert type(task_for("capsnet_digits", "classification", several, "pairs")) is MultilabelTask
    assert task_for("capsnet_digits", "classification", data, "digits", training=False).train_data is None
    with pytest.raises(ValueError, match="is a classification model, and dataset 'masks' is segmentation data"):
        task_for("capsnet_digits", "classification", masks, "masks")
    with pytest.raises(ValueError, match="is an autoencoder model, and dataset 'digits' is classification data"):
        task_for("transforming_autoencoder", "autoencoder", data, "digits", training=False)
    assert type(checkpoint_task({"model": "capsnet_digits"})) is ClassificationTask
    assert type(checkpoint_task({"model": "capsnet_digits", "multilabel": True})) is MultilabelTask
    assert type(checkpoint_task({"model": "unet_small"})) is SegmentationTask
    assert type(checkpoint_task({"model": "transforming_autoencoder"})) is ReconstructionTask
    assert type(checkpoint_task({"model": "capspix2pix_small"})) is SynthesisTask


# classification -------------------------------------------------------------------------------------------------


def test_classification_scores_reports_and_predicts(digits, tmp_path):
    model, data = digits
    task = ClassificationTask()
    results = task.score(model, data, batch_size=16, device="cpu", meta={})
    assert results["count"] == 40 and results["confusion_matrix"].sum() == 40
    files = task.report_files(tmp_path, "evaluation_x")
    assert [(path.name, purpose) for path, purpose in files] == [
        ("evaluation_x.json", "evaluation"),
        ("evaluation_x_confusion.png", "figure"),
    ]
    text, written = task.report(results, data, tmp_path, "evaluation_x", {"checkpoint": "c", "epoch": 3}, "c")
    assert written == [path for path, _ in files] and all(path.is_file() for path in written)
    report = json.loads(written[0].read_text())
    assert list(report) == [MARK, "checkpoint", "epoch", "dataset", "count", "accuracy", "per_class_accuracy",
                            "confusion_matrix"]  # fmt: skip
    assert report["accuracy"] == pytest.approx(results["accuracy"]) and list(report["per_class_accuracy"]) == list(
        data.classes
    )
    assert text.startswith(f"accuracy {100 * results['accuracy']:.2f}% on 40 images")
    assert "confusion matrix (rows: true class, columns: predicted)" in text
    samples = task.reconstructions(model, data, 4, "cpu")
    assert samples["reconstructions"].shape == (4, 1, 8, 8) and torch.equal(samples["labels"], data.labels[:4])

    image = _png(tmp_path / "digit.png", 8)
    meta = {"model": "capsnet_digits", "dataset": "digits", "classes": [f"c{k}" for k in range(10)]}
    assert task.prediction_files([image], tmp_path / "masks") == []
    (answer,) = task.predict(model, [image], meta=meta, out=tmp_path, batch_size=4, invert="no", overwrite=False)
    assert answer.label in meta["classes"] and set(answer.lengths) == set(meta["classes"])
    assert task.format_prediction(answer).startswith(f"{image}: {answer.label} (score {answer.score:.3f}")
    assert "\n    lengths: c0 " in task.format_prediction(answer)
    assert task.prediction_header(meta, model) == {}


def test_an_ensemble_is_scored_for_classifiers_only():
    ClassificationTask().check_ensemble()
    with pytest.raises(ArgumentError, match="an ensemble of multi-label models has no thresholds of its own"):
        MultilabelTask().check_ensemble()
    with pytest.raises(ArgumentError, match="an ensemble of segmentation models is not scored"):
        SegmentationTask().check_ensemble()


# multi-label ----------------------------------------------------------------------------------------------------


def test_multilabel_scores_at_the_checkpoints_thresholds_and_answers_with_sets(digits, tmp_path):
    model, data = digits
    targets = torch.nn.functional.one_hot(data.labels, 10).float()
    targets[:, 0] = 1.0  # every image also shows class 0
    several = TensorData(data.images, targets, 10, classes=list(data.classes), name="pairs")
    task = MultilabelTask()
    thresholds = [0.25] * 10
    results = task.score(model, several, batch_size=16, device="cpu", meta={"thresholds": thresholds})
    assert results["thresholds"].tolist() == thresholds and 0 <= results["mAP"] <= 1
    assert [path.name for path, _ in task.report_files(tmp_path, "e")] == ["e.json"]  # no confusion matrix
    text, written = task.report(results, several, tmp_path, "e", {"checkpoint": "c"}, "c")
    report = json.loads(written[0].read_text())
    assert [report[key] for key in ("dataset", "count")] == ["pairs", 40]
    assert report["per_class"]["0"]["thresholds"] == pytest.approx(0.25)
    assert text.splitlines()[0].startswith("mAP ") and "threshold" in text.splitlines()[2]
    assert task.reconstructions(model, several, 2, "cpu")["labels"] is None  # no one class per image

    meta = {"model": "capsnet_digits", "multilabel": True, "thresholds": [0.0] * 9 + [1.0]}
    image = _png(tmp_path / "x.png", 8)
    (answer,) = task.predict(model, [image], meta=meta, out=tmp_path, batch_size=2, invert="no", overwrite=False)
    assert set(answer.labels) == {str(k) for k in range(9)}  # at least 0, and never above 1 (bar ties)
    assert task.prediction_header(meta, model) == {"thresholds": dict(zip(map(str, range(10)), meta["thresholds"]))}
    line = task.format_prediction(answer)
    assert line.startswith(f"{image}: ") and "\n    probabilities: 0 " in line
    summary = {"test_accuracy": 0.5, "best_test_accuracy": 0.6, "best_epoch": 2, "test_map": 0.7,
               "best_test_map": 0.8, "test_micro_f1": 0.1, "test_macro_f1": 0.2}  # fmt: skip
    assert task.summary_lines(summary) == [
        "test accuracy 50.00% (best 60.00% at epoch 2)",
        "test mAP 70.00% (best 80.00%), micro F1 10.00%, macro F1 20.00%",
    ]


# segmentation ---------------------------------------------------------------------------------------------------


def test_segmentation_scores_reports_and_writes_masks(tmp_path):
    torch.manual_seed(0)
    model = capsnets.create_model("unet_small", num_classes=1, input_size=[1, 16, 16]).eval()
    images = torch.rand(6, 1, 16, 16)
    data = SegmentationData(images, (images > 0.5).float(), num_classes=2, classes=("sky", "sea"), name="shapes")
    task = SegmentationTask()
    assert task.fits(model, data)
    results = task.score(model, data, batch_size=4, device="cpu", meta={})
    text, written = task.report(results, data, tmp_path, "e", {"checkpoint": "c"}, "c")
    assert [path.name for path in written] == ["e.json", "e_confusion.png"]
    report = json.loads(written[0].read_text())
    assert list(report["dice"]) == ["sky", "sea"] and len(report["confusion_matrix"]) == 2
    assert text.startswith("mean Dice ") and "(the background left out)" in text

    files = [_png(tmp_path / "a.png", 16), _png(tmp_path / "b.png", 16, seed=1)]
    out = tmp_path / "masks"
    outputs = task.prediction_files(files, out)
    assert [(path.name, what) for path, what, _ in outputs] == [
        ("a_mask.png", "mask"),
        ("a_overlay.png", "overlay"),
        ("b_mask.png", "mask"),
        ("b_overlay.png", "overlay"),
    ]
    (tmp_path / "other").mkdir()
    with pytest.raises(ArgumentError, match="would both write their mask to"):
        task.prediction_files([files[0], _png(tmp_path / "other" / "a.png", 16)], out)
    answers = task.predict(
        model, files, meta={"model": "unet_small"}, out=out, batch_size=2, invert="no", overwrite=False
    )
    assert all(Path(answer.mask).is_file() and Path(answer.overlay).is_file() for answer in answers)
    line = task.format_prediction(answers[0])
    assert (
        line.startswith(f"{files[0]}: mask {answers[0].mask}, overlay {answers[0].overlay} (") and "foreground" in line
    )
    summary = {"test_mean_dice": 0.5, "test_mean_iou": 0.4, "best_test_mean_dice": 0.6, "best_epoch": 1,
               "best_test_dice": {"sky": 0.9, "sea": 0.6}}  # fmt: skip
    assert task.summary_lines(summary) == [
        "test mean Dice 50.00%, IoU 40.00% (best mean Dice 60.00% at epoch 1; per class: sky 90.00%, sea 60.00%)"
    ]


# the tasks whose models make images -----------------------------------------------------------------------------


@pytest.mark.parametrize("task", [ReconstructionTask(), SynthesisTask()])
def test_the_image_making_tasks_refuse_what_capsnets_does_not_do_for_them(task, tmp_path):
    model = torch.nn.Linear(1, 1)
    with pytest.raises(ArgumentError, match=f"{task.name} models are not scored by capsnets evaluate"):
        task.score(model, None, batch_size=1, device="cpu", meta={})
    with pytest.raises(ArgumentError, match=f"'m' is for {task.model_task}; predict classifies or segments images"):
        task.predict(model, [], meta={"model": "m"}, out=tmp_path, batch_size=1, invert="no", overwrite=False)
    with pytest.raises(ArgumentError, match=f"{task.name} models are not trained by capsnets.engine"):
        task.evaluate(model, None, 1, "cpu", "off", None, None)


# the command line prints what the task returns --------------------------------------------------------------------


class _Marked(ClassificationTask):
    """A classification task whose report, answers and summary lines say that they came from it."""

    def report(self, results, data, out, stem, record, title):
        path = out / f"{stem}.json"
        path.write_text("{}")
        return f"marked report of {results['count']} images", [path]

    def format_prediction(self, result: Prediction) -> str:
        return f"marked answer {result.label}"

    def prediction_header(self, meta, model):
        return {"marked": True}

    @classmethod
    def summary_lines(cls, summary):
        return [f"marked summary of {summary['model']}"]


def test_the_command_line_prints_and_writes_what_the_task_returns(digits, tmp_path, monkeypatch, capsys):
    model, _ = digits
    checkpoint = tmp_path / "run" / "best.safetensors"
    checkpoint.parent.mkdir()
    meta = {"model": "capsnet_digits", "model_args": model.model_args, "dataset": "digits", "epoch": 1}
    save_checkpoint(checkpoint, model=model, meta=meta)
    monkeypatch.setitem(TASKS, "classification", _Marked)
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["marked report of 360 images", f"wrote {checkpoint.parent / 'evaluation_best_digits.json'}"]

    image = _png(tmp_path / "x.png", 8)
    assert main(["predict", "--checkpoint", str(checkpoint), "--device", "cpu", str(image)]) == 0
    assert capsys.readouterr().out.startswith("marked answer ")
    assert main(["predict", "--checkpoint", str(checkpoint), "--device", "cpu", str(image), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["marked"] is True


def test_train_prints_the_lines_of_its_task(tmp_path, monkeypatch, capsys):
    from capsnets.engine import reporting

    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    monkeypatch.setitem(TASKS, "classification", _Marked)
    argv = ["train", "--epochs", "1", "--limit-train", "64", "--limit-test", "32", "--batch-size", "32"]
    assert main([*argv, "--device", "cpu", "--no-progress", "--out", str(tmp_path / "run")]) == 0
    assert "\nmarked summary of capsnet_digits\n" in capsys.readouterr().out
