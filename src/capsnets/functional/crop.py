"""Crops of image batches: a random window per image, or the central one (one batched gather, no loops).

Stateless tensor functions used by the data pipeline (:mod:`capsnets.data.transforms`) and by models that crop
their own input (Sabour et al. 2017, Sec. 7: 24x24 patches of CIFAR-10's 32x32 images).
"""

from __future__ import annotations

import torch
from torch import Tensor

from capsnets.validation import ArgumentError

__all__ = ["center_crop", "random_crop"]


def _check_crop(images: Tensor, size: int) -> None:
    if images.dim() != 4:
        raise ArgumentError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    height, width = images.shape[-2:]
    if not isinstance(size, int) or not 0 < size <= min(height, width):
        raise ArgumentError(
            f"size must be an int in [1, {min(height, width)}] for {height}x{width} images, got {size!r}"
        )


def random_crop(
    images: Tensor, size: int, generator: torch.Generator | None = None, offsets: Tensor | None = None
) -> Tensor:
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
        raise ArgumentError(f"offsets must be ({batch}, 2), got {tuple(offsets.shape)}")
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
    return images[:, :, top : top + size, left : left + size]
