"""Batched, device-side image transforms for the smallNORB protocol (no per-sample Python loops).

Protocol (Hinton, Sabour & Frosst 2018, "Matrix capsules with EM routing", section 5): "downscale
smallNORB to 48x48 pixels and normalise each image to have zero mean and unit variance. During
training, we randomly crop 32x32 patches and add random brightness and contrast to the cropped
images. During test, we crop a 32x32 patch from the center of the image."

Choices made here (the paper gives no numbers):

- normalisation is per-image standardisation (:func:`standardize`, as TensorFlow's
  ``per_image_standardization``) of the 48x48 image, done once at load time, BEFORE the jitter, so the
  jitter is not undone (standardising after brightness/contrast would cancel both);
- brightness adds ``U(-brightness, brightness)`` per image (units: the standardised values, i.e.
  per-image standard deviations; default 0.25), contrast scales each image about its own mean by
  ``U(1 - contrast, 1 + contrast)`` (default 0.5, i.e. ``[0.5, 1.5]``, the range of the common
  TensorFlow re-implementations' ``random_contrast(0.5, 1.5)``);
- the models therefore see zero-mean, roughly unit-variance 32x32 images, not values in ``[0, 1]``.

Random parameters are drawn from the given ``torch.Generator`` on ITS device (a CPU generator is
fine for CUDA images), then moved to the images' device, so results depend only on the generator.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["resize", "standardize", "random_crop", "center_crop", "brightness_contrast", "NorbAugment"]


def _check_batch(images: Tensor) -> None:
    if images.dim() != 4:
        raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")


def _check_crop(images: Tensor, size: int) -> None:
    _check_batch(images)
    height, width = images.shape[-2:]
    if not isinstance(size, int) or not 0 < size <= min(height, width):
        raise ValueError(f"size must be an int in [1, {min(height, width)}] for {height}x{width} images, got {size!r}")


def resize(images: Tensor, size: int | tuple[int, int]) -> Tensor:
    """Downscale with area averaging (``F.interpolate(mode="area")``); a no-op at the same size.

    Shape:
        - images: ``(B, C, H, W)`` floating point
        - output: ``(B, C, size, size)`` (or ``(B, C, *size)``)
    """
    _check_batch(images)
    size = (size, size) if isinstance(size, int) else tuple(size)
    if tuple(images.shape[-2:]) == size:
        return images
    return F.interpolate(images, size=size, mode="area")


def standardize(images: Tensor) -> Tensor:
    """Per-image zero mean and unit variance: ``(x - mean) / max(std, 1 / sqrt(C*H*W))``.

    The floor on the standard deviation (as TensorFlow's ``per_image_standardization``) keeps a
    constant image finite (it becomes all zeros).

    Shape:
        - images, output: ``(B, C, H, W)``
    """
    _check_batch(images)
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    std = images.std(dim=(1, 2, 3), keepdim=True, unbiased=False)
    return (images - mean) / std.clamp_min(images[0].numel() ** -0.5)


def random_crop(images: Tensor, size: int, generator: torch.Generator | None = None,
                offsets: Tensor | None = None) -> Tensor:
    """A ``size x size`` window of each image at its own uniformly drawn position (one batched gather).

    ``out[b, :, i, j] = images[b, :, top_b + i, left_b + j]`` with ``top_b`` in ``[0, H - size]`` and
    ``left_b`` in ``[0, W - size]``.

    Args:
        images: the batch, on any device.
        size: side of the square crop.
        generator: drawn from if given (on its device); else torch's global RNG.
        offsets: explicit integer ``(top, left)`` per image instead of drawing them.

    Shape:
        - images: ``(B, C, H, W)``; offsets: ``(B, 2)``
        - output: ``(B, C, size, size)``
    """
    _check_crop(images, size)
    batch, _, height, width = images.shape
    if offsets is None:
        device = generator.device if generator is not None else images.device
        top = torch.randint(0, height - size + 1, (batch,), generator=generator, device=device)
        left = torch.randint(0, width - size + 1, (batch,), generator=generator, device=device)
        offsets = torch.stack([top, left], dim=1)
    if offsets.shape != (batch, 2):
        raise ValueError(f"offsets must be ({batch}, 2), got {tuple(offsets.shape)}")
    offsets = offsets.to(images.device, torch.long)
    step = torch.arange(size, device=images.device)
    rows = offsets[:, 0, None] + step  # (B, size)
    cols = offsets[:, 1, None] + step  # (B, size)
    index = torch.arange(batch, device=images.device)[:, None, None]
    out = images[index, :, rows[:, :, None], cols[:, None, :]]  # (B, size, size, C)
    return out.permute(0, 3, 1, 2).contiguous()


def center_crop(images: Tensor, size: int) -> Tensor:
    """The central ``size x size`` window, starting at row ``(H - size) // 2``, column ``(W - size) // 2``.

    Shape:
        - images: ``(B, C, H, W)``
        - output: ``(B, C, size, size)``
    """
    _check_crop(images, size)
    top, left = (images.shape[-2] - size) // 2, (images.shape[-1] - size) // 2
    return images[:, :, top:top + size, left:left + size]


def brightness_contrast(images: Tensor, generator: torch.Generator | None = None, *,
                        brightness: float = 0.25, contrast: float = 0.5) -> Tensor:
    """Random per-image contrast, then brightness: ``(x - m_b) * c_b + m_b + d_b``.

    ``m_b`` is image ``b``'s mean, ``c_b ~ U(1 - contrast, 1 + contrast)``, ``d_b ~ U(-brightness,
    brightness)``. No clipping (the images are standardised values, not bounded pixels).

    Args:
        images: floating-point batch.
        generator: drawn from if given (on its device); else torch's global RNG.
        brightness: largest additive shift, ``>= 0``.
        contrast: largest relative change of contrast, in ``[0, 1]``.

    Shape:
        - images, output: ``(B, C, H, W)``
    """
    _check_batch(images)
    if brightness < 0:
        raise ValueError(f"brightness must be >= 0, got {brightness!r}")
    if not 0 <= contrast <= 1:
        raise ValueError(f"contrast must be in [0, 1], got {contrast!r}")
    batch = images.shape[0]
    device = generator.device if generator is not None else images.device
    uniform = torch.rand(batch, 2, generator=generator, device=device, dtype=torch.float64) * 2 - 1  # U(-1, 1)
    factor = (1 + contrast * uniform[:, 0]).to(images.device, images.dtype).view(batch, 1, 1, 1)
    shift = (brightness * uniform[:, 1]).to(images.device, images.dtype).view(batch, 1, 1, 1)
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    return (images - mean) * factor + mean + shift


@dataclass(frozen=True)
class NorbAugment:
    """The smallNORB training augmentation: random ``crop x crop`` window, then brightness/contrast.

    A picklable callable ``(images, generator) -> images`` for ``TensorData.augment`` /
    ``DeviceLoader(augment=...)``. Draws crop offsets first, then jitter, from ``generator``.

    Args:
        crop: side of the random crop (the model's input size).
        brightness: see :func:`brightness_contrast`.
        contrast: see :func:`brightness_contrast`.

    Shape:
        - input: ``(B, C, H, W)`` with ``H, W >= crop``
        - output: ``(B, C, crop, crop)``
    """

    crop: int = 32
    brightness: float = 0.25
    contrast: float = 0.5

    def __call__(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        images = random_crop(images, self.crop, generator)
        return brightness_contrast(images, generator, brightness=self.brightness, contrast=self.contrast)

    def output_shape(self, image_shape: tuple[int, int, int]) -> tuple[int, int, int]:
        """``(C, crop, crop)``: the shape of one augmented image (what the model sees)."""
        return (image_shape[0], self.crop, self.crop)
