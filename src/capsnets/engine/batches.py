"""Batches of tensors that already live on one device, for :func:`~capsnets.engine.fit`: generated or
preprocessed data sets (the experiments') that no :class:`~capsnets.data.DeviceLoader` data set describes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from capsnets.validation import ArgumentError, positive_int

__all__ = ["TensorBatches"]

Targets = Tensor | tuple[Tensor, ...]


def _take(targets: Targets, index: Tensor | slice) -> Targets:
    return tuple(t[index] for t in targets) if isinstance(targets, tuple) else targets[index]


class TensorBatches:
    """``(images, targets)`` batches of tensors on one device, for :func:`~capsnets.engine.fit`: shuffled every
    epoch by a CPU generator seeded from ``(seed, epoch)``, which then draws ``augment``'s randomness too.

    Args:
        images: ``(N, C, H, W)``; targets: ``(N, ...)`` tensor or tuple of such tensors.
        epoch_data: instead (pass None for both), ``epoch -> (images, targets)`` called before each 1-based
            epoch, e.g. to draw a fresh generated set every epoch.
        augment: optional ``(images, generator) -> images`` applied to each batch.
    """

    def __init__(
        self,
        images: Tensor | None,
        targets: Targets | None,
        batch_size: int,
        *,
        seed: int = 0,
        augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
        epoch_data: Callable[[int], tuple[Tensor, Targets]] | None = None,
    ) -> None:
        if (epoch_data is None) == (images is None):
            raise ArgumentError("pass either images and targets or epoch_data")
        positive_int("batch_size", batch_size)
        self.images, self.targets, self.batch_size, self.seed = images, targets, batch_size, seed
        self.augment, self.epoch_data = augment, epoch_data

    def set_epoch(self, epoch: int) -> None:
        if self.epoch_data is not None:
            self.images, self.targets = self.epoch_data(epoch + 1)
        self.generator = torch.Generator().manual_seed(self.seed * 1000 + epoch + 1)
        self.order = torch.randperm(len(self.images), generator=self.generator).to(self.images.device)

    def __len__(self) -> int:
        return -(-len(self.images) // self.batch_size)

    def iter_from(self, first: int) -> Iterator[tuple[Tensor, Targets]]:
        for k, start in enumerate(range(0, len(self.images), self.batch_size)):
            index = self.order[start : start + self.batch_size]
            images = self.images[index]
            if self.augment is not None:  # also for skipped batches: the generator then stands where it stood
                images = self.augment(images, self.generator)
            if k >= first:
                yield images, _take(self.targets, index)
