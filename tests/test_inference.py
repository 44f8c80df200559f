"""``capsnets predict``, :func:`capsnets.predict` and :mod:`capsnets.inference`: images (files, folders, PIL
images, arrays, tensors) prepared for the model, predictions with their uncertainty as text and JSON, masks for
segmentation models, clear errors for what cannot be read or adapted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image
from torch import nn

import capsnets
from capsnets.cli import main
from capsnets.engine.checkpoint import save_checkpoint
from capsnets.engine.tasks import ClassificationTask
from capsnets.inference import (
    Prediction,
    calibrate_reconstruction,
    collect_image_files,
    predict,
    read_images,
    reconstruction_errors,
    segment,
    uncertainty,
)
from capsnets.models import ModelOutput, load_model
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
    (tmp_path / "a" / "._one.png").write_bytes(b"\0\5\26\7")  # a copied volume's metadata, hidden
    (tmp_path / "a" / ".cache").mkdir()
    _png(tmp_path / "a" / ".cache" / "three.png", torch.zeros(8, 8, dtype=torch.uint8).numpy())
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
    results = predict(model, files, dataset="digits", invert="no", batch_size=5)
    with torch.no_grad():
        lengths = model(read).scores
    assert [r.index for r in results] == lengths.argmax(-1).tolist()
    assert [r.path for r in results] == [str(f) for f in files]
    for result, row in zip(results, lengths):
        assert result.label == str(result.index) and result.score == pytest.approx(float(row.max()))
        assert list(result.lengths) == [str(k) for k in range(10)] == list(result.scores)
        assert result.lengths[result.label] == pytest.approx(result.score) == result.scores[result.label]
        assert result.scores == pytest.approx(dict(zip(result.lengths, row.clamp(0, 1).tolist())), abs=1e-6)
        assert max(result.scores, key=result.scores.get) == result.label
    batch = predict(model, read)  # a prepared batch is taken as it is
    assert [r.index for r in batch] == [r.index for r in results] and all(r.path is None for r in batch)


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
    assert all(set(p) >= {"index", "label", "score", "scores", "lengths", "uncertain"} for p in record["predictions"])
    assert all(p["scores"][p["label"]] == p["score"] for p in record["predictions"])
    for p in record["predictions"]:  # the text says why an answer is uncertain, the JSON too
        line = next(line for line in out.splitlines() if line.startswith(p["path"] + ": "))
        assert ("unsure: " in line) == p["uncertain"] == ("doubt" in p)
        assert not p["uncertain"] or f"unsure: {p['doubt']})" in line
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


def test_masks_of_several_classes_are_written_as_the_training_masks_were(tmp_path):
    torch.manual_seed(0)
    model = capsnets.create_model("unet_small", input_size=(1, 16, 16), num_classes=3)
    palette = [0, 0, 0, 200, 10, 10, 10, 200, 10] + [0] * 759
    image = torch.rand(1, 16, 16)
    (result,) = segment(model, image, tmp_path, mask_format={"mode": "P", "values": [0, 1, 2], "palette": palette})
    mask = Image.open(result.mask)
    assert mask.mode == "P" and mask.getpalette()[:9] == palette[:9]
    classes = np.asarray(mask)
    expected = model(image[None]).predicted_classes()[0, 0].numpy()
    assert np.array_equal(classes, expected) and set(result.areas) == {"0", "1", "2"}
    assert result.foreground == pytest.approx((expected > 0).mean())
    overlay = np.asarray(Image.open(result.overlay))  # the image where the background is, tinted elsewhere
    grey = np.round(image[0].numpy() * 255)
    assert overlay.shape == (16, 16, 3) and np.array_equal(overlay[expected == 0, 0], grey[expected == 0])
    (indices,) = segment(model, image, tmp_path / "plain", classes=["sky", "sea", "sand"])  # no format: indices
    assert set(np.unique(np.asarray(Image.open(indices.mask))).tolist()) <= {0, 1, 2}
    assert list(indices.areas) == ["sky", "sea", "sand"]


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


# capsnets.predict: any input, the model's own names and data set --------------------------------------------------


def test_predict_is_a_top_level_function_and_its_module_is_inference():
    assert capsnets.predict is capsnets.inference.predict and callable(capsnets.predict)
    assert importlib.util.find_spec("capsnets.predict") is None  # a module of that name would shadow the function
    assert capsnets.Prediction is Prediction


def test_every_kind_of_input_gives_the_same_answer(tmp_path):
    model = capsnets.create_model("capsnet_digits").eval()
    pixels = torch.randint(0, 256, (8, 8), dtype=torch.uint8)
    folder = tmp_path / "in"
    folder.mkdir()
    file = _png(folder / "a.png", pixels.numpy())
    inputs = [
        str(file),
        file,
        folder,
        Image.fromarray(pixels.numpy()),
        pixels.numpy(),
        pixels.float() / 255,
        pixels.float().div(255).unsqueeze(0),
        pixels.float().div(255).view(1, 1, 8, 8),
    ]
    results = capsnets.predict(model, inputs, batch_size=3)
    assert [r.path for r in results] == [str(file)] * 3 + [None] * 5
    assert len({r.index for r in results}) == 1
    assert max(r.score for r in results) - min(r.score for r in results) < 1e-5
    single = capsnets.predict(model, str(file))  # one input, not in a list
    assert len(single) == 1 and single[0].index == results[0].index


def test_the_models_class_names_and_data_set_are_used_when_not_given():
    model = capsnets.create_model("capsnet_small").eval()
    paper = Image.new("L", (28, 28), 255)  # a light background: inverted for a model of light strokes on black
    plain = capsnets.predict(model, paper)[0]
    assert plain.label == str(plain.index) and not any("inverted" in note for note in plain.adapted)
    model.class_names = [f"class {k}" for k in range(10)]
    model.checkpoint_meta = {"dataset": "MNIST"}
    named = capsnets.predict(model, paper)[0]
    assert named.label == f"class {named.index}" and any("inverted" in note for note in named.adapted)
    given = capsnets.predict(model, paper, classes="abcdefghij", dataset="cifar10")[0]
    assert given.label == "abcdefghij"[given.index] and not any("inverted" in note for note in given.adapted)


@pytest.mark.parametrize(
    "inputs, kwargs, message",
    [
        ([42], {}, "cannot read an image from int"),
        ([], {}, "no image given"),
        (torch.rand(2, 1, 9, 9), {}, "taken as a prepared batch (N, 1, 8, 8)"),
        (torch.rand(2, 8, 8, 8, 8), {}, "an image array must be"),
        (torch.rand(8, 8), {"classes": ["a", "b"]}, "classes has 2 names, but the model has 10 classes"),
        (torch.rand(8, 8), {"min_score": 1.5}, "min_score must be a number in [0, 1]"),
        (torch.rand(8, 8), {"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_inputs_are_refused_with_what_to_give(inputs, kwargs, message):
    model = capsnets.create_model("capsnet_digits")
    with pytest.raises(ArgumentError) as err:
        capsnets.predict(model, inputs, **kwargs)
    assert message in str(err.value)


# uncertainty --------------------------------------------------------------------------------------------------------


class _ScoresAsGiven(nn.Module):
    """A classifier whose scores are its input's pixels: ``(N, 1, 1, K)`` -> ``(N, K)``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.input_size = (1, 1, 3)
        self.offset = nn.Parameter(torch.zeros(()))

    def forward(self, images):
        return ModelOutput(images.flatten(1) + self.offset, self.kind)


def test_the_uncertainty_rule_is_a_low_top_score_or_a_close_second():
    scores = torch.tensor([[0.9, 0.1, 0.0], [0.4, 0.1, 0.0], [0.9, 0.8, 0.0], [0.5, 0.25, 0.0]])
    assert uncertainty(scores, min_score=0.5, min_margin=0.2).tolist() == [False, True, True, False]
    assert uncertainty(scores[:, :1], min_score=0.5, min_margin=0.2).tolist() == [False, True, False, False]


def test_predictions_say_whether_and_why_they_are_uncertain():
    lengths = torch.tensor([[0.95, 0.1, 0.05], [0.4, 0.1, 0.0], [0.9, 0.85, 0.1]]).view(3, 1, 1, 3)
    results = capsnets.predict(_ScoresAsGiven("length"), lengths, classes=["a", "b", "c"])
    assert [r.uncertain for r in results] == [False, True, True]
    assert [r.doubt for r in results] == [None, "below 0.7", "b close behind at 0.850"]
    relaxed = capsnets.predict(_ScoresAsGiven("length"), lengths, min_score=0.3, min_margin=0.0)
    assert [r.uncertain for r in relaxed] == [False, False, False]
    logits = torch.tensor([[6.0, 0.0, 0.0], [1.0, 0.9, 0.0]]).view(2, 1, 1, 3)
    softmax = capsnets.predict(_ScoresAsGiven("logits"), logits)
    assert [r.uncertain for r in softmax] == [False, True] and softmax[1].doubt == "below 0.7"
    assert results[1].to_dict()["uncertain"] is True and results[0].to_dict()["uncertain"] is False


@pytest.mark.parametrize("kind", ["length", "activation", "logits"])
def test_every_classifier_fills_scores_with_what_the_ranking_used(kind):
    given = torch.tensor([[0.2, 0.9, 0.4], [1.5, -0.5, 0.3]]).view(2, 1, 1, 3)
    results = capsnets.predict(_ScoresAsGiven(kind), given, classes=["a", "b", "c"])
    ranked = given.flatten(1).softmax(-1) if kind == "logits" else given.flatten(1).clamp(0, 1)
    for result, row, raw in zip(results, ranked, given.flatten(1)):
        assert list(result.scores) == ["a", "b", "c"] and result.scores == pytest.approx(dict(zip("abc", row.tolist())))
        assert result.score == result.scores[result.label] == max(result.scores.values())
        assert result.to_dict()["scores"] == result.scores
        # capsule models keep their raw lengths (or activations) beside the scores; logits have none
        assert result.lengths == ({} if kind == "logits" else pytest.approx(dict(zip("abc", raw.tolist()))))


def test_the_default_flags_wrong_and_foreign_answers_of_the_shipped_weight(shared_data_root):
    from capsnets.data import load_dataset

    model = capsnets.create_model("capsnet_small", pretrained="mnist")
    mnist = load_dataset("mnist", root=shared_data_root, train=False)
    fashion = load_dataset("fashion_mnist", root=shared_data_root, train=False)
    digits = capsnets.predict(model, mnist.images[:2000], batch_size=500)
    right = torch.tensor([r.index for r in digits]) == mnist.labels[:2000]
    flagged = torch.tensor([r.uncertain for r in digits])
    # the first 2,000 test images are the harder part: 3.2% of their right answers are flagged, 2.3% of all 10,000
    assert flagged[right].float().mean() < 0.04 and flagged[~right].float().mean() > 0.6
    clothes = capsnets.predict(model, fashion.images[:2000], batch_size=500)
    assert sum(r.uncertain for r in clothes) > 0.95 * len(clothes)
    noise = capsnets.predict(model, torch.rand(500, 1, 28, 28, generator=torch.Generator().manual_seed(0)))
    assert sum(r.uncertain for r in noise) > 0.95 * len(noise)
    (blank,) = capsnets.predict(model, torch.zeros(1, 1, 28, 28))  # its score alone (0.76) would pass it
    assert blank.uncertain and blank.doubt.startswith("reconstruction unlike the image")


def _reference_errors(reconstruction, images):
    """``reconstruction_errors`` written out pixel by pixel in float64."""
    rows = []
    for r, x in zip(reconstruction.double().flatten(1).tolist(), images.double().flatten(1).tolist()):
        squared = sum((a - b) ** 2 for a, b in zip(r, x))
        energy = sum(a * a for a in r) + sum(b * b for b in x)
        rows.append([squared / len(r), squared / energy if energy > 0 else 1.0])
    return torch.tensor(rows, dtype=torch.float64)


def test_reconstruction_errors_match_a_float64_reference():
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(6, 2, 5, 4, generator=generator)
    reconstruction = torch.rand(6, 2, 5, 4, generator=generator)
    images[1], reconstruction[2], images[3], reconstruction[3] = 0, 0, 0, 0  # a blank image, a blank drawing, both
    reconstruction[4] = images[4]
    errors = reconstruction_errors(reconstruction, images)
    assert errors.dtype == torch.float64 and errors.shape == (6, 2)
    torch.testing.assert_close(errors, _reference_errors(reconstruction, images), rtol=1e-12, atol=1e-15)
    assert errors[1, 1] == errors[2, 1] == errors[3, 1] == 1.0 and errors[4].tolist() == [0.0, 0.0]
    with pytest.raises(ArgumentError, match=r"reconstruction \(6, 2, 5, 4\) and images \(6, 2, 5, 3\) differ"):
        reconstruction_errors(reconstruction, images[..., :3])


_pixels = st.one_of(
    st.just(0.0),
    st.just(1.0),
    st.floats(0.0, 1.0, width=32, allow_subnormal=False),
    st.floats(0.0, 2.0**-66, width=32, allow_subnormal=False),
)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3).flatmap(
        lambda n: st.tuples(
            st.lists(_pixels, min_size=4 * n, max_size=4 * n), st.lists(_pixels, min_size=4 * n, max_size=4 * n)
        )
    )
)
@example(([0.0] * 4, [0.0] * 4))  # both blank: nothing was read
@example(([0.0] * 4, [0.0, 0.0, 0.0, 1.9260044302116286e-21]))  # a square that underflows float32
@example(([2.0**-126] + [0.0] * 3, [2.0**-126] + [0.0] * 3))  # the same faint image: no error at all
@example(([0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 2.0**-126]))  # a faint difference, not rounded to a match
def test_reconstruction_errors_are_bounded_symmetric_and_zero_only_for_a_match(pair):
    """For pixels in [0, 1]: both errors in [0, 1], symmetric in their arguments, the per-pixel error the mean
    squared difference, and the relative error 0 exactly where the two agree and are not blank, 1 where they share
    no ink."""
    r, x = (torch.tensor(values).view(-1, 1, 2, 2) for values in pair)
    errors = reconstruction_errors(r, x)
    assert torch.isfinite(errors).all() and (errors >= 0).all() and (errors <= 1 + 1e-12).all()  # within rounding
    torch.testing.assert_close(errors, reconstruction_errors(x, r))
    torch.testing.assert_close(errors[:, 0], (r.double() - x.double()).pow(2).flatten(1).mean(1))
    same = (r == x).flatten(1).all(1)
    blank = (r == 0).flatten(1).all(1) & (x == 0).flatten(1).all(1)
    assert ((errors[:, 1] == 0) == (same & ~blank)).all()
    disjoint = ~((r > 0) & (x > 0)).flatten(1).any(1)  # no pixel inked in both (r * x underflows float32)
    assert torch.allclose(errors[disjoint, 1], torch.ones(int(disjoint.sum()), dtype=torch.float64))


class _Redraws(nn.Module):
    """A classifier that scores three classes and redraws its image as ``image * gain`` (a decoder stub)."""

    def __init__(self, gain: float = 0.5, decoder: bool = True) -> None:
        super().__init__()
        self.input_size, self.gain, self.decoder = (1, 2, 2), gain, decoder
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, images):
        scores = torch.tensor([0.95, 0.1, 0.0]).expand(len(images), 3) * self.scale
        return ModelOutput(scores, "length", None, images * self.gain if self.decoder else None)


def test_the_limits_are_the_quantile_of_the_training_images_errors():
    images = torch.rand(50, 1, 2, 2, generator=torch.Generator().manual_seed(1))
    model = _Redraws().train()
    limits = calibrate_reconstruction(model, images, quantile=0.9, batch_size=7)
    errors = reconstruction_errors(images * 0.5, images).double()
    assert limits["quantile"] == 0.9 and limits["images"] == 50 and model.training  # the mode is restored
    assert limits["pixel"] == pytest.approx(float(errors[:, 0].quantile(0.9)), abs=1e-6)
    assert limits["relative"] == pytest.approx(float(errors[:, 1].quantile(0.9)), abs=1e-6)
    for column, key in enumerate(("pixel", "relative")):  # at least 90% of the images are within each limit
        assert (errors[:, column] <= limits[key] + 1e-6).double().mean() >= 0.9
    uint8 = calibrate_reconstruction(model, (images * 255).round().to(torch.uint8), quantile=0.9)
    assert uint8["pixel"] == pytest.approx(limits["pixel"], rel=0.05)  # uint8 images are scaled to [0, 1]
    assert calibrate_reconstruction(_Redraws(decoder=False), images) is None
    with pytest.raises(ArgumentError, match="quantile"):
        calibrate_reconstruction(model, images, quantile=1.5)
    with pytest.raises(ArgumentError, match=r"non-empty batch \(N, C, H, W\), got shape \(0, 1, 2, 2\)"):
        calibrate_reconstruction(model, images[:0])


def test_an_answer_whose_reconstruction_is_outside_the_limits_is_uncertain_and_says_why():
    model = _Redraws(gain=0.5)
    images = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.2, 0.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]).view(3, 1, 2, 2)
    assert {r.unsure_rule for r in capsnets.predict(model, images)} == {"score"}  # no limits recorded
    model.checkpoint_meta = {"reconstruction_limits": {"pixel": 0.1, "relative": 0.5, "quantile": 0.99, "images": 9}}
    results = capsnets.predict(model, images, classes=["a", "b", "c"])
    assert [r.unsure_rule for r in results] == ["score and reconstruction"] * 3
    assert [r.label for r in results] == ["a"] * 3 and [r.uncertain for r in results] == [True, False, True]
    # errors: 0.125 per pixel and 0.2 relative; 0.005 and 0.2; 0 and 1 (a blank image)
    assert results[0].reconstruction_error == pytest.approx({"pixel": 0.125, "relative": 0.2})
    assert results[0].doubt == "reconstruction error 0.125 per pixel, where 99% of the training images stay below 0.100"
    assert results[2].doubt == (
        "reconstruction unlike the image: relative error 1.00, where 99% of the training images stay below 0.50"
    )
    assert results[1].doubt is None and results[1].to_dict()["reconstruction_error"] == results[1].reconstruction_error
    no_decoder = _Redraws(decoder=False)
    no_decoder.checkpoint_meta = model.checkpoint_meta
    assert [r.unsure_rule for r in capsnets.predict(no_decoder, images)] == ["score"] * 3


def test_a_run_records_the_limits_of_its_reconstructions(digits_run):
    model = load_model(digits_run)
    limits = model.checkpoint_meta["reconstruction_limits"]
    assert (
        0 < limits["images"] <= 64 and limits["quantile"] == 0.995
    )  # the training split, less validation and 0 < limits["pixel"] < limits["relative"] <= 1
    blank = capsnets.predict(model, torch.zeros(1, *model.input_size))[0]
    assert blank.unsure_rule == "score and reconstruction" and blank.uncertain
    assert "reconstruction unlike the image: relative error 1.00" in blank.doubt


def test_training_images_stored_at_another_size_than_the_test_split_set_no_limits():
    """smallNORB's training images are stored at 48x48 and cropped to 32x32 by the loader: the model cannot read them
    as stored, so a run records no limits rather than failing."""
    from types import SimpleNamespace

    test = SimpleNamespace(images=torch.rand(6, 1, 2, 2), labels=torch.zeros(6, dtype=torch.long), num_classes=3)
    criterion = lambda output, images, labels: (torch.zeros(()), {})  # noqa: E731
    same = ClassificationTask(SimpleNamespace(images=torch.rand(9, 1, 2, 2)))
    record = same.evaluate(_Redraws(), test, 4, "cpu", "off", criterion, None)
    assert record["reconstruction_limits"]["images"] == 9 and same.meta([], record) == {
        "reconstruction_limits": record["reconstruction_limits"]
    }
    cropped = ClassificationTask(SimpleNamespace(images=torch.rand(9, 1, 3, 3)))
    record = cropped.evaluate(_Redraws(), test, 4, "cpu", "off", criterion, None)
    assert "reconstruction_limits" not in record and cropped.meta([], record) == {}


def test_the_cli_line_says_why_an_answer_is_uncertain():
    sure = Prediction(path="a.png", index=7, label="7", score=0.94, uncertain=False)
    unsure = Prediction(path="b.png", index=2, label="2", score=0.197, uncertain=True, doubt="below 0.7")
    task = ClassificationTask()
    assert task.format_prediction(sure) == "a.png: 7 (score 0.940)"
    assert task.format_prediction(unsure) == "b.png: 2 (score 0.197, unsure: below 0.7)"


# segmentation -------------------------------------------------------------------------------------------------------


def test_predict_points_segmentation_models_to_segment(tmp_path):
    model = capsnets.create_model("segcaps_small")
    image = torch.rand(32, 32)
    with pytest.raises(
        ArgumentError, match=r"is for segmentation; .*capsnets\.inference\.segment\(model, inputs, out\)"
    ):
        capsnets.predict(model, image)
    del model.model_name  # an unregistered model is judged by its output
    with pytest.raises(ArgumentError, match=r"returns SegmentationOutput, not ModelOutput; .*inference\.segment"):
        capsnets.predict(model, image)
    results = segment(model, [image, image.numpy()], tmp_path / "masks")
    assert [Path(r.mask).name for r in results] == ["image0_mask.png", "image1_mask.png"]
    assert all(r.path is None and 0 <= r.foreground <= 1 and r.uncertain is None for r in results)


@pytest.mark.learning
def test_photographed_digits_are_framed_and_read_by_the_mnist_weight(shared_data_root):
    # 200 MNIST test digits pasted small (36-90 px), off-centre and dark-on-light on 200x200 canvases of paper grey
    # with noise, read through capsnets.predict and capsnet_small-mnist. Measured: 99.3%, 99.3%, 99.7% on 300
    # canvases (seeds 0, 1, 2); without the framing, 8.3%.
    from capsnets.data import load_dataset

    test = load_dataset("mnist", root=shared_data_root, train=False)
    rng, canvases = np.random.default_rng(0), []
    for digit in test.images[:200, 0].numpy():
        side = int(rng.integers(36, 90))
        small = np.asarray(Image.fromarray((digit * 255).astype(np.uint8)).resize((side, side)), np.float32) / 255
        canvas = np.full((200, 200), rng.uniform(0.7, 0.95), np.float32)
        y, x = rng.integers(0, 200 - side, 2)
        canvas[y : y + side, x : x + side] -= small * rng.uniform(0.5, 0.8)
        canvas += rng.normal(0, 0.05, canvas.shape).astype(np.float32)
        canvases.append(Image.fromarray((np.clip(canvas, 0, 1) * 255).astype(np.uint8)))
    model = capsnets.create_model("capsnet_small", pretrained="mnist")
    answers = capsnets.predict(model, canvases)
    accuracy = np.mean([int(a.label) == int(label) for a, label in zip(answers, test.labels[:200])])
    assert accuracy >= 0.95, accuracy
