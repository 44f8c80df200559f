"""Cluttered-digit segmentation: an offline stand-in for SegCaps' segmentation data.

SegCaps (LaLonde & Bagci 2018, "Capsules for Object Segmentation") was evaluated on LUNA16 lung CT slices,
which are not available here. This generator makes a segmentation task from MNIST digits in the style of
cluttered MNIST (Mnih et al. 2014): one whole digit (the object) at a random position on a black canvas, plus
``clutter`` random ``patch x patch`` pieces of other digits at random positions. The mask is the object
digit's pixels above ``threshold``. A pixel threshold cannot solve it: clutter pieces are strokes of the same
intensity, and where they overlap the digit the image keeps the brighter value (the mask still marks the
digit).

Everything is drawn on the device of ``images`` from one seeded generator (deterministic for a seed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.data.affnist import place_randomly


@dataclass(frozen=True)
class SegmentationData:
    """Images and their binary object masks.

    Shape:
        - images: ``(N, 1, S, S)`` in ``[0, 1]``
        - masks: ``(N, 1, S, S)`` float 0/1
    """

    images: Tensor
    masks: Tensor

    def __len__(self) -> int:
        return len(self.images)


def make_digit_segmentation(
    digits: Tensor, count: int, *, seed: int, size: int = 32, clutter: int = 4, patch: int = 8, threshold: float = 0.5
) -> SegmentationData:
    """``count`` cluttered-digit images with the masks of their object digits (see the module docstring).

    Args:
        digits: ``(N, 1, 28, 28)`` source digits in ``[0, 1]`` (objects and clutter are drawn from them).
        count: number of examples.
        seed: seeds the generator (on the device of ``digits``).
        size: canvas side (>= the digit side).
        clutter: pieces of other digits per image (0: a clean digit on black).
        patch: side of a clutter piece.
        threshold: object pixels above it form the mask.
    """
    if digits.dim() != 4 or digits.shape[1] != 1:
        raise ValueError(f"digits must be (N, 1, H, W), got {tuple(digits.shape)}")
    if count < 1 or clutter < 0 or not 0 < patch <= digits.shape[-1]:
        raise ValueError(
            f"need count >= 1, clutter >= 0 and 0 < patch <= {digits.shape[-1]}; got count={count}, "
            f"clutter={clutter}, patch={patch}"
        )
    generator = torch.Generator(device=digits.device).manual_seed(seed)
    pick = torch.randint(0, len(digits), (count,), generator=generator, device=digits.device)
    objects = place_randomly(digits[pick], generator, size=size)  # (count, 1, S, S)
    image = objects.clone()
    for _ in range(clutter):
        source = digits[torch.randint(0, len(digits), (count,), generator=generator, device=digits.device)]
        image = torch.maximum(image, place_randomly(_random_crops(source, patch, generator), generator, size=size))
    return SegmentationData(image, (objects > threshold).to(image.dtype))


def _random_crops(images: Tensor, patch: int, generator: torch.Generator) -> Tensor:
    """A random ``patch x patch`` window of each image, ``(N, C, H, W) -> (N, C, patch, patch)``."""
    count, _, height, width = images.shape
    top = torch.randint(0, height - patch + 1, (count, 1, 1), generator=generator, device=images.device)
    left = torch.randint(0, width - patch + 1, (count, 1, 1), generator=generator, device=images.device)
    steps = torch.arange(patch, device=images.device)
    rows = (top + steps.view(1, patch, 1)).expand(count, patch, patch)
    cols = (left + steps.view(1, 1, patch)).expand(count, patch, patch)
    index = torch.arange(count, device=images.device).view(count, 1, 1)
    return images[index, :, rows, cols].permute(0, 3, 1, 2)  # (N, patch, patch, C) -> (N, C, patch, patch)
