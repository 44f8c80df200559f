"""``segfolder:PATH``: images and masks of one's own, written as PNG/JPEG files by Pillow."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from capsnets.data import DatasetError, dataset_info, load_dataset
from capsnets.data.seg_folder import load_segmentation_folder, scan_segmentation_folder

RED, GREEN = (255, 0, 0), (0, 255, 0)


def _write(folder, masks: dict, *, size=(8, 8), image_mode="L"):
    """``folder/images/<name>.png`` (random pixels) and ``folder/masks/<name>.png`` for each ``name: mask`` (a
    Pillow image, or an array saved as one)."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "masks").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, mask in masks.items():
        shape = (*size, 3) if image_mode == "RGB" else size
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=image_mode).save(
            folder / "images" / f"{name}.png"
        )
        (mask if isinstance(mask, Image.Image) else Image.fromarray(mask)).save(folder / "masks" / f"{name}.png")
    return folder


def _index_mask(value: int, size=(8, 8)) -> np.ndarray:
    mask = np.zeros(size, np.uint8)
    mask[2:6, 2:6] = value
    return mask


def _colour_mask(colour, size=(8, 8)) -> np.ndarray:
    mask = np.zeros((*size, 3), np.uint8)
    mask[2:6, 2:6] = colour
    return mask


def test_index_masks_split_and_classes(tmp_path):
    folder = _write(tmp_path, {f"{k:02d}": _index_mask(1 + k % 3) for k in range(10)})
    info = dataset_info(f"segfolder:{folder}")
    assert (info.num_classes, info.classes, info.image_shape) == (4, ("0", "1", "2", "3"), (1, 8, 8))
    assert (info.num_train, info.num_test) == (8, 2)
    train, test = load_dataset(f"segfolder:{folder}"), load_dataset(f"segfolder:{folder}", train=False)
    assert train.images.shape == (8, 1, 8, 8) and train.masks.shape == (8, 1, 8, 8)
    assert train.masks.dtype == torch.uint8 and train.num_classes == 4 and train.task == "segmentation"
    assert train.mask_format == {"mode": "L", "values": [0, 1, 2, 3]}
    assert train.masks[:, 0, 0, 0].eq(0).all() and set(train.masks[:, 0, 3, 3].tolist()) <= {1, 2, 3}
    assert len(test) == 2
    again = load_dataset(f"segfolder:{folder}")  # the seeded split and order are the same every time
    torch.testing.assert_close(again.images, train.images)


def test_the_seeded_split_is_pinned(tmp_path):
    # saved runs name a folder and a seed: the same files must give the same split in every version
    folder = _write(tmp_path, {f"{k}": _index_mask(1) for k in range(7)})
    scan = scan_segmentation_folder(folder, test_fraction=0.3, split_seed=4)
    assert [image.name for image, _ in scan.test] == ["1.png", "3.png"]
    assert [image.name for image, _ in scan.train] == ["0.png", "2.png", "4.png", "5.png", "6.png"]


def test_binary_masks_and_nearest_resizing(tmp_path):
    for name, mask in (
        ("a", _index_mask(255, (16, 16))),
        ("b", _index_mask(0, (16, 16))),
        ("c", _index_mask(255, (16, 16))),
    ):
        _write(tmp_path, {name: mask}, size=(16, 16))
    data = load_segmentation_folder(tmp_path, image_size=8, test_fraction=0.4)
    assert data.classes == ("0", "255") and data.mask_format["values"] == [0, 255]
    assert set(data.masks.unique().tolist()) <= {0, 1} and data.images.shape[-2:] == (8, 8)  # no blended values
    one_bit = tmp_path / "bits"
    _write(one_bit, {n: Image.fromarray(_index_mask(255) > 0) for n in "ab"})  # mode "1" masks
    assert load_segmentation_folder(one_bit).classes == ("0", "1")


def test_palette_masks_keep_their_palette(tmp_path):
    masks = {}
    for k in range(3):
        mask = Image.fromarray(_index_mask(1 + k % 2), mode="L").convert("P")
        mask.putpalette([0, 0, 0, 200, 10, 10, 10, 200, 10] + [0] * 759)
        masks[str(k)] = mask
    data = load_segmentation_folder(_write(tmp_path, masks))
    assert data.num_classes == 3 and data.mask_format["mode"] == "P"
    assert data.mask_format["palette"][:9] == [0, 0, 0, 200, 10, 10, 10, 200, 10]


def test_colour_masks_are_classes_sorted_black_first(tmp_path):
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[..., :3] = 77  # transparent grey counts as black
    rgba[2:6, 2:6] = (*GREEN, 255)
    folder = _write(tmp_path, {"a": _colour_mask(RED), "b": _colour_mask(GREEN), "c": rgba}, image_mode="RGB")
    data = load_segmentation_folder(folder, test_fraction=0.34)
    assert data.classes == ("#000000", "#00ff00", "#ff0000") and data.images.shape[1] == 3
    assert data.mask_format == {"mode": "RGB", "values": [[0, 0, 0], [0, 255, 0], [255, 0, 0]]}


def test_classes_json_names_classes_and_refuses_unknown_colours(tmp_path):
    folder = _write(tmp_path, {"a": _colour_mask(RED), "b": _colour_mask(GREEN)})
    (folder / "classes.json").write_text(json.dumps({"background": [0, 0, 0], "road": "#ff0000", "tree": GREEN}))
    data = load_segmentation_folder(folder)
    assert data.classes == ("background", "road", "tree")
    assert data.mask_format["values"] == [[0, 0, 0], [255, 0, 0], [0, 255, 0]]
    (folder / "classes.json").write_text(json.dumps({"background": [0, 0, 0], "road": "#ff0000"}))
    with pytest.raises(DatasetError, match=r"holds colour #00ff00, which classes.json does not list.*Fix: add"):
        load_segmentation_folder(folder)
    (folder / "classes.json").write_text(json.dumps({"background": 0, "road": 1}))
    with pytest.raises(DatasetError, match="classes.json gives indices but mask .* holds colours"):
        load_segmentation_folder(folder)
    (folder / "classes.json").write_text("{not json")
    with pytest.raises(DatasetError, match="cannot be read as JSON"):
        load_segmentation_folder(folder)


def test_train_and_test_folders_are_the_split(tmp_path):
    _write(tmp_path / "train", {n: _index_mask(1) for n in "abc"})
    _write(tmp_path / "test", {"d": _index_mask(2)})
    info = dataset_info(f"segfolder:{tmp_path}")
    assert (info.num_train, info.num_test, info.num_classes) == (3, 1, 3)  # classes from both splits


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: (f / "masks" / "b.png").unlink(), r"have no mask, e.g. .*b.png \(expected .*masks/b.png\)"),
        (lambda f: (f / "images" / "b.png").unlink(), "have no image"),
        (lambda f: (f / "masks").rename(f / "labels"), "has no masks/ folder"),
        (
            lambda f: Image.fromarray(_index_mask(1, (6, 8))).save(f / "masks" / "b.png"),
            r"mask .*b.png is 8x6 but its image is 8x8.*Fix",
        ),
        (
            lambda f: Image.fromarray(_index_mask(1)).save(f / "masks" / "b.jpg") or (f / "masks" / "b.png").unlink(),
            "is not a PNG",
        ),
        (
            lambda f: Image.fromarray(_index_mask(1).astype(np.uint16) * 300).save(f / "masks" / "b.png"),
            "holds the value 300: too many classes",
        ),
        (lambda f: Image.fromarray(_colour_mask(RED)).save(f / "masks" / "b.png"), "but earlier masks hold"),
        (lambda f: Image.fromarray(_index_mask(1)).convert("CMYK").save(f / "masks" / "b.jpg"), "same name"),
        (
            lambda f: [Image.fromarray(_index_mask(0)).save(f / "masks" / f"{n}.png") for n in "abc"],
            "at least 2 classes",
        ),
    ],
)
def test_bad_folders_say_what_is_wrong_and_how_to_fix_it(tmp_path, damage, message):
    folder = _write(tmp_path, {n: _index_mask(1) for n in "abc"})
    damage(folder)
    with pytest.raises(DatasetError, match=message):
        load_segmentation_folder(folder)


def test_too_many_colours_are_refused(tmp_path):
    mask = np.zeros((20, 20, 3), np.uint8)
    mask.reshape(400, 3)[:300] = np.stack([np.arange(300) % 256, np.arange(300) // 256, np.full(300, 7)], 1)
    with pytest.raises(DatasetError, match="more than 256 colours: too many classes"):
        load_segmentation_folder(_write(tmp_path, {"a": mask, "b": mask}, size=(20, 20)))


def test_the_memory_limit_counts_images_and_masks(tmp_path, monkeypatch):
    folder = _write(tmp_path, {n: _index_mask(1) for n in "abc"})
    monkeypatch.setenv("CAPSNETS_MAX_FOLDER_BYTES", "100")
    with pytest.raises(DatasetError, match="more than the .* GiB allowed; Fix: give a smaller image size"):
        load_segmentation_folder(folder)


def test_write_digit_segfolder_writes_a_folder_that_loads_with_its_classes(tmp_path):
    from capsnets.data.seg_folder import write_digit_segfolder

    gen = torch.Generator().manual_seed(0)
    digits = torch.rand(12, 1, 28, 28, generator=gen)
    labels = torch.tensor([0, 1, 2, 3] * 3)
    folder = write_digit_segfolder(tmp_path / "d", digits, labels, classes=(2, 0), count=5, size=12)
    assert sorted(p.name for p in (folder / "images").iterdir()) == [f"0000{k}.png" for k in range(5)]
    data = load_dataset(f"segfolder:{folder}", train=True)
    assert data.classes == ("background", "digit 2", "digit 0") and data.images.shape[1:] == (1, 12, 12)
    kept = labels[torch.isin(labels, torch.tensor([2, 0]))][:5].tolist()  # 0, 2, 0, 2, 0
    for k, label in enumerate(kept):
        image = np.asarray(Image.open(folder / "images" / f"{k:05d}.png"))
        mask = np.asarray(Image.open(folder / "masks" / f"{k:05d}.png"))
        # the digit's pixels above half are its class; everything outside the 8x8 digit stays background
        assert set(np.unique(mask)) <= {0, (2, 0).index(label) + 1}
        assert ((mask > 0) == (image > 127.5)).all() and (image > 0).sum() <= 64
    with pytest.raises(ValueError, match="size must be at least 5"):
        write_digit_segfolder(tmp_path / "e", digits, labels, size=4)


def test_write_digit_segfolder_puts_several_digits_on_larger_images(tmp_path):
    from capsnets.data.seg_folder import write_digit_segfolder

    gen = torch.Generator().manual_seed(1)
    digits = torch.zeros(14, 1, 28, 28)
    digits[:, :, 4:24, 10:18] = torch.rand(14, 1, 20, 8, generator=gen)  # a stroke each, bright and faint pixels
    labels = torch.tensor([0, 1, 2] * 4 + [1, 1])
    folder = write_digit_segfolder(tmp_path / "d", digits, labels, count=3, size=32, per_image=4, digit_size=14)
    assert len(list((folder / "images").iterdir())) == 3  # 12 digits kept of the first 14: 3 images of 4
    data = load_dataset(f"segfolder:{folder}", train=True)
    assert data.images.shape[1:] == (1, 32, 32) and data.num_classes == 4
    for k in range(3):
        image = np.asarray(Image.open(folder / "images" / f"{k:05d}.png"))
        mask = np.asarray(Image.open(folder / "masks" / f"{k:05d}.png"))
        # a pixel is labelled exactly where a digit's pixel is above half (the lightest digit's ink is kept)
        assert ((mask > 0) <= (image > 127.5)).all() and set(np.unique(mask)) <= {0, 1, 2, 3}
        assert (image > 127.5).sum() > 14  # more than one digit's column of bright pixels
    with pytest.raises(ValueError, match="digit_size must be at most size"):
        write_digit_segfolder(tmp_path / "e", digits, labels, size=16, digit_size=20)
    with pytest.raises(ValueError, match="per_image"):
        write_digit_segfolder(tmp_path / "f", digits, labels, per_image=0)
