"""Data sets by name: :func:`load_dataset`, :func:`list_datasets`, :func:`dataset_info`.

Besides the registered names, ``"folder:PATH"`` reads your own images (one subfolder per class, or ``images/``
and a ``labels.csv`` for several labels per image; see :mod:`capsnets.data.image_folder`); ``"segfolder:PATH"``
reads your own images with segmentation masks, as a :class:`~capsnets.data.segmentation.SegmentationData`
(:mod:`capsnets.data.seg_folder`). Every loader returns a :class:`~capsnets.data.base.TensorData` of
float32 images: in ``[0, 1]`` for the digit, CIFAR-10, SVHN and folder data sets; for the smallNORB-like ones (``"smallnorb"``, ``"viewpoints"``) standardised per
image and prepared by :func:`~capsnets.data.norb_common.norb_protocol`: the train split is 48x48 with
an ``augment`` (random 32x32 crop + brightness/contrast) applied per batch by the
:class:`~capsnets.data.device.DeviceLoader`, the test split is centre-cropped to 32x32.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import torch

from capsnets.validation import ArgumentError

from .base import TensorData, data_root
from .cifar import CIFAR10
from .digits import DIGITS_CLASSES, load_digits_split
from .errors import DatasetError
from .image_folder import FOLDER_PREFIX, load_image_folder, scan_image_folder
from .mnist import MNIST, FashionMNIST, IdxImageDataset
from .multimnist import load_multimnist
from .norb_common import NORB_CROP, RawNorbLike, norb_protocol
from .seg_folder import SEGFOLDER_PREFIX, load_segmentation_folder, scan_segmentation_folder
from .segmentation import SegmentationData
from .smallnorb import SMALLNORB_CLASSES, SmallNORB
from .svhn import SVHN

__all__ = ["DatasetInfo", "load_dataset", "list_datasets", "dataset_info"]


@dataclass(frozen=True)
class DatasetInfo:
    """What a data set is, known without reading any file.

    Attributes:
        name: canonical name (``"digits"``, ``"mnist"``, ``"cifar10"``...; ``"folder:PATH"`` as given).
        num_classes: number of classes.
        image_shape: ``(C, H, W)`` the model sees. For smallNORB-like data sets this is the 32x32
            crop; their TRAIN tensors are 48x48 and cropped per batch by ``TensorData.augment``.
        classes: class names, index = label.
        num_train: training-split size.
        num_test: test-split size.
        needs_files: whether the data set reads files under the data root (else it is embedded).
        multilabel: whether an image may have several classes (its labels are ``(N, num_classes)`` multi-hot:
            ``"multimnist"``, a folder with a ``labels.csv``).
    """

    name: str
    num_classes: int
    image_shape: tuple[int, int, int]
    classes: tuple[str, ...]
    num_train: int
    num_test: int
    needs_files: bool
    multilabel: bool = False


def _idx_info(name: str, cls: type[IdxImageDataset]) -> DatasetInfo:
    return DatasetInfo(name, len(cls.classes), (1, *cls.image_size), tuple(cls.classes), 60_000, 10_000, True)


_INFO = {
    "digits": DatasetInfo("digits", 10, (1, 8, 8), tuple(DIGITS_CLASSES), 1_437, 360, False),
    "mnist": _idx_info("mnist", MNIST),
    "fashion_mnist": _idx_info("fashion_mnist", FashionMNIST),
    # Which digits of an overlapping pair are present: two labels per image (capsnets.data.multimnist).
    "multimnist": DatasetInfo("multimnist", 10, (1, 36, 36), tuple(MNIST.classes), 60_000, 10_000, True, True),
    "smallnorb": DatasetInfo("smallnorb", 5, (1, NORB_CROP, NORB_CROP), tuple(SMALLNORB_CLASSES), 24_300, 24_300, True),
    # The offline rendered stand-in; sizes are those of the full smallNORB grid it follows
    # (5 classes x 5 instances x 18 azimuths x 9 elevations x 6 lightings per split).
    "viewpoints": DatasetInfo(
        "viewpoints", 5, (1, NORB_CROP, NORB_CROP), tuple(SMALLNORB_CLASSES), 24_300, 24_300, True
    ),
    "cifar10": DatasetInfo("cifar10", 10, (3, 32, 32), tuple(CIFAR10.classes), 50_000, 10_000, True),
    "svhn": DatasetInfo("svhn", 10, (3, 32, 32), tuple(SVHN.classes), 73_257, 26_032, True),
}
#: Registered data sets read by a class with ``images`` (uint8 ``(N, H, W)`` or ``(N, C, H, W)``) and ``labels``.
_FILE_CLASSES = {"mnist": MNIST, "fashion_mnist": FashionMNIST, "cifar10": CIFAR10, "svhn": SVHN}


#: Other spellings accepted for a registered name.
_ALIASES = {"cifar_10": "cifar10"}


def _canonical(name: str) -> str:
    key = name.lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in _INFO:
        raise ArgumentError(
            f"unknown dataset {name!r}; known: {', '.join(list_datasets())}, or {FOLDER_PREFIX}PATH "
            f"for a folder of your own images ({SEGFOLDER_PREFIX}PATH: images with segmentation masks)"
        )
    return key


def _is_folder(name: str) -> bool:
    return name.startswith(FOLDER_PREFIX)


def _folder_path(name: str, prefix: str = FOLDER_PREFIX) -> str:
    path = name[len(prefix) :]
    if not path:
        raise ArgumentError(f"dataset {name!r} names no folder: expected {prefix}PATH, e.g. {prefix}photos")
    return path


def _check_fixed_size(info: DatasetInfo, image_size) -> None:
    """Registered data sets have a fixed size: ``image_size`` may only restate it."""
    if image_size is None:
        return
    pair = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if pair != info.image_shape[1:]:
        raise ArgumentError(
            f"image_size={image_size!r} applies to {FOLDER_PREFIX}PATH data sets only; {info.name} "
            f"images are {info.image_shape[1]}x{info.image_shape[2]}: leave image_size out"
        )


def list_datasets() -> list[str]:
    """Canonical names accepted by :func:`load_dataset` (``"fashion-mnist"``, ``"CIFAR-10"`` are accepted too), besides
    ``"folder:PATH"``."""
    return list(_INFO)


def dataset_info(name: str, *, image_size: int | tuple[int, int] | None = None) -> DatasetInfo:
    """Classes and shapes of data set ``name`` without loading it.

    For ``"folder:PATH"`` the folder is listed and every image's header read (no pixels are decoded);
    ``image_size`` is as for :func:`load_dataset`. For ``"segfolder:PATH"`` the masks are decoded too (to find
    the classes, the background included).
    """
    if name.startswith(SEGFOLDER_PREFIX):
        seg = scan_segmentation_folder(_folder_path(name, SEGFOLDER_PREFIX), image_size=image_size)
        return DatasetInfo(name, len(seg.classes), seg.image_shape, seg.classes, len(seg.train), len(seg.test), True)
    if _is_folder(name):
        scan = scan_image_folder(_folder_path(name), image_size=image_size)
        return DatasetInfo(
            name,
            len(scan.classes),
            scan.image_shape,
            scan.classes,
            len(scan.train),
            len(scan.test),
            True,
            scan.multilabel,
        )
    info = _INFO[_canonical(name)]
    _check_fixed_size(info, image_size)
    return info


def load_dataset(
    name: str,
    *,
    root: str | os.PathLike | None = None,
    train: bool = True,
    download: bool = False,
    device: str | torch.device = "cpu",
    image_size: int | tuple[int, int] | None = None,
) -> TensorData | SegmentationData:
    """Load one split of a data set by name as float32 images in ``[0, 1]``.

    Args:
        name: one of :func:`list_datasets` (case-insensitive, ``-`` or ``_``), or ``"folder:PATH"``: a
            folder of your own images (PNG, JPEG, GIF, BMP, TIFF, WebP), one subfolder per class, with
            ``train/`` and ``test/`` or split 80/20 by class with seed 0
            (:func:`~capsnets.data.image_folder.load_image_folder`), or
            ``images/`` and a ``labels.csv`` (multi-label: :mod:`capsnets.data.label_csv`); or
            ``"segfolder:PATH"``: ``images/`` and ``masks/`` of your own, returned as a
            :class:`~capsnets.data.segmentation.SegmentationData`
            (:func:`~capsnets.data.seg_folder.load_segmentation_folder`).
        root: data root (``--data-dir``); ``None`` means ``$CAPSNETS_DATA`` or ``~/.cache/capsnets/data``.
            Unused by ``"digits"``, which ships inside scikit-learn, and by folders.
        train: training split if True, else test split.
        download: fetch missing files from the official mirrors (mnist, fashion_mnist, smallnorb, cifar10,
            svhn; multimnist: MNIST's).
        device: where the returned tensors live.
        image_size: folders (``"folder:PATH"``, ``"segfolder:PATH"``) only: ``H`` or ``(H, W)`` every image is
            resized to (default: the first training image's size). The registered data sets have a fixed size and refuse another.

    Raises:
        ValueError: unknown ``name``, or an ``image_size`` a registered data set does not have.
        DatasetError: files missing (and ``download=False``), corrupt or failing their md5; a folder that
            is not one subfolder per class of readable images.

    Shape:
        - images: ``(N, C, H, W)``; labels: ``(N,)``; cifar10 / svhn: ``(N, 3, 32, 32)``;
          ``folder:PATH``: ``(N, 1 or 3, H, W)``; smallnorb / viewpoints: ``(N, 1, 48, 48)``
          (train, 32x32 after ``augment``) or ``(N, 1, 32, 32)`` (test), plus ``info``; multi-label data sets
          (:attr:`DatasetInfo.multilabel`) have float32 labels ``(N, num_classes)``.
    """
    if _is_folder(name):
        return load_image_folder(_folder_path(name), train=train, image_size=image_size).to(device)
    if name.startswith(SEGFOLDER_PREFIX):
        path = _folder_path(name, SEGFOLDER_PREFIX)
        return load_segmentation_folder(path, train=train, image_size=image_size).to(device)
    key = _canonical(name)
    info = _INFO[key]
    _check_fixed_size(info, image_size)
    if key in ("smallnorb", "viewpoints"):
        raw = SmallNORB(root, train=train, download=download).raw() if key == "smallnorb" else _viewpoints(root, train)
        return norb_protocol(raw, train, name=key).to(device)
    if key == "multimnist":
        return load_multimnist(root, train=train, download=download).to(device)
    if key == "digits":
        images, labels = load_digits_split(train)
    else:
        split = _FILE_CLASSES[key](root, train=train, download=download)
        images = split.images if split.images.dim() == 4 else split.images.unsqueeze(1)
        images, labels = images.float().div_(255.0), split.labels
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
