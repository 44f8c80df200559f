"""Segmentation data (:class:`SegmentationData`) and cluttered digits, an offline stand-in for SegCaps' data.

:class:`SegmentationData` holds images with a mask of class indices per pixel: the cluttered digits below
(binary: 0 background, 1 object) and ``segfolder:PATH`` folders of your own images and masks
(:mod:`capsnets.data.seg_folder`).

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

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from capsnets.data.affnist import place_randomly
from capsnets.validation import ArgumentError


@dataclass(frozen=True)
class SegmentationData:
    """Images and the class of each of their pixels.

    Args:
        images: float32 pixel values in ``[0, 1]``.
        masks: class indices in ``[0, num_classes)``, 0 the background: float 0/1 (the cluttered digits) or
            uint8 (folders).
        num_classes: number of classes, the background included (2 for a binary mask).
        classes: class names, index = class (empty: unnamed).
        name: the data set's name (``"segfolder:PATH"``; ``"...[:100]"`` after :meth:`subset`).
        mask_format: how the masks were written (``mode``: ``"L"``, ``"P"`` or ``"RGB"``; ``values``: each
            class's pixel value or colour; ``palette`` for ``"P"``), so predicted masks can be written alike;
            None for generated data.

    Shape:
        - images: ``(N, C, H, W)``
        - masks: ``(N, 1, H, W)``
    """

    images: Tensor
    masks: Tensor
    num_classes: int = 2
    classes: tuple[str, ...] = ()
    name: str = ""
    mask_format: dict | None = None

    #: What a model trained on this data does (see :mod:`capsnets.engine.tasks`).
    task: ClassVar[str] = "segmentation"
    #: No training-time transform of its own (a shift would move the images away from their masks).
    augment: ClassVar[None] = None

    def __post_init__(self) -> None:
        if self.images.dim() != 4 or self.masks.dim() != 4 or self.masks.shape[1] != 1:
            raise ArgumentError(
                f"images must be (N, C, H, W) and masks (N, 1, H, W), got {tuple(self.images.shape)} and "
                f"{tuple(self.masks.shape)}"
            )
        if self.masks.shape[0] != self.images.shape[0] or self.masks.shape[2:] != self.images.shape[2:]:
            raise ArgumentError(
                f"masks {tuple(self.masks.shape)} do not match images {tuple(self.images.shape)} in count and size"
            )
        if self.classes and len(self.classes) != self.num_classes:
            raise ArgumentError(f"classes has {len(self.classes)} names but num_classes={self.num_classes}")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        return tuple(self.images.shape[1:])

    input_shape = image_shape

    def to(self, device: str | torch.device) -> SegmentationData:
        """A copy with images and masks on ``device`` (no copy if already there)."""
        return dataclasses.replace(self, images=self.images.to(device), masks=self.masks.to(device))

    def subset(self, n: int) -> SegmentationData:
        """The first ``n`` examples, in stored order."""
        if not 0 < n <= len(self):
            raise ArgumentError(f"n must be in [1, {len(self)}], got {n}")
        return dataclasses.replace(self, images=self.images[:n], masks=self.masks[:n], name=f"{self.name}[:{n}]")


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
        raise ArgumentError(f"digits must be (N, 1, H, W), got {tuple(digits.shape)}")
    if count < 1 or clutter < 0 or not 0 < patch <= digits.shape[-1]:
        raise ArgumentError(
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
