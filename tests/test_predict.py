"""``capsnets predict`` and :mod:`capsnets.predict`: image files read and adapted to the model, predictions as text
and JSON, masks for segmentation models, clear errors for what cannot be read or adapted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import capsnets
from capsnets.cli import main
from capsnets.engine.checkpoint import save_checkpoint
from capsnets.models import load_model
from capsnets.predict import collect_image_files, predict, read_images
from capsnets.validation import ArgumentError


def _png(path: Path, array, mode: str = "L") -> Path:
    Image.fromarray(array, mode=mode).save(path)
    return path


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    """A small capsnet_digits run (figures stubbed)."""
    from capsnets.engine import reporting

    out = tmp_path_factory.mktemp("predict") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
        assert (
            main(
                [
                    "train",
                    "--model",
                    "capsnet_digits",
                    "--dataset",
                    "digits",
                    "--epochs",
                    "1",
                    "--limit-train",
                    "64",
                    "--limit-test",
                    "16",
                    "--device",
                    "cpu",
                    "--no-progress",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
    return out


def test_files_and_folders_are_collected_and_bad_ones_named(tmp_path):
    (tmp_path / "a").mkdir()
    one = _png(tmp_path / "a" / "one.png", torch.zeros(8, 8, dtype=torch.uint8).numpy())
    two = _png(tmp_path / "a" / "two.PNG", torch.zeros(8, 8, dtype=torch.uint8).numpy())
    (tmp_path / "a" / "notes.txt").write_text("not an image")
    assert collect_image_files([tmp_path / "a"]) == [one, two]
    assert collect_image_files([two, one]) == [two, one]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArgumentError, match="holds no image file"):
        collect_image_files([tmp_path / "empty"])
    with pytest.raises(FileNotFoundError, match="neither an image file nor a folder"):
        collect_image_files([tmp_path / "missing.png"])
    with pytest.raises(ValueError, match="notes.txt' is not an image that can be read"):
        read_images([tmp_path / "a" / "notes.txt"], (1, 8, 8))
    (tmp_path / "cut.png").write_bytes(one.read_bytes()[:30])
    with pytest.raises(ValueError, match="cut.png' is not an image that can be read"):
        read_images([tmp_path / "cut.png"], (1, 8, 8))


# predict -----------------------------------------------------------------------------------------------------------


def test_predictions_are_the_models_own_on_the_same_images(digits_run, tmp_path):
    from capsnets.data import load_dataset

    model = load_model(digits_run)
    data = load_dataset("digits", train=False)
    images = data.images[:12]
    files = [
        _png(tmp_path / f"{k}.png", images[k, 0].mul(255).round().to(torch.uint8).numpy()) for k in range(len(images))
    ]
    read, notes = read_images(files, model.input_size, "digits", invert="no")
    assert notes == [[]] * len(files)
    torch.testing.assert_close(read, images, rtol=0, atol=0.5 / 255 + 1e-6)  # PNG keeps 8 bits
    results = predict(model, read, paths=[str(f) for f in files], batch_size=5)
    with torch.no_grad():
        lengths = model(read).scores
    assert [r.index for r in results] == lengths.argmax(-1).tolist()
    for result, row in zip(results, lengths):
        assert result.label == str(result.index) and result.score == pytest.approx(float(row.max()))
        assert list(result.lengths) == [str(k) for k in range(10)] and result.scores == {}
        assert result.lengths[result.label] == pytest.approx(result.score)


def test_cnn_scores_are_softmax_probabilities():
    model = capsnets.create_model("cnn_baseline_narrow").eval()
    results = predict(model, torch.rand(3, *model.input_size))
    for result in results:
        assert sum(result.scores.values()) == pytest.approx(1.0, abs=1e-5) and result.lengths == {}
        assert result.score == max(result.scores.values())


def test_the_cli_prints_and_writes_json(digits_run, tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    _png(folder / "dark.png", torch.zeros(8, 8, dtype=torch.uint8).numpy())
    Image.new("RGB", (64, 48), "white").save(folder / "paper.jpg")
    assert (
        main(
            [
                "predict",
                "--checkpoint",
                str(digits_run),
                str(folder),
                "--json",
                str(tmp_path / "p.json"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"{folder / 'dark.png'}: " in out and "(score " in out and "lengths: 0 " in out
    assert "[converted colour (RGB) -> grayscale; resized 64x48 -> 8x8 (aspect ratio changed); inverted" in out
    record = json.loads((tmp_path / "p.json").read_text())
    assert record["model"] == "capsnet_digits" and record["dataset"] == "digits"
    assert [Path(p["path"]).name for p in record["predictions"]] == ["dark.png", "paper.jpg"]
    assert all(set(p) >= {"index", "label", "score", "lengths"} for p in record["predictions"])
    assert main(["predict", "--checkpoint", str(digits_run), str(folder / "dark.png"), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["predictions"][0]["label"] in [str(k) for k in range(10)]


def test_the_checkpoint_records_its_class_names(digits_run):
    model = load_model(digits_run)
    assert model.checkpoint_meta["classes"] == model.class_names == [str(k) for k in range(10)]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--checkpoint", "RUN", "missing.png"], "'missing.png' is neither an image file nor a folder"),
        (["--checkpoint", "RUN", "TEXT"], "is not an image that can be read"),
        (["--checkpoint", "NOWHERE", "IMAGE"], "nowhere' does not exist"),
        (["--checkpoint", "RUN", "IMAGE", "--batch-size", "0"], "--batch-size must be at least 1"),
        (["--checkpoint", "RUN", "IMAGE", "--device", "meta"], "the meta device holds shapes but no data"),
    ],
)
def test_the_cli_refuses_with_one_line(digits_run, tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    image = _png(tmp_path / "image.png", torch.zeros(8, 8, dtype=torch.uint8).numpy())
    (tmp_path / "text.png").write_text("hello")
    names = {
        "RUN": str(digits_run),
        "IMAGE": str(image),
        "TEXT": str(tmp_path / "text.png"),
        "NOWHERE": str(tmp_path / "nowhere"),
    }
    assert main(["predict", *(names.get(a, a) for a in argv)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("capsnets predict: error: ") and message in err and "\n" not in err


def test_segmentation_models_write_masks(tmp_path, capsys):
    model = capsnets.create_model("segcaps_small")
    save_checkpoint(
        tmp_path / "seg" / "best.safetensors",
        model=model,
        meta={"model": "segcaps_small", "model_args": model.model_args, "dataset": "segmentation"},
    )
    _png(tmp_path / "scan.png", torch.randint(0, 256, (40, 40), dtype=torch.uint8).numpy())
    assert (
        main(
            [
                "predict",
                "--checkpoint",
                str(tmp_path / "seg"),
                str(tmp_path / "scan.png"),
                "--out",
                str(tmp_path / "masks"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "scan.png: mask " in out and "foreground" in out and "[resized 40x40 -> 32x32]" in out
    mask = Image.open(tmp_path / "masks" / "scan_mask.png")
    assert mask.size == (32, 32) and set(np.unique(np.asarray(mask)).tolist()) <= {0, 255}


def test_models_that_neither_classify_nor_segment_are_refused(tmp_path, capsys):
    model = capsnets.create_model("transforming_autoencoder")
    save_checkpoint(
        tmp_path / "tae.safetensors",
        model=model,
        meta={"model": "transforming_autoencoder", "model_args": model.model_args, "dataset": "mnist"},
    )
    _png(tmp_path / "x.png", torch.zeros(28, 28, dtype=torch.uint8).numpy())
    assert main(["predict", "--checkpoint", str(tmp_path / "tae.safetensors"), str(tmp_path / "x.png")]) == 1
    assert (
        "'transforming_autoencoder' is for autoencoder; predict classifies or segments images"
        in capsys.readouterr().err
    )
