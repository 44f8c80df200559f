""":mod:`capsnets.images`: any image (file, Pillow image, array, tensor) prepared as a model's training data was."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from capsnets.images import ImageTransform, prepare_image
from capsnets.validation import ArgumentError

# prepare_image ---------------------------------------------------------------------------------------------------


def test_an_image_of_the_models_size_and_channels_is_taken_as_it_is():
    pixels = torch.randint(0, 256, (28, 28), dtype=torch.uint8)
    pixels[0, :] = pixels[-1, :] = pixels[:, 0] = pixels[:, -1] = 0  # a dark border: not inverted
    tensor, notes = prepare_image(Image.fromarray(pixels.numpy(), mode="L"), (1, 28, 28), "fashion_mnist")
    assert notes == [] and tensor.dtype == torch.float32 and tensor.shape == (1, 28, 28)
    torch.testing.assert_close(tensor[0], pixels.float() / 255.0, rtol=0, atol=0)


def test_size_channels_and_background_are_adapted_and_said():
    white = Image.new("RGB", (200, 150), "white")
    tensor, notes = prepare_image(white, (1, 28, 28), "fashion_mnist")
    assert tensor.shape == (1, 28, 28) and tensor.max() == 0  # white paper becomes the black of MNIST
    assert notes == [
        "converted colour (RGB) -> grayscale",
        "resized 200x150 -> 28x28 (aspect ratio changed)",
        "inverted (light background; the model was trained on light strokes on black)",
    ]
    same, notes = prepare_image(white, (1, 28, 28), "fashion_mnist", invert="no")
    assert same.min() == 1 and not any("inverted" in note for note in notes)
    dark = Image.new("L", (28, 28), 0)
    assert prepare_image(dark, (1, 28, 28), "fashion_mnist", invert="yes")[0].min() == 1
    assert prepare_image(white, (1, 28, 28), "smallnorb_like_unknown")[0].min() == 1  # only dark-background sets
    grey_to_rgb, notes = prepare_image(Image.new("L", (32, 32), 128), (3, 32, 32), None)
    assert grey_to_rgb.shape == (3, 32, 32) and notes == ["converted grayscale (L) -> RGB"]
    assert prepare_image(Image.new("RGB", (56, 56), "black"), (1, 28, 28), "fashion_mnist")[1] == [
        "converted colour (RGB) -> grayscale",
        "resized 56x56 -> 28x28",
    ]


def test_transparency_is_flattened_onto_white():
    clear = Image.new("RGBA", (28, 28), (0, 0, 0, 0))
    tensor, notes = prepare_image(clear, (1, 28, 28), None)
    assert tensor.min() == 1 and notes[0] == "transparency flattened onto white"


def test_smallnorb_like_images_are_cropped_and_standardised_like_the_test_split():
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (96, 96), generator=gen, dtype=torch.uint8)
    tensor, notes = prepare_image(Image.fromarray(pixels.numpy(), mode="L"), (1, 32, 32), "smallnorb")
    assert tensor.shape == (1, 32, 32) and notes == ["resized 96x96 -> 48x48"]
    assert abs(float(tensor.mean())) < 1e-5 and abs(float(tensor.std(unbiased=False)) - 1) < 1e-4
    with pytest.raises(ArgumentError, match="takes 48x48 images, not the 32x32 crops"):
        prepare_image(Image.fromarray(pixels.numpy(), mode="L"), (1, 48, 48), "viewpoints")


def test_what_cannot_be_adapted_is_refused():
    with pytest.raises(ArgumentError, match="only 1 .grayscale. and 3 .RGB."):
        prepare_image(Image.new("L", (8, 8)), (2, 8, 8), None)
    with pytest.raises(ArgumentError, match="invert must be one of auto, yes, no"):
        prepare_image(Image.new("L", (8, 8)), (1, 8, 8), None, invert="maybe")


# ImageTransform ----------------------------------------------------------------------------------------------------
def test_a_transform_gives_the_same_tensor_for_a_file_an_image_an_array_and_a_tensor(tmp_path):
    pixels = (np.arange(40 * 40, dtype=np.int64).reshape(40, 40) % 251).astype(np.uint8)
    path = tmp_path / "x.png"
    Image.fromarray(pixels).save(path)
    transform = ImageTransform((1, 28, 28), "fashion_mnist")
    expected = transform(Image.fromarray(pixels))
    assert expected.shape == (1, 28, 28) and expected.dtype == torch.float32
    for same in (str(path), path, pixels, torch.from_numpy(pixels), pixels[:, :, None]):
        torch.testing.assert_close(transform(same), expected, rtol=0, atol=0)
    # floating point in [0, 1] at full precision, (C, H, W) tensors, RGB arrays
    exact = torch.rand(1, 28, 28, dtype=torch.float32)
    same, notes = ImageTransform((1, 28, 28)).prepare(exact)
    torch.testing.assert_close(same, exact)
    assert notes == []  # a one-channel float image is grey, not "converted colour"
    rgb = ImageTransform((3, 32, 32))(np.zeros((16, 16, 3), dtype=np.uint8))
    assert rgb.shape == (3, 32, 32) and rgb.abs().max() == 0
    tensor, notes = transform.prepare(pixels)
    assert notes == ["resized 40x40 -> 28x28"]


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((2, 3, 4, 5)), "(H, W) or (H, W, C)"),
        (np.zeros((8, 8, 2), dtype=np.uint8), "(H, W) or (H, W, C)"),
        (np.full((8, 8), 2.0), "values in [0, 1]"),
        (np.full((8, 8), np.nan), "values in [0, 1]"),
        (np.zeros((8, 8), dtype=bool), "uint8 or floating point"),
        (42, "cannot read an image from int"),
    ],
)
def test_a_transform_says_what_it_cannot_read(bad, message):
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ImageTransform((1, 28, 28))(bad)


def test_a_transform_takes_a_batch_tensor_or_a_list_and_prepares_each_image_alone(tmp_path):
    transform = ImageTransform((1, 28, 28), "fashion_mnist")
    batch = torch.rand(4, 1, 56, 56, generator=torch.Generator().manual_seed(0))
    batch[1] = 1.0  # a light background: inverted on its own, the others not
    prepared = transform(batch)
    assert prepared.shape == (4, 1, 28, 28) and prepared.dtype == torch.float32
    torch.testing.assert_close(prepared, torch.stack([transform(image) for image in batch]), rtol=0, atol=0)
    assert prepared[1].max() == 0 and transform(batch[:1]).shape == (1, 1, 28, 28)
    Image.new("L", (40, 40), 0).save(tmp_path / "dark.png")
    mixed = [str(tmp_path / "dark.png"), Image.new("RGB", (30, 30), "black"), np.zeros((28, 28), np.uint8), batch[0]]
    for items in (mixed, tuple(mixed)):
        together = transform(items)
        assert together.shape == (4, 1, 28, 28)
        torch.testing.assert_close(together, torch.stack([transform(item) for item in mixed]), rtol=0, atol=0)
    assert transform(batch[0]).shape == (1, 28, 28)  # one image stays (C, H, W)
    assert ImageTransform((3, 32, 32))(torch.rand(2, 3, 8, 8)).shape == (2, 3, 32, 32)


@pytest.mark.parametrize(
    "bad, message",
    [
        ([], "an empty batch of images"),
        (torch.zeros(0, 1, 28, 28), "an empty batch of images"),
        (torch.zeros(2, 2, 28, 28), "with C in 1, 3, 4; got shape (28, 28, 2)"),
        ([np.zeros((8, 8), np.uint8), 42], "cannot read an image from int"),
        ([[np.zeros((8, 8), np.uint8)]], "cannot read an image from list"),
        (np.zeros((2, 8, 8, 1), np.uint8), "a batch is a (B, C, H, W) tensor or a list of images"),
    ],
)
def test_a_transform_says_what_is_wrong_with_a_batch(bad, message):
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ImageTransform((1, 28, 28))(bad)


def test_a_transform_refuses_a_bad_input_size_and_a_missing_file(tmp_path):
    with pytest.raises(ArgumentError, match="input_size"):
        ImageTransform((2, 28, 28))
    with pytest.raises(FileNotFoundError):
        ImageTransform((1, 28, 28))(tmp_path / "missing.png")
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="not an image that can be read"):
        ImageTransform((1, 28, 28))(tmp_path / "bad.png")


def test_a_digit_is_framed_as_mnist_frames_them():
    from capsnets.images import frame_digit

    canvas = torch.zeros(1, 120, 90)
    canvas[0, 30:90, 10:25] = 0.8  # a tall bar, 60x15, off-centre, at 0.8 on a dark background
    canvas += 0.1
    framed = frame_digit(canvas, (28, 28))[0]
    rows, cols = (framed > 0.5).any(1).nonzero().flatten(), (framed > 0.5).any(0).nonzero().flatten()
    assert len(rows) == 20 and 4 <= len(cols) <= 6  # the box's long side 20 px, the aspect kept
    ys, xs = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    centre = ((framed * ys).sum() / framed.sum(), (framed * xs).sum() / framed.sum())
    assert abs(centre[0] - 13.5) <= 0.5 and abs(centre[1] - 13.5) <= 0.5  # centre of mass at the centre
    assert framed.max() == 1 and framed[:3].max() == 0  # background subtracted, strokes stretched to 1
    assert frame_digit(torch.full((3, 50, 50), 0.4), (28, 28)).eq(0).all()  # no strokes: nothing
    assert frame_digit(canvas.expand(3, -1, -1), (28, 28)).shape == (3, 28, 28)


def test_mnist_images_are_framed_and_said_so_other_data_sets_are_resized():
    photo = Image.new("L", (300, 200), 230)  # paper
    photo.paste(40, (200, 50, 215, 110))  # a dark stroke
    tensor, notes = prepare_image(photo, (1, 28, 28), "mnist")
    assert notes[-1].startswith("framed as mnist's digits: the strokes' box scaled to 20 px")
    assert (tensor[0] > 0.5).any(1).sum() == 20
    assert not any("framed" in note for note in prepare_image(photo, (1, 28, 28), "fashion_mnist")[1])
