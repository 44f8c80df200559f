"""Data sets by name: :func:`load_dataset`, :func:`list_datasets`, :func:`dataset_info`.

Every loader returns a :class:`~capsnets.data.base.TensorData` with float32 images in ``[0, 1]``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .base import TensorData
from .digits import DIGITS_CLASSES, load_digits_split
from .mnist import MNIST, FashionMNIST, IdxImageDataset

__all__ = ["DatasetInfo", "load_dataset", "list_datasets", "dataset_info"]


@dataclass(frozen=True)
class DatasetInfo:
    """What a data set is, known without reading any file.

    Attributes:
        name: canonical name (``"digits"``, ``"mnist"``, ``"fashion_mnist"``).
        num_classes: number of classes.
        image_shape: ``(C, H, W)``.
        classes: class names, index = label.
        num_train: training-split size.
        num_test: test-split size.
        needs_files: whether the data set reads files under the data root (else it is embedded).
    """

    name: str
    num_classes: int
    image_shape: tuple[int, int, int]
    classes: tuple[str, ...]
    num_train: int
    num_test: int
    needs_files: bool


def _idx_info(name: str, cls: type[IdxImageDataset]) -> DatasetInfo:
    return DatasetInfo(name, len(cls.classes), (1, *cls.image_size), tuple(cls.classes), 60_000, 10_000, True)


_INFO = {
    "digits": DatasetInfo("digits", 10, (1, 8, 8), tuple(DIGITS_CLASSES), 1_437, 360, False),
    "mnist": _idx_info("mnist", MNIST),
    "fashion_mnist": _idx_info("fashion_mnist", FashionMNIST),
}
_IDX_CLASSES = {"mnist": MNIST, "fashion_mnist": FashionMNIST}


def _canonical(name: str) -> str:
    key = name.lower().replace("-", "_")
    if key not in _INFO:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(list_datasets())}")
    return key


def list_datasets() -> list[str]:
    """Canonical names accepted by :func:`load_dataset` (``"fashion-mnist"`` is accepted too)."""
    return list(_INFO)


def dataset_info(name: str) -> DatasetInfo:
    """Classes and shapes of data set ``name`` without loading it."""
    return _INFO[_canonical(name)]


def load_dataset(name: str, *, root: str | os.PathLike | None = None, train: bool = True,
                 download: bool = False, device: str | torch.device = "cpu") -> TensorData:
    """Load one split of a data set by name as float32 images in ``[0, 1]``.

    Args:
        name: one of :func:`list_datasets` (case-insensitive, ``-`` or ``_``).
        root: data root (``--data-dir``); ``None`` means ``$CAPSNETS_DATA`` or ``~/.cache/capsnets/data``.
            Unused by ``"digits"``, which ships inside scikit-learn.
        train: training split if True, else test split.
        download: fetch missing files from the official mirrors (idx data sets only).
        device: where the returned tensors live.

    Raises:
        ValueError: unknown ``name``.
        DatasetError: files missing (and ``download=False``), corrupt or failing their md5.

    Shape:
        - images: ``(N, C, H, W)``; labels: ``(N,)``
    """
    key = _canonical(name)
    info = _INFO[key]
    if key == "digits":
        images, labels = load_digits_split(train)
    else:
        split = _IDX_CLASSES[key](root, train=train, download=download)
        images, labels = split.images.unsqueeze(1).float().div_(255.0), split.labels
    data = TensorData(images, labels, info.num_classes, list(info.classes), key)
    return data.to(device)
