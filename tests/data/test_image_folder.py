"""folder:PATH: PNG/JPEG folders written with Pillow in tmp_path, loaded, split, resized, and refused clearly."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from capsnets.data import DatasetError, dataset_info, load_dataset, load_image_folder, read_image, scan_image_folder
from capsnets.images import IMAGE_SUFFIXES


def write_images(folder: Path, counts: dict[str, int], size=(10, 12), mode="L", suffix=".png", seed=0) -> dict:
    """``counts[class]`` random images of ``size`` (H, W) per class subfolder; returns {file name: pixels}."""
    rng = np.random.default_rng(seed)
    written = {}
    for name, count in counts.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            shape = size if mode == "L" else (*size, 3)
            pixels = rng.integers(0, 256, shape, dtype=np.uint8)
            Image.fromarray(pixels, mode).save(folder / name / f"{i:03d}{suffix}")
            written[f"{name}/{i:03d}{suffix}"] = pixels
    return written


def test_seeded_split_shapes_labels_and_values(tmp_path):
    written = write_images(tmp_path, {"dog": 10, "cat": 5, "bird": 5})
    train, test = load_dataset(f"folder:{tmp_path}"), load_dataset(f"folder:{tmp_path}", train=False)
    assert train.classes == test.classes == ["bird", "cat", "dog"] and train.num_classes == 3
    assert train.images.shape == (16, 1, 10, 12) and test.images.shape == (4, 1, 10, 12)
    assert train.images.dtype == torch.float32 and train.labels.dtype == torch.int64
    assert 0 <= train.images.min() and train.images.max() <= 1 and train.name == f"folder:{tmp_path}"
    # stratified 20%: 2 of the 10 dogs, 1 of each 5
    assert torch.bincount(test.labels).tolist() == [1, 1, 2] and torch.bincount(train.labels).tolist() == [4, 4, 8]
    # the pixels are the files' pixels / 255, in a shuffled order that mixes the classes
    stored = {tuple(p.flatten().tolist()) for p in written.values()}
    for image in torch.cat([train.images, test.images]):
        assert tuple((image[0] * 255).round().to(torch.uint8).flatten().tolist()) in stored
    assert train.labels[:4].unique().numel() > 1
    # disjoint, complete, and the same split every time
    scan = scan_image_folder(tmp_path)
    assert not {f for f, _ in scan.train} & {f for f, _ in scan.test} and len(scan.train) + len(scan.test) == 20
    assert torch.equal(load_dataset(f"folder:{tmp_path}", train=False).images, test.images)
    other = scan_image_folder(tmp_path, split_seed=1, test_fraction=0.5)
    assert len(other.test) == 5 + 3 + 3 and {f for f, _ in other.test} != {f for f, _ in scan.test}


def test_the_seeded_split_and_order_are_pinned(tmp_path):
    # saved runs name a folder and a seed: the same files must give the same split and order in every version
    write_images(tmp_path, {"a": 5, "b": 1, "c": 4})
    scan = scan_image_folder(tmp_path, test_fraction=0.4, split_seed=2)
    assert [f"{f.parent.name}/{f.name}" for f, _ in scan.test] == ["a/003.png", "a/004.png", "c/001.png", "c/002.png"]
    assert [label for _, label in scan.train] == [0, 0, 0, 1, 2, 2]  # b's one image is trained on
    assert load_image_folder(tmp_path, test_fraction=0.4, split_seed=2).labels.tolist() == [0, 1, 0, 0, 2, 2]


def test_train_test_folders_are_used_as_given(tmp_path):
    write_images(tmp_path / "train", {"a": 3, "b": 4})
    write_images(tmp_path / "test", {"a": 1, "b": 2}, seed=1)
    info = dataset_info(f"folder:{tmp_path}")
    assert (info.num_classes, info.classes, info.num_train, info.num_test) == (2, ("a", "b"), 7, 3)
    assert info.image_shape == (1, 10, 12)
    test = load_dataset(f"folder:{tmp_path}", train=False)
    assert sorted(test.labels.tolist()) == [0, 1, 1]
    assert scan_image_folder(tmp_path).presplit


def test_channels_follow_the_images(tmp_path):
    grey = tmp_path / "grey"
    write_images(grey, {"a": 2, "b": 2})
    assert load_dataset(f"folder:{grey}").images.shape[1] == 1
    mixed = tmp_path / "mixed"
    write_images(mixed, {"a": 2, "b": 2})
    Image.new("RGB", (12, 10), (200, 30, 60)).save(mixed / "b" / "red.jpg", quality=95)  # one colour JPEG: 3 channels
    data = load_dataset(f"folder:{mixed}", train=True)
    assert data.images.shape[1] == 3 and dataset_info(f"folder:{mixed}").image_shape[0] == 3
    # a grey image on three channels is the same plane three times; an RGB image keeps its colours
    grey_image = read_image(mixed / "a" / "000.png", 3)
    assert torch.equal(grey_image[0], grey_image[1]) and torch.equal(grey_image[1], grey_image[2])
    rgb = read_image(mixed / "b" / "red.jpg", 3)
    assert rgb.shape == (3, 10, 12)
    assert torch.allclose(rgb.mean(dim=(1, 2)), torch.tensor([200, 30, 60]) / 255, atol=3 / 255)  # JPEG is lossy
    # colour read as grey: ITU-R 601-2 luminance, as Pillow's "L"
    expected = np.asarray(Image.open(mixed / "b" / "red.jpg").convert("L"), dtype=np.float32) / 255
    assert torch.allclose(read_image(mixed / "b" / "red.jpg", 1)[0], torch.from_numpy(expected))
    assert abs(expected.mean() - (0.299 * 200 + 0.587 * 30 + 0.114 * 60) / 255) < 3 / 255


def test_grey_palette_alpha_and_16_bit(tmp_path):
    for name, image in {
        "p": Image.fromarray(np.arange(120, dtype=np.uint8).reshape(10, 12)).convert("P"),
        "la": Image.new("LA", (12, 10), (200, 255)),
        "i16": Image.fromarray(np.full((10, 12), 65535, dtype=np.uint16)),
    }.items():
        (tmp_path / name).mkdir()
        image.save(tmp_path / name / "x.png")
        image.save(tmp_path / name / "y.png")
    scan = scan_image_folder(tmp_path)
    assert scan.channels == 1
    assert read_image(tmp_path / "i16" / "x.png", 1).max() == 1.0
    assert torch.allclose(read_image(tmp_path / "la" / "x.png", 1), torch.full((1, 10, 12), 200 / 255))
    Image.new("RGBA", (12, 10), (255, 0, 0, 0)).save(tmp_path / "la" / "rgba.png")
    assert scan_image_folder(tmp_path).channels == 3
    assert read_image(tmp_path / "la" / "rgba.png", 3)[:, 0, 0].tolist() == [1.0, 1.0, 1.0]  # clear: white paper
    Image.new("RGBA", (12, 10), (255, 0, 0, 255)).save(tmp_path / "la" / "red.png")
    assert read_image(tmp_path / "la" / "red.png", 3)[:, 0, 0].tolist() == [1.0, 0.0, 0.0]  # opaque: as it is


def test_resizing(tmp_path):
    write_images(tmp_path, {"a": 3, "b": 3}, size=(20, 30))
    write_images(tmp_path, {"a": 1}, size=(7, 5), suffix=".jpeg", seed=3)  # sorted after the PNGs
    assert load_dataset(f"folder:{tmp_path}").images.shape[2:] == (20, 30)  # default: the first image's size
    assert load_dataset(f"folder:{tmp_path}", image_size=16).images.shape[2:] == (16, 16)
    assert load_dataset(f"folder:{tmp_path}", image_size=(8, 12), train=False).images.shape[2:] == (8, 12)
    assert dataset_info(f"folder:{tmp_path}", image_size=9).image_shape == (1, 9, 9)
    flat = tmp_path / "flat"
    (flat / "a").mkdir(parents=True)
    (flat / "b").mkdir()
    Image.new("L", (30, 20), 77).save(flat / "a" / "x.png")
    Image.new("L", (30, 20), 77).save(flat / "b" / "x.png")
    assert torch.allclose(read_image(flat / "a" / "x.png", 1, (5, 6)), torch.full((1, 5, 6), 77 / 255))
    with pytest.raises(ValueError, match=r"image_size=0 is invalid"):
        load_dataset(f"folder:{tmp_path}", image_size=0)
    with pytest.raises(
        ValueError, match=r"image_size=16 applies to folder:PATH data sets only; mnist images are 28x28"
    ):
        load_dataset("mnist", image_size=16)


def test_other_files_and_hidden_entries_are_skipped(tmp_path):
    write_images(tmp_path, {"a": 2, "b": 2})
    (tmp_path / "a" / "notes.txt").write_text("not an image")
    (tmp_path / ".cache").mkdir()
    (tmp_path / "b" / ".thumb.png").write_bytes(b"junk")
    scan = scan_image_folder(tmp_path)
    assert scan.classes == ("a", "b") and len(scan.train) + len(scan.test) == 4


_ERRORS = {
    "missing": r"folder:.*nowhere is not a folder; Fix: give the folder that holds one subfolder per class",
    "no_classes": r"has no class subfolders \(it holds 1 images directly, e.g. x.png\); Fix: put each class",
    "one_class": r"has only one class subfolder \(a\); a classifier needs at least 2 classes; Fix: add",
    "empty_class": r"class folder .*b has no images \(PNG, JPEG, GIF, BMP, TIFF, WebP: \.png, .*Fix: add images to it",
    "corrupt": r"b.001\.png: cannot be read as an image \(.*\); Fix: replace or delete the file",
    "different_classes": r"train/ and test/ have different classes \(only in train/: \['c'\]; only in test/: none\)",
    "train_only": r"has train/ but no test/; Fix: add .*test with the same class subfolders",
    "singletons": r"every class has a single image, so no test split can be drawn",
}


@pytest.mark.parametrize("case", list(_ERRORS))
def test_clear_errors(tmp_path, case):
    root = tmp_path / "images"
    if case == "missing":
        root = tmp_path / "nowhere"
    elif case == "no_classes":
        root.mkdir()
        Image.new("L", (4, 4)).save(root / "x.png")
    elif case == "one_class":
        write_images(root, {"a": 3})
    elif case == "empty_class":
        write_images(root, {"a": 3})
        (root / "b").mkdir()
        (root / "b" / "readme.txt").write_text("no images")
    elif case == "corrupt":
        write_images(root, {"a": 3, "b": 3})
        (root / "b" / "001.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    elif case == "different_classes":
        write_images(root / "train", {"a": 2, "b": 2, "c": 2})
        write_images(root / "test", {"a": 1, "b": 1})
    elif case == "train_only":
        write_images(root / "train", {"a": 2, "b": 2})
    elif case == "singletons":
        write_images(root, {"a": 1, "b": 1})
    with pytest.raises(DatasetError, match=_ERRORS[case]):
        load_dataset(f"folder:{root}")


def test_an_unreadable_file_is_named_with_every_format_read(tmp_path):
    """The message names the one list of formats read, not PNG and JPEG alone."""
    from capsnets.images import IMAGE_FORMATS, IMAGE_FORMATS_TEXT, ImageFileError, open_image

    assert IMAGE_FORMATS_TEXT == "PNG, JPEG, GIF, BMP, TIFF, WebP" and len(IMAGE_FORMATS) == 6
    write_images(tmp_path, {"a": 3, "b": 3})
    (tmp_path / "b" / "001.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(DatasetError) as caught:
        load_dataset(f"folder:{tmp_path}")
    message = str(caught.value)
    assert "001.png: cannot be read as an image" in message and "only PNG and JPEG" not in message, message
    assert message.endswith(f"(the image formats read: {IMAGE_FORMATS_TEXT})") and "\n" not in message, message
    with pytest.raises(ImageFileError) as caught:  # as predict reads it
        open_image(tmp_path / "b" / "001.png")
    assert str(caught.value).endswith(f"formats read: {IMAGE_FORMATS_TEXT}"), str(caught.value)


def _write_in(image_format: str, path: Path, pixels: np.ndarray) -> None:
    """``pixels`` saved losslessly where the format can (JPEG cannot)."""
    options = {"JPEG": {"quality": 100}, "WEBP": {"lossless": True}}.get(image_format, {})
    Image.fromarray(pixels, "L").save(path, format=image_format, **options)


def test_each_format_read_has_its_endings():
    from capsnets.images import IMAGE_FORMATS, IMAGE_SUFFIXES

    formats = {suffix: Image.registered_extensions().get(suffix) for suffix in IMAGE_SUFFIXES}  # Pillow's names
    assert set(formats.values()) == set(IMAGE_FORMATS), formats
    assert {".png", ".jpg", ".jpeg", ".gif", ".bmp", ".tif", ".tiff", ".webp"} <= set(IMAGE_SUFFIXES)


@pytest.mark.parametrize("suffix", [*IMAGE_SUFFIXES, ".TIFF", ".Gif"])
def test_every_format_listed_is_read_from_a_folder(tmp_path, suffix):
    """A folder of files in each of IMAGE_FORMATS, named with each of its endings (any case), is found and read
    with its pixels (JPEG within its loss), as a folder data set and by predict's collection of a folder."""
    from capsnets.inference import collect_image_files

    image_format = Image.registered_extensions()[suffix.lower()]
    rng = np.random.default_rng(0)
    written = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(2):
            pixels = rng.integers(0, 256, (6, 5), dtype=np.uint8)
            _write_in(image_format, tmp_path / name / f"{i}{suffix}", pixels)
            written[(name, i)] = pixels
    scan = scan_image_folder(tmp_path)
    assert scan.classes == ("a", "b") and len(scan.train) + len(scan.test) == 4
    assert len(collect_image_files([tmp_path])) == 4
    tolerance = 8 / 255 if image_format == "JPEG" else 0  # JPEG's loss at quality 100
    for (name, i), pixels in written.items():
        read = read_image(tmp_path / name / f"{i}{suffix}", 1)
        assert read.shape == (1, 6, 5)
        assert (read[0] - torch.from_numpy(pixels / 255).float()).abs().max() <= tolerance + 1e-6, (name, i)
    train, test = load_dataset(f"folder:{tmp_path}"), load_dataset(f"folder:{tmp_path}", train=False)
    channels = 3 if image_format == "WEBP" else 1  # WebP has no grey mode: Pillow writes grey as RGB
    assert len(train) + len(test) == 4 and train.images.shape[1:] == (channels, 6, 5)


def test_truncated_image_is_named_when_decoded(tmp_path):
    write_images(tmp_path, {"a": 2, "b": 2}, size=(64, 64))
    path = tmp_path / "a" / "000.png"
    path.write_bytes(path.read_bytes()[:100])  # the header reads, the pixels do not
    errors = []
    for train in (True, False):  # the file is in one of the two splits
        try:
            load_image_folder(tmp_path, train=train)
        except DatasetError as err:
            errors.append(str(err))
    assert len(errors) == 1 and "000.png: cannot be read as an image" in errors[0]


def test_bad_arguments(tmp_path):
    write_images(tmp_path, {"a": 2, "b": 2})
    with pytest.raises(ValueError, match="test_fraction=1 is invalid"):
        scan_image_folder(tmp_path, test_fraction=1)
    with pytest.raises(ValueError, match="names no folder"):
        load_dataset("folder:")


@pytest.mark.parametrize(
    "model, size, mode, args",
    [
        ("capsnet_digits", (8, 8), "L", []),
        ("capsnet_small", (28, 28), "RGB", []),
        ("matrix_capsnet_small", (32, 32), "L", ["--model-arg", "routing.iterations=1"]),
    ],
)
def test_train_on_a_folder_end_to_end(tmp_path, model, size, mode, args):
    from capsnets.cli import main

    write_images(tmp_path / "images", {"circle": 5, "square": 5, "triangle": 5}, size=size, mode=mode)
    out = tmp_path / "run"
    argv = [
        "train",
        "--model",
        model,
        "--dataset",
        f"folder:{tmp_path / 'images'}",
        "--limit-train",
        "8",
        "--limit-test",
        "8",
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--no-progress",
        "--device",
        "cpu",
        "--out",
        str(out),
        *args,
    ]
    assert main(argv) == 0
    import yaml

    config = yaml.safe_load((out / "config.yaml").read_text())
    channels = 1 if mode == "L" else 3
    assert config["model_args"]["num_classes"] == 3 and config["model_args"]["input_size"] == [channels, *size]


def test_train_with_image_size_from_a_config_file(tmp_path):
    """``image_size`` reaches the loader through TrainConfig (``--config FILE``); the model follows it."""
    from capsnets.cli import main

    write_images(tmp_path / "images", {"a": 4, "b": 4}, size=(20, 20))
    config = tmp_path / "config.yaml"
    config.write_text(f"dataset: folder:{tmp_path / 'images'}\nimage_size: 8\nmodel: capsnet_digits\n")
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--config",
                str(config),
                "--epochs",
                "1",
                "--batch-size",
                "4",
                "--no-progress",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    import yaml

    assert yaml.safe_load((out / "config.yaml").read_text())["model_args"]["input_size"] == [1, 8, 8]


def test_a_relative_folder_is_recorded_absolute_and_evaluated_by_name_from_elsewhere(tmp_path, monkeypatch, capsys):
    """A run trained on ``folder:images`` (relative) records the absolute folder, so ``evaluate`` works from another
    directory; its report and figures name the classes."""
    import json

    import yaml

    from capsnets.cli import main

    first, second = tmp_path / "a", tmp_path / "b"
    second.mkdir()
    write_images(first / "images", {"circle": 6, "square": 6, "triangle": 6}, size=(8, 8))
    monkeypatch.chdir(first)
    monkeypatch.setattr("capsnets.engine.reporting.save_figures", lambda *args, **kwargs: [])
    train = ["train", "--dataset", "folder:images", "--epochs", "1", "--batch-size", "4", "--no-progress"]
    assert main([*train, "--device", "cpu", "--out", "run"]) == 0
    config = yaml.safe_load((first / "run" / "config.yaml").read_text())
    assert config["dataset"] == f"folder:{first.resolve() / 'images'}"
    monkeypatch.chdir(second)
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(first / "run"), "--out", ".", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("circle", "square", "triangle")), out
    report = json.loads((second / "evaluation_run_best_folder_images.json").read_text())
    assert list(report["per_class_accuracy"]) == ["circle", "square", "triangle"]


def test_few_steps_per_epoch_are_warned_about(tmp_path, caplog):
    from capsnets.cli import main

    write_images(tmp_path / "images", {"a": 10, "b": 10}, size=(8, 8))
    argv = ["train", "--dataset", f"folder:{tmp_path / 'images'}", "--epochs", "1", "--no-progress", "--device", "cpu"]
    with caplog.at_level("WARNING"):
        assert main([*argv, "--batch-size", "4", "--out", str(tmp_path / "run")]) == 0
    # 20 images: 4 to the test split, 2 of the other 16 held out to choose the best checkpoint (val_fraction)
    warnings = [r.getMessage() for r in caplog.records if "steps per epoch" in r.getMessage()]
    assert warnings == [
        "4 steps per epoch at batch 4 (14 training images): few optimiser steps per epoch learn little; "
        "use a smaller --batch-size (e.g. 1) or more --epochs"
    ]
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert main([*argv, "--batch-size", "1", "--out", str(tmp_path / "run1")]) == 0
    assert not [r for r in caplog.records if "steps per epoch" in r.getMessage()]
