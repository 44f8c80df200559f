"""Batched smallNORB transforms: shapes, exact windows, jitter ranges, determinism."""
import pytest
import torch
import torch.nn.functional as F

from capsnets.data import NorbAugment, brightness_contrast, center_crop, random_crop, resize, standardize


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
        assert torch.equal(out[b], images[b, :, top:top + 32, left:left + 32])


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
