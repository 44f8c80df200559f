"""Batched, device-side image transforms for the smallNORB protocol and for digits (no per-sample Python loops).

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

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from capsnets.functional.crop import center_crop, random_crop
from capsnets.images import standardize
from capsnets.validation import ArgumentError

__all__ = [
    "AUGMENTATIONS",
    "DigitAugment",
    "NorbAugment",
    "brightness_contrast",
    "center_crop",
    "random_crop",
    "resize",
    "standardize",
]


def _check_batch(images: Tensor) -> None:
    if images.dim() != 4:
        raise ArgumentError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")


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


def brightness_contrast(
    images: Tensor, generator: torch.Generator | None = None, *, brightness: float = 0.25, contrast: float = 0.5
) -> Tensor:
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
        raise ArgumentError(f"brightness must be >= 0, got {brightness!r}")
    if not 0 <= contrast <= 1:
        raise ArgumentError(f"contrast must be in [0, 1], got {contrast!r}")
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


@dataclass(frozen=True)
class DigitAugment:
    """The digit augmentation of Efficient-CapsNet's released code (Mazzia, Salvetti & Chiaberge 2021;
    EscVM/Efficient-CapsNet, ``utils/pre_process_mnist.py``): a random rotation, a random horizontal squeeze and
    a random erased patch, each drawn per image.

    - rotation, of half the images (a fair coin each): ``angle * clip(N(0, 0.33), -0.9999, 0.9999)`` degrees
      about the image centre;
    - squeeze: the image shrunk horizontally by ``w = floor(clip(|N(0, 0.33)|, 0.9999) * W / 4) + 1`` pixels and
      placed ``w // 2 + {0, 1}`` pixels from the left edge;
    - erase: an ``erase x erase`` patch set to zero, its top-left corner uniform in ``[4, H - erase - 2]`` on
      each axis (``[4, 22]`` for 28x28 images, as the authors').

    A picklable callable ``(images, generator) -> images`` for ``DeviceLoader(augment=...)``; the trainer uses
    it with ``augment="digits"``, after the loader's random shifts (``max_shift``). Deviations from the released
    code: bilinear resampling for the rotation and the squeeze (OpenCV's bilinear rotation and TensorFlow's
    Lanczos resize there), and the library's uniform shifts of up to ``max_shift`` pixels in place of the
    authors' shift within each digit's margins.

    Args:
        angle: the largest rotation in degrees.
        erase: side of the erased patch in pixels (0: none).

    Shape:
        - input: ``(B, C, H, W)``, ``H, W >= erase + 6``; uint8 images are read as ``[0, 255]`` values
        - output: ``(B, C, H, W)``, float32 in the input's scale divided by 255 for uint8 (``[0, 1]``), else the
          input's dtype

    Examples::

        >>> images = torch.rand(8, 1, 28, 28)
        >>> DigitAugment()(images, torch.Generator().manual_seed(0)).shape
        torch.Size([8, 1, 28, 28])
    """

    angle: float = 30.0
    erase: int = 4

    def __post_init__(self) -> None:
        if not (isinstance(self.angle, (int, float)) and 0 <= self.angle <= 180):
            raise ArgumentError(f"angle must be a number of degrees in [0, 180], got {self.angle!r}")
        if not (isinstance(self.erase, int) and self.erase >= 0):
            raise ArgumentError(f"erase must be a non-negative number of pixels, got {self.erase!r}")

    def __call__(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        _check_batch(images)
        batch, _, height, width = images.shape
        if min(height, width) < self.erase + 6:
            raise ArgumentError(
                f"DigitAugment(erase={self.erase}) needs images of at least {self.erase + 6} "
                f"pixels a side, got {height}x{width}"
            )
        if images.dtype == torch.uint8:
            images = images.float() / 255
        elif not images.is_floating_point():
            raise ArgumentError(f"DigitAugment needs uint8 or floating-point images, got {images.dtype}")
        device = generator.device if generator is not None else images.device
        draw = dict(generator=generator, device=device, dtype=torch.float64)
        normal = torch.randn(batch, 3, **draw) * 0.33
        uniform = torch.rand(batch, 4, **draw)
        radians = torch.where(
            uniform[:, 0] < 0.5,
            normal[:, 0].clamp(-0.9999, 0.9999) * math.radians(self.angle),
            torch.zeros_like(normal[:, 0]),
        )
        squeeze = torch.floor(normal[:, 1].abs().clamp(max=0.9999) * (width / 4)) + 1  # pixels taken off the width
        left = torch.floor(squeeze / 2) + torch.floor(uniform[:, 1] * 2)  # where the squeezed image starts
        # Output pixel x (normalised, align_corners=False) reads the squeezed image's source at
        # (x * W / 2 + W / 2 - left) * W / (W - squeeze) - W / 2, rotated about the centre.
        scale = width / (width - squeeze)
        offset = (width / 2 - left) * scale / (width / 2) - 1
        cos, sin = torch.cos(radians), torch.sin(radians)
        theta = torch.zeros(batch, 2, 3, **{k: v for k, v in draw.items() if k != "generator"})
        theta[:, 0, 0], theta[:, 0, 1], theta[:, 0, 2] = cos * scale, -sin * height / width, cos * offset
        aspect = width / height
        theta[:, 1, 0], theta[:, 1, 1], theta[:, 1, 2] = sin * scale * aspect, cos, sin * offset * aspect
        grid = F.affine_grid(theta.to(images.device, images.dtype), list(images.shape), align_corners=False)
        out = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        # the columns left and right of the squeezed image are empty (whatever the rotation would read there)
        column = (torch.arange(width, device=device, dtype=torch.float64) + 0.5) * 2 / width - 1
        squeezed = scale.view(batch, 1) * column.view(1, width) + offset.view(batch, 1)
        inside = (squeezed.abs() <= 1).to(images.device, out.dtype)
        out = out * inside.view(batch, 1, 1, width)
        if self.erase:
            span = torch.tensor([height, width], device=device, dtype=torch.float64) - self.erase - 5
            corner = (torch.floor(uniform[:, 2:] * span) + 4).long().to(images.device)  # (B, 2): row, column
            rows = torch.arange(height, device=images.device).view(1, height, 1)
            cols = torch.arange(width, device=images.device).view(1, 1, width)
            top, first = corner[:, 0].view(batch, 1, 1), corner[:, 1].view(batch, 1, 1)
            patch = (rows >= top) & (rows < top + self.erase) & (cols >= first) & (cols < first + self.erase)
            out = out.masked_fill(patch.unsqueeze(1), 0.0)
        return out


#: The training augmentations the trainer offers by name (``TrainConfig.augment``, ``--augment``).
AUGMENTATIONS = {"digits": DigitAugment}
