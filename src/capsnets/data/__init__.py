"""Data sets and device-side batching.

- :func:`load_dataset` ``("digits" | "mnist" | "fashion_mnist" | "multimnist" | "smallnorb" | "viewpoints" |
  "cifar10" | "svhn" | "folder:PATH")`` -> :class:`TensorData`
- :class:`MNIST`, :class:`FashionMNIST`: torchvision-style idx.gz readers with md5 checks and download
- :class:`CIFAR10` (the binary-version tarball, nothing unpickled), :class:`SVHN` (format-2 .mat files)
- :func:`load_image_folder`, :func:`scan_image_folder`, :func:`read_image`: your own images (PNG, JPEG, GIF, BMP,
  TIFF, WebP), one subfolder per class, or ``images/`` and a ``labels.csv`` for several labels per image
  (``"folder:PATH"``)
- :func:`load_segmentation_folder`, :func:`scan_segmentation_folder`: your own images and their masks
  (``"segfolder:PATH"``) -> :class:`SegmentationData`
- :class:`SmallNORB`: the NORB-format reader (:func:`read_norb_matrix`) with md5 checks and download
- :class:`RawNorbLike`, :func:`norb_protocol`: smallNORB-like raw splits and the 48 -> 32 crop protocol
- :class:`DeviceLoader`, :func:`random_shift`: batching and CapsNet's shift augmentation on the device
  (:func:`shift_pairs`: the transforming auto-encoder's training pairs);
  :mod:`capsnets.data.transforms`: batched resize / crops / brightness-contrast (:class:`NorbAugment`), the digit
  augmentation of Efficient-CapsNet's code (:class:`DigitAugment`)
"""

from .base import DATA_ENV_VAR, TensorData, data_root
from .cifar import CIFAR10
from .device import DeviceLoader, random_shift, shift_pairs
from .digits import load_digits_split
from .errors import DatasetError
from .idx import check_md5, md5sum, read_idx
from .image_folder import load_image_folder, read_image, scan_image_folder
from .mnist import MNIST, FashionMNIST
from .norb_common import RawNorbLike, norb_protocol
from .norb_format import read_norb_matrix
from .registry import DatasetInfo, dataset_info, list_datasets, load_dataset
from .seg_folder import load_segmentation_folder, scan_segmentation_folder
from .segmentation import SegmentationData
from .smallnorb import SmallNORB
from .svhn import SVHN
from .transforms import (
    AUGMENTATIONS,
    DigitAugment,
    NorbAugment,
    brightness_contrast,
    center_crop,
    random_crop,
    resize,
    standardize,
)

__all__ = [
    "DATA_ENV_VAR",
    "TensorData",
    "data_root",
    "DeviceLoader",
    "random_shift",
    "shift_pairs",
    "load_digits_split",
    "DatasetError",
    "check_md5",
    "md5sum",
    "read_idx",
    "MNIST",
    "FashionMNIST",
    "CIFAR10",
    "SVHN",
    "load_image_folder",
    "scan_image_folder",
    "read_image",
    "load_segmentation_folder",
    "scan_segmentation_folder",
    "SegmentationData",
    "DatasetInfo",
    "dataset_info",
    "list_datasets",
    "load_dataset",
    "SmallNORB",
    "read_norb_matrix",
    "RawNorbLike",
    "norb_protocol",
    "AUGMENTATIONS",
    "DigitAugment",
    "NorbAugment",
    "resize",
    "standardize",
    "random_crop",
    "center_crop",
    "brightness_contrast",
]
