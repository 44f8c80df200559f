"""The in-memory data set container and the data-root setting.

A :class:`TensorData` is a whole data set as two tensors, small enough (MNIST: 188 MB as float32)
to live on the training device and be batched there by :class:`~capsnets.data.device.DeviceLoader`.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["TensorData", "data_root", "DATA_ENV_VAR"]

#: Environment variable naming the data root when no ``root`` / ``--data-dir`` is given.
DATA_ENV_VAR = "CAPSNETS_DATA"


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
        images: float32 pixel values in ``[0, 1]``.
        labels: int64 class indices in ``[0, num_classes)``.
        num_classes: number of classes.
        classes: class names, ``len(classes) == num_classes``.
        name: data set name, e.g. ``"mnist"``; ``"mnist[:100]"`` after :meth:`subset`.

    Shape:
        - images: ``(N, C, H, W)``
        - labels: ``(N,)``
    """

    images: Tensor
    labels: Tensor
    num_classes: int
    classes: list[str] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
        if self.images.dim() != 4:
            raise ValueError(f"images must be (N, C, H, W), got shape {tuple(self.images.shape)}")
        if self.labels.dim() != 1 or len(self.labels) != len(self.images):
            raise ValueError(
                f"labels must be (N,) with N={len(self.images)}, got shape {tuple(self.labels.shape)}"
            )
        if self.classes and len(self.classes) != self.num_classes:
            raise ValueError(f"classes has {len(self.classes)} names but num_classes={self.num_classes}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        return tuple(self.images.shape[1:])

    @property
    def device(self) -> torch.device:
        return self.images.device

    def to(self, device: str | torch.device) -> "TensorData":
        """A copy with both tensors on ``device`` (no copy if already there)."""
        return dataclasses.replace(self, images=self.images.to(device), labels=self.labels.to(device))

    def subset(self, n: int) -> "TensorData":
        """The first ``n`` examples, in stored order (deterministic; not re-balanced by class).

        Stored orders are already mixed: MNIST's files are, and the digits split keeps the
        original interleaved order, so a prefix has roughly every class.
        """
        if not 0 < n <= len(self):
            raise ValueError(f"n must be in [1, {len(self)}], got {n}")
        return dataclasses.replace(
            self, images=self.images[:n], labels=self.labels[:n], name=f"{self.name}[:{n}]"
        )
