"""capsnets train / evaluate / reconstruct / predict on a multi-label folder (images/ + labels.csv)."""

import json
import math

import numpy as np
import pytest
from PIL import Image

from capsnets.checkpoints import load_checkpoint
from capsnets.cli import main
from capsnets.losses import create_loss


def write_multilabel_folder(root, count=24, size=8):
    """Images with a bright left half (class ``left``), right half (``right``), both or neither."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    rows = ["file,labels"]
    for i in range(count):
        present = [name for name, bit in (("left", i % 2), ("right", i // 2 % 2)) if bit]
        pixels = rng.integers(0, 40, (size, size), dtype=np.uint8)
        if "left" in present:
            pixels[:, : size // 2] += 200
        if "right" in present:
            pixels[:, size // 2 :] += 200
        Image.fromarray(pixels, "L").save(root / "images" / f"{i:02d}.png")
        rows.append(f"{i:02d}.png,{' '.join(present)}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root


def train_argv(data, out, model, epochs, *extra):
    return [
        "train",
        "--model",
        model,
        "--dataset",
        f"folder:{data}",
        "--epochs",
        str(epochs),
        "--batch-size",
        "4",
        "--no-progress",
        "--device",
        "cpu",
        "--out",
        str(out),
        *extra,
    ]


def test_train_resume_and_predict_a_multilabel_folder(tmp_path, capsys):
    data, out = write_multilabel_folder(tmp_path / "shapes"), tmp_path / "run"
    assert main(train_argv(data, out, "capsnet_digits", 1)) == 0
    assert main(train_argv(data, out, "capsnet_digits", 2, "--resume")) == 0
    printed = capsys.readouterr().out
    assert "test mAP" in printed and "micro F1" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == 2 and 0 <= summary["test_map"] <= 1 and summary["best_test_map"] is not None
    assert {"test_micro_f1", "test_macro_f1", "test_accuracy"} <= set(summary) and len(summary["thresholds"]) == 2
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and all(len(r["thresholds"]) == 2 for r in records)
    best = load_checkpoint(out / "best.safetensors")
    assert best.meta["multilabel"] and best.meta["classes"] == ["left", "right"]
    best_record = max(records, key=lambda r: r["test_map"])
    assert best.meta["thresholds"] == best_record["thresholds"] and best.meta["epoch"] == best_record["epoch"]
    assert not (out / "confusion_matrix.png").exists()

    assert main(["evaluate", "--checkpoint", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "exact-set accuracy" in printed and "threshold" in printed
    report = json.loads(next(out.glob("evaluation_best_*.json")).read_text())
    assert math.isclose(report["mAP"], best_record["test_map"]) and report["count"] == 5
    assert [report["per_class"][name]["thresholds"] for name in ("left", "right")] == pytest.approx(
        best.meta["thresholds"]
    )

    assert main(["reconstruct", "--checkpoint", str(out), "--n", "4"]) == 0  # no single class per image to show
    assert "reconstructions_best.png" in capsys.readouterr().out

    predictions = tmp_path / "predictions.json"
    assert main(["predict", str(data / "images"), "--checkpoint", str(out), "--json", str(predictions)]) == 0
    printed = capsys.readouterr().out
    assert "00.png: " in printed and "probabilities: left" in printed
    written = json.loads(predictions.read_text())
    assert written["thresholds"] == dict(zip(["left", "right"], best.meta["thresholds"]))
    assert len(written["predictions"]) == 24
    for record in written["predictions"]:
        assert set(record["scores"]) == {"left", "right"}
        chosen = {name for name, p in record["scores"].items() if p >= written["thresholds"][name]}
        assert set(record["labels"]) == chosen  # the set of labels, even when empty


def test_cnn_baseline_trains_with_binary_cross_entropy(tmp_path, capsys, monkeypatch):
    from capsnets.engine import trainer

    built = []
    monkeypatch.setattr(trainer, "create_loss", lambda name, **kw: built.append(name) or create_loss(name, **kw))
    data, out = write_multilabel_folder(tmp_path / "shapes", size=28), tmp_path / "run"
    assert main(train_argv(data, out, "cnn_baseline_narrow", 1)) == 0
    assert built == ["binary_cross_entropy"] and json.loads((out / "summary.json").read_text())["test_map"] >= 0
    # a loss of one class per image is refused, before anything is written
    assert main(train_argv(data, tmp_path / "ce", "cnn_baseline_narrow", 1, "--loss", "cross_entropy")) == 1
    assert "takes one class per image" in capsys.readouterr().err and not (tmp_path / "ce" / "config.yaml").exists()
