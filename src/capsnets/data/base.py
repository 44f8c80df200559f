"""The in-memory data set container, the data-root setting, and the seeded split and order of your own folders.

A :class:`TensorData` is a whole data set as two tensors, small enough (MNIST: 188 MB as float32)
to live on the training device and be batched there by :class:`~capsnets.data.device.DeviceLoader`,
optionally with per-example metadata (``info``) and a training-time transform (``augment``).
:func:`seeded_split` draws the test split of a folder that gives none, and :func:`shuffled` the order in which
its examples are loaded.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

from capsnets.validation import ArgumentError

__all__ = ["TensorData", "data_root", "DATA_ENV_VAR", "seeded_split", "shuffled"]

#: Environment variable naming the data root when no ``root`` / ``--data-dir`` is given.
DATA_ENV_VAR = "CAPSNETS_DATA"

T = TypeVar("T")


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Resolve the folder that holds the data sets (``mnist/``, ``fashion-mnist/``, ...).

    Args:
        root: used if given (``--data-dir``); else ``$CAPSNETS_DATA``; else ``~/.cache/capsnets/data``.
    """
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "capsnets" / "data"


@dataclass
class TensorData:
    """A labelled image data set held as tensors.

    Args:
        images: float32 pixel values in ``[0, 1]``; smallNORB-like data sets hold per-image
            standardised values instead (see :func:`~capsnets.data.norb_common.norb_protocol`).
        labels: int64 class indices in ``[0, num_classes)``, or float32 multi-hot targets ``(N, num_classes)``
            for a multi-label data set (1 where the class is present; any number of classes per image, none
            included): :attr:`multilabel`.
        num_classes: number of classes.
        classes: class names, ``len(classes) == num_classes``.
        name: data set name, e.g. ``"mnist"``; ``"mnist[:100]"`` after :meth:`subset`.
        info: optional per-example int64 metadata (smallNORB: ``instance``, ``elevation``,
            ``azimuth``, ``lighting``), kept aligned with the examples by :meth:`subset`,
            :meth:`select` and :meth:`to`.
        augment: optional training-time transform ``(images, generator) -> images`` that
            :class:`~capsnets.data.device.DeviceLoader` applies to every global batch (e.g. the
            smallNORB random crop, which makes the model's input smaller than ``image_shape``;
            see :attr:`input_shape`).

    Shape:
        - images: ``(N, C, H, W)``
        - labels: ``(N,)``, or ``(N, num_classes)`` multi-hot
        - info[key]: ``(N,)``
    """

    images: Tensor
    labels: Tensor
    num_classes: int
    classes: list[str] = field(default_factory=list)
    name: str = ""
    info: dict[str, Tensor] | None = None
    augment: Callable[[Tensor, torch.Generator], Tensor] | None = None

    def __post_init__(self) -> None:
        if self.images.dim() != 4:
            raise ArgumentError(f"images must be (N, C, H, W), got shape {tuple(self.images.shape)}")
        multi_hot = self.labels.dim() == 2 and self.labels.shape[1] == self.num_classes
        if not (self.labels.dim() == 1 or multi_hot) or len(self.labels) != len(self.images):
            raise ArgumentError(
                f"labels must be (N,) class indices or (N, num_classes) multi-hot with N={len(self.images)} and "
                f"num_classes={self.num_classes}, got shape {tuple(self.labels.shape)}"
            )
        if multi_hot and not self.labels.is_floating_point():
            raise ArgumentError(f"multi-hot labels must be a floating-point tensor, got {self.labels.dtype}")
        if self.classes and len(self.classes) != self.num_classes:
            raise ArgumentError(f"classes has {len(self.classes)} names but num_classes={self.num_classes}")
        for key, value in (self.info or {}).items():
            if not isinstance(value, Tensor) or value.shape != self.labels.shape[:1]:
                raise ArgumentError(
                    f"info[{key!r}] must be a ({len(self)},) tensor, got "
                    f"{getattr(value, 'shape', type(value).__name__)}"
                )
        if self.augment is not None and not callable(self.augment):
            raise ArgumentError(f"augment must be callable (images, generator) -> images, got {self.augment!r}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def multilabel(self) -> bool:
        """Whether the labels are ``(N, num_classes)`` multi-hot targets (several classes per image) rather than
        one class index per image."""
        return self.labels.dim() == 2

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        return tuple(self.images.shape[1:])

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` the model sees: :attr:`image_shape` after ``augment`` (when it has an
        ``output_shape`` method, as :class:`~capsnets.data.transforms.NorbAugment` does)."""
        output_shape = getattr(self.augment, "output_shape", None)
        return tuple(output_shape(self.image_shape)) if output_shape is not None else self.image_shape

    @property
    def device(self) -> torch.device:
        return self.images.device

    def _with(self, index, name: str, device=None) -> TensorData:
        """A copy holding ``images[index]`` etc. (``index=None``: all), moved to ``device`` if given."""

        def take(t: Tensor) -> Tensor:
            t = t if index is None else t[index]
            return t if device is None else t.to(device)

        info = None if self.info is None else {k: take(v) for k, v in self.info.items()}
        return dataclasses.replace(self, images=take(self.images), labels=take(self.labels), info=info, name=name)

    def to(self, device: str | torch.device) -> TensorData:
        """A copy with every tensor (``info`` too) on ``device`` (no copy if already there)."""
        return self._with(None, self.name, device)

    def select(self, index: Tensor | slice | list[int]) -> TensorData:
        """The examples picked by a boolean mask ``(N,)``, integer indices or a slice, ``info`` included.

        ``augment``, classes and ``num_classes`` are kept. Examples:
        ``data.select((data.info["azimuth"] >= 12) & (data.info["azimuth"] <= 22))``.
        """
        if isinstance(index, list):
            index = torch.tensor(index, dtype=torch.long)
        if isinstance(index, Tensor):
            if index.dtype == torch.bool and index.shape != self.labels.shape[:1]:
                raise ArgumentError(f"a boolean mask must have shape ({len(self)},), got {tuple(index.shape)}")
            if index.dtype != torch.bool and (index.dtype.is_floating_point or index.dim() != 1):
                raise ArgumentError(
                    f"index must be a 1-D integer or boolean tensor, got {index.dtype} {tuple(index.shape)}"
                )
            index = index.to(self.device)
        elif not isinstance(index, slice):
            raise ArgumentError(f"index must be a tensor, list or slice, got {type(index).__name__}")
        selected = self._with(index, self.name)
        return dataclasses.replace(selected, name=f"{self.name}[{len(selected)} selected]")

    def subset(self, n: int) -> TensorData:
        """The first ``n`` examples, in stored order (deterministic; not re-balanced by class).

        Stored orders are already mixed: MNIST's files are, and the digits split keeps the
        original interleaved order, so a prefix has roughly every class.
        """
        if not 0 < n <= len(self):
            raise ArgumentError(f"n must be in [1, {len(self)}], got {n}")
        return self._with(slice(0, n), f"{self.name}[:{n}]")


def seeded_split(items: Sequence[T], test_fraction: float, generator: torch.Generator) -> tuple[list[T], list[T]]:
    """Split ``items`` at random into a training and a test list, each in the order of ``items``.

    ``test_fraction * n`` of the ``n`` items (rounded half up; at least 1 and at most ``n - 1``) form the test
    list, and none when ``n < 2``. They are drawn by one ``torch.randperm(n, generator=generator)``, so the same
    items and generator state always give the same split; a stratified split passes each class's items in turn
    with one generator.

    Args:
        items: the items to split.
        test_fraction: share of the items that forms the test list, in ``(0, 1)``.
        generator: draws the permutation, and is advanced by it.

    Example::

        >>> seeded_split(["a", "b", "c", "d", "e"], 0.4, torch.Generator().manual_seed(0))
        (['b', 'c', 'd'], ['a', 'e'])
    """
    n = len(items)
    order = torch.randperm(n, generator=generator).tolist()
    n_test = min(max(int(test_fraction * n + 0.5), 1), n - 1) if n > 1 else 0
    return [items[i] for i in sorted(order[n_test:])], [items[i] for i in sorted(order[:n_test])]


def shuffled(items: Sequence[T], seed: int) -> list[T]:
    """``items`` in an order drawn by ``torch.randperm`` from a generator seeded with ``seed``: the same items and
    seed always give the same order.

    Example::

        >>> shuffled(["a", "b", "c", "d"], 0)
        ['a', 'b', 'd', 'c']
    """
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
    return [items[i] for i in order]
