"""Data sets by name: :func:`load_dataset`, :func:`list_datasets`, :func:`dataset_info`.

Every loader returns a :class:`~capsnets.data.base.TensorData` of float32 images: in ``[0, 1]`` for
the digit data sets; for the smallNORB-like ones (``"smallnorb"``, ``"viewpoints"``) standardised per
image and prepared by :func:`~capsnets.data.norb_common.norb_protocol`: the train split is 48x48 with
an ``augment`` (random 32x32 crop + brightness/contrast) applied per batch by the
:class:`~capsnets.data.device.DeviceLoader`, the test split is centre-cropped to 32x32.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import torch

from .base import TensorData, data_root
from .digits import DIGITS_CLASSES, load_digits_split
from .errors import DatasetError
from .mnist import MNIST, FashionMNIST, IdxImageDataset
from .norb_common import NORB_CROP, RawNorbLike, norb_protocol
from .smallnorb import SMALLNORB_CLASSES, SmallNORB

__all__ = ["DatasetInfo", "load_dataset", "list_datasets", "dataset_info"]


@dataclass(frozen=True)
class DatasetInfo:
    """What a data set is, known without reading any file.

    Attributes:
        name: canonical name (``"digits"``, ``"mnist"``, ``"fashion_mnist"``).
        num_classes: number of classes.
        image_shape: ``(C, H, W)`` the model sees. For smallNORB-like data sets this is the 32x32
            crop; their TRAIN tensors are 48x48 and cropped per batch by ``TensorData.augment``.
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
    "smallnorb": DatasetInfo("smallnorb", 5, (1, NORB_CROP, NORB_CROP), tuple(SMALLNORB_CLASSES),
                             24_300, 24_300, True),
    # The offline rendered stand-in; sizes are those of the full smallNORB grid it follows
    # (5 classes x 5 instances x 18 azimuths x 9 elevations x 6 lightings per split).
    "viewpoints": DatasetInfo("viewpoints", 5, (1, NORB_CROP, NORB_CROP), tuple(SMALLNORB_CLASSES),
                              24_300, 24_300, True),
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
        download: fetch missing files from the official mirrors (mnist, fashion_mnist, smallnorb).
        device: where the returned tensors live.

    Raises:
        ValueError: unknown ``name``.
        DatasetError: files missing (and ``download=False``), corrupt or failing their md5.

    Shape:
        - images: ``(N, C, H, W)``; labels: ``(N,)``; smallnorb / viewpoints: ``(N, 1, 48, 48)``
          (train, 32x32 after ``augment``) or ``(N, 1, 32, 32)`` (test), plus ``info``.
    """
    key = _canonical(name)
    info = _INFO[key]
    if key in ("smallnorb", "viewpoints"):
        raw = SmallNORB(root, train=train, download=download).raw() if key == "smallnorb" else _viewpoints(root, train)
        return norb_protocol(raw, train, name=key).to(device)
    if key == "digits":
        images, labels = load_digits_split(train)
    else:
        split = _IDX_CLASSES[key](root, train=train, download=download)
        images, labels = split.images.unsqueeze(1).float().div_(255.0), split.labels
    data = TensorData(images, labels, info.num_classes, list(info.classes), key)
    return data.to(device)


def _viewpoints(root: str | os.PathLike | None, train: bool) -> RawNorbLike:
    """The rendered viewpoint data set's raw split, imported lazily (it lives in its own package)."""
    try:
        load_viewpoints = importlib.import_module("capsnets.data.viewpoints").load_viewpoints
    except (ModuleNotFoundError, AttributeError) as err:
        if isinstance(err, ModuleNotFoundError) and err.name != "capsnets.data.viewpoints":
            raise  # the package exists but one of its own imports failed: show that error
        raise DatasetError(
            "viewpoints: the rendered data set is not available in this installation "
            f"(capsnets.data.viewpoints.load_viewpoints could not be imported: {err}); "
            "update capsnets, or use another --dataset"
        ) from err
    return load_viewpoints(data_root(root), train=train)
