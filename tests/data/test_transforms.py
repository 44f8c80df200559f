"""Batched transforms: smallNORB's (shapes, exact windows, jitter ranges, determinism) and the digit augmentation."""

import pytest
import torch
import torch.nn.functional as F

from capsnets.data import DigitAugment, NorbAugment, brightness_contrast, center_crop, random_crop, resize, standardize


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_resize_area_is_block_mean_and_noop_at_same_size():
    images = torch.rand(3, 1, 96, 96)
    small = resize(images, 48)
    assert small.shape == (3, 1, 48, 48)
    torch.testing.assert_close(small, F.avg_pool2d(images, 2))
    assert resize(small, 48) is small


def test_standardize():
    out = standardize(torch.rand(4, 1, 10, 10) * 7 + 3)
    torch.testing.assert_close(out.mean(dim=(1, 2, 3)), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.std(dim=(1, 2, 3), unbiased=False), torch.ones(4), atol=1e-4, rtol=0)
    assert torch.equal(standardize(torch.full((1, 1, 4, 4), 5.0)), torch.zeros(1, 1, 4, 4))


def test_random_crop_takes_the_right_window():
    images = torch.randn(6, 2, 48, 40)
    offsets = torch.tensor([[0, 0], [16, 8], [3, 5], [16, 0], [0, 8], [7, 2]])
    out = random_crop(images, 32, offsets=offsets)
    assert out.shape == (6, 2, 32, 32) and out.is_contiguous()
    for b, (top, left) in enumerate(offsets.tolist()):
        assert torch.equal(out[b], images[b, :, top : top + 32, left : left + 32])


def test_random_crop_draws_every_offset_and_is_seeded():
    images = torch.arange(8 * 8, dtype=torch.float32).view(1, 1, 8, 8).expand(2000, 1, 8, 8)
    a, b = random_crop(images, 5, gen(3)), random_crop(images, 5, gen(3))
    assert torch.equal(a, b) and not torch.equal(a, random_crop(images, 5, gen(4)))
    tops, lefts = a[:, 0, 0, 0] // 8, a[:, 0, 0, 0] % 8  # the top-left pixel's value encodes the offset
    assert set(tops.long().tolist()) == {0, 1, 2, 3} and set(lefts.long().tolist()) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="size"):
        random_crop(images, 9, gen())


def test_center_crop_exact():
    images = torch.randn(2, 1, 48, 48)
    assert torch.equal(center_crop(images, 32), images[:, :, 8:40, 8:40])
    odd = torch.arange(30.0).view(1, 1, 5, 6)
    assert torch.equal(center_crop(odd, 2), odd[:, :, 1:3, 2:4])


def test_brightness_contrast_ranges_and_determinism():
    images = torch.randn(500, 1, 8, 8)
    out = brightness_contrast(images, gen(1), brightness=0.3, contrast=0.4)
    assert torch.equal(out, brightness_contrast(images, gen(1), brightness=0.3, contrast=0.4))
    mean_in, mean_out = images.mean(dim=(1, 2, 3)), out.mean(dim=(1, 2, 3))
    shift = mean_out - mean_in
    spread_in = (images - mean_in.view(-1, 1, 1, 1)).std(dim=(1, 2, 3))
    factor = (out - mean_out.view(-1, 1, 1, 1)).std(dim=(1, 2, 3)) / spread_in
    assert shift.abs().max() <= 0.3 + 1e-5 and shift.abs().max() > 0.25
    assert factor.min() >= 0.6 - 1e-4 and factor.max() <= 1.4 + 1e-4 and factor.max() - factor.min() > 0.7
    torch.testing.assert_close(brightness_contrast(images, gen(), brightness=0, contrast=0), images)
    with pytest.raises(ValueError, match="contrast"):
        brightness_contrast(images, gen(), contrast=1.5)


def test_norb_augment():
    augment = NorbAugment(crop=32, brightness=0.2, contrast=0.5)
    images = torch.randn(5, 1, 48, 48)
    out = augment(images, gen(7))
    assert out.shape == (5, 1, 32, 32) and torch.equal(out, augment(images, gen(7)))
    assert augment.output_shape((1, 48, 48)) == (1, 32, 32)
    # the crop offsets are drawn first, then the jitter, from the same generator
    g = gen(7)
    window = random_crop(images, 32, g)
    assert torch.equal(brightness_contrast(window, g, brightness=0.2, contrast=0.5), out)


def test_digit_augment_is_deterministic_and_keeps_shape_and_range():
    images = torch.rand(16, 1, 28, 28)
    out = DigitAugment()(images, gen(3))
    assert out.shape == images.shape and out.dtype == torch.float32
    assert torch.equal(out, DigitAugment()(images, gen(3)))
    assert not torch.equal(out, DigitAugment()(images, gen(4)))
    assert 0 <= out.min() and out.max() <= 1
    as_bytes = DigitAugment()((images * 255).round().to(torch.uint8), gen(3))  # uint8 is read as [0, 255]
    assert as_bytes.dtype == torch.float32 and (as_bytes - out).abs().max() < 0.01


def test_digit_augment_squeeze_without_rotation_is_a_narrower_copy_at_the_left():
    ones = torch.ones(64, 1, 28, 28)
    out = DigitAugment(angle=0, erase=0)(ones, gen(0))
    torch.testing.assert_close(out, out[:, :, :1].expand_as(out), atol=1e-5, rtol=0)  # no rotation: equal rows
    lit = out[:, 0, 0] > 0.5
    width = lit.sum(dim=1)
    assert ((width >= 28 - 8) & (width <= 27)).all() and width.unique().numel() > 1  # 1 to 8 px taken off
    first = lit.float().argmax(dim=1)
    assert (first <= 5).all()  # placed w // 2 + {0, 1} from the left
    columns = torch.arange(28)
    assert torch.equal(lit, (columns >= first[:, None]) & (columns < (first + width)[:, None]))  # one block


def test_digit_augment_erases_one_patch_and_rotates_some_images():
    ones = torch.ones(64, 1, 28, 28)
    plain, erased = DigitAugment(angle=0, erase=0)(ones, gen(1)), DigitAugment(angle=0, erase=4)(ones, gen(1))
    changed = (plain - erased).abs() > 1e-6
    assert (erased[changed] == 0).all()
    for mask in changed[:, 0]:
        rows, cols = mask.nonzero(as_tuple=True)
        assert 0 < len(rows) <= 16 and rows.max() - rows.min() <= 3 and cols.max() - cols.min() <= 3
        assert rows.min() >= 4 and cols.min() >= 4 and rows.max() <= 25 and cols.max() <= 25
    rotated = DigitAugment(angle=30, erase=0)(ones, gen(1))
    tilted = (rotated - plain).abs().amax(dim=(1, 2, 3)) > 1e-3  # a rotation moves the block's edges
    assert 10 < int(tilted.sum()) < 54  # about half the images


@pytest.mark.parametrize(
    "kwargs, images, message",
    [
        ({}, torch.rand(2, 1, 8, 8), "at least 10 pixels"),
        ({}, torch.zeros(2, 1, 28, 28, dtype=torch.int64), "uint8 or floating-point"),
        ({}, torch.rand(1, 28, 28), r"\(B, C, H, W\)"),
    ],
)
def test_digit_augment_bad_input_says_what_is_wrong(kwargs, images, message):
    with pytest.raises(ValueError, match=message):
        DigitAugment(**kwargs)(images, gen())


@pytest.mark.parametrize("kwargs, message", [({"angle": -1}, "angle"), ({"erase": 1.5}, "erase")])
def test_digit_augment_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DigitAugment(**kwargs)
