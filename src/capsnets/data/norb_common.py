"""The raw container shared by smallNORB-like data sets, before the training protocol is applied.

Both :class:`~capsnets.data.smallnorb.SmallNORB` (the real files) and
``capsnets.data.viewpoints.load_viewpoints`` (the offline rendered stand-in) produce a
:class:`RawNorbLike`; :func:`capsnets.data.transforms.norb_protocol` turns one into a
:class:`~capsnets.data.base.TensorData` (resize to 48, normalise, crop 32).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from capsnets.images import NORB_CROP, NORB_SIZE
from capsnets.validation import ArgumentError

from .base import TensorData
from .transforms import NorbAugment, center_crop, resize, standardize

__all__ = ["RawNorbLike", "NORB_INFO_KEYS", "norb_protocol", "NORB_SIZE", "NORB_CROP"]

_CHUNK = 2048

#: Per-example metadata every smallNORB-like data set carries (int64, one value per image).
#: ``instance``: toy index; ``elevation``: index (smallNORB 0..8 = 30..70 degrees in 5-degree steps);
#: ``azimuth``: smallNORB units 0, 2, ..., 34 (x10 = degrees); ``lighting``: index (smallNORB 0..5).
NORB_INFO_KEYS = ("instance", "elevation", "azimuth", "lighting")


@dataclass
class RawNorbLike:
    """One split of a smallNORB-like data set, as stored (no resizing, no normalisation).

    Args:
        images: uint8 grey-level images.
        labels: int64 class indices in ``[0, len(classes))``.
        info: int64 per-example metadata; must contain at least :data:`NORB_INFO_KEYS`
            (extra keys are allowed and carried along).
        classes: class names, index = label.

    Shape:
        - images: ``(N, H, W)``
        - labels: ``(N,)``
        - info[k]: ``(N,)``
    """

    images: Tensor
    labels: Tensor
    info: dict[str, Tensor]
    classes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.images.dim() != 3 or self.images.dtype != torch.uint8:
            raise ArgumentError(f"images must be uint8 (N, H, W), got {self.images.dtype} {tuple(self.images.shape)}")
        n = len(self.images)
        if self.labels.shape != (n,):
            raise ArgumentError(f"labels must have shape ({n},), got {tuple(self.labels.shape)}")
        missing = [k for k in NORB_INFO_KEYS if k not in self.info]
        if missing:
            raise ArgumentError(f"info lacks keys {missing}; needs {list(NORB_INFO_KEYS)}")
        for key, value in self.info.items():
            if value.shape != (n,):
                raise ArgumentError(f"info[{key!r}] must have shape ({n},), got {tuple(value.shape)}")
        self.labels = self.labels.long()
        self.info = {k: v.long() for k, v in self.info.items()}

    def __len__(self) -> int:
        return len(self.labels)


def norb_protocol(
    raw: RawNorbLike,
    train: bool,
    *,
    name: str = "",
    size: int = NORB_SIZE,
    crop: int = NORB_CROP,
    brightness: float = 0.25,
    contrast: float = 0.5,
):
    """Apply the smallNORB protocol of Hinton et al. 2018 to one raw split.

    Both splits: uint8 -> ``[0, 1]`` float32, area-downscale to ``size x size`` (no-op if already that
    size), per-image standardisation (:func:`~capsnets.data.transforms.standardize`).
    Train: images stay ``size x size``; ``augment`` is a :class:`~capsnets.data.transforms.NorbAugment`
    (random ``crop x crop`` window + brightness/contrast jitter), applied per batch by
    :class:`~capsnets.data.device.DeviceLoader`, so the model sees ``crop x crop``.
    Test: the central ``crop x crop`` window, stored already cropped; no ``augment``.
    Both carry ``raw.info`` (int64 per-example metadata) as ``TensorData.info``.

    Args:
        raw: the split as stored.
        train: apply the training (True) or test (False) half of the protocol.
        name: ``TensorData.name``.
        size, crop, brightness, contrast: the protocol's numbers (defaults: 48, 32, 0.25, 0.5).

    Returns:
        A :class:`~capsnets.data.base.TensorData`; images ``(N, 1, size, size)`` (train) or
        ``(N, 1, crop, crop)`` (test), float32, zero mean and unit variance per (uncropped) image.
    """
    chunks = [
        standardize(resize(part.unsqueeze(1).float().div_(255.0), size))  # (n, 1, size, size)
        for part in raw.images.split(_CHUNK)
    ]  # chunks bound the float copy of 96x96 images
    images = torch.cat(chunks) if chunks else torch.zeros(0, 1, size, size)
    augment = NorbAugment(crop, brightness, contrast) if train else None
    if not train:
        images = center_crop(images, crop).contiguous()
    return TensorData(
        images, raw.labels, len(raw.classes), list(raw.classes), name, info=dict(raw.info), augment=augment
    )
