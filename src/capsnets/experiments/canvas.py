"""MNIST digits on the 40x40 canvas of "expanded MNIST" (Sabour, Frosst & Hinton 2017, Sec. 5.2) as a training set
of the engine's trainer, for the ``affnist`` and ``routers`` experiments.

The trainer takes splits of one image size, and the validation and test digits are placed on the canvas once; so the
training digits are stored centred on the canvas, and every training batch moves each digit to a random position
(:class:`Replace`), as :class:`~capsnets.data.affnist.RandomPlacement` places the bare digits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.data import TensorData
from capsnets.data.affnist import AFFNIST_SIZE, place_randomly

__all__ = ["Replace", "canvas_training_set"]


@dataclass(frozen=True)
class Replace:
    """``augment(images, generator)``: each ``digit x digit`` image centred on its canvas moved to a random position
    of the canvas (:func:`~capsnets.data.affnist.place_randomly`).

    Shape:
        ``(B, C, size, size)`` -> ``(B, C, size, size)``.
    """

    digit: int = 28

    def __call__(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        size = images.shape[-1]
        first = (size - self.digit) // 2
        digits = images[..., first : first + self.digit, first : first + self.digit]
        return place_randomly(digits, generator, size=size)


def canvas_training_set(digits: TensorData, size: int = AFFNIST_SIZE) -> TensorData:
    """``digits`` centred on a ``size x size`` canvas, moved to random positions in training (:class:`Replace`)."""
    height = digits.images.shape[-1]
    offsets = torch.full((len(digits), 2), (size - height) // 2)
    centred = place_randomly(digits.images, size=size, offsets=offsets)
    return TensorData(
        centred,
        digits.labels,
        digits.num_classes,
        list(digits.classes),
        name=f"{digits.name}_canvas{size}",
        augment=Replace(height),
    )
