"""Data sets and device-side batching.

- :func:`load_dataset` ``("digits" | "mnist" | "fashion_mnist" | "smallnorb" | "viewpoints")`` -> :class:`TensorData`
- :class:`MNIST`, :class:`FashionMNIST`: torchvision-style idx.gz readers with md5 checks and download
- :class:`SmallNORB`: the NORB-format reader (:func:`read_norb_matrix`) with md5 checks and download
- :class:`RawNorbLike`, :func:`norb_protocol`: smallNORB-like raw splits and the 48 -> 32 crop protocol
- :class:`DeviceLoader`, :func:`random_shift`: batching and CapsNet's shift augmentation on the device
  (:func:`shift_pairs`: the transforming auto-encoder's training pairs);
  :mod:`capsnets.data.transforms`: batched resize / crops / brightness-contrast (:class:`NorbAugment`)
"""
from .base import DATA_ENV_VAR, TensorData, data_root
from .device import DeviceLoader, random_shift, shift_pairs
from .digits import load_digits_split
from .errors import DatasetError
from .idx import check_md5, md5sum, read_idx
from .mnist import MNIST, FashionMNIST
from .norb_common import RawNorbLike, norb_protocol
from .norb_format import read_norb_matrix
from .registry import DatasetInfo, dataset_info, list_datasets, load_dataset
from .smallnorb import SmallNORB
from .transforms import NorbAugment, brightness_contrast, center_crop, random_crop, resize, standardize

__all__ = [
    "DATA_ENV_VAR", "TensorData", "data_root", "DeviceLoader", "random_shift", "shift_pairs",
    "load_digits_split",
    "DatasetError", "check_md5", "md5sum", "read_idx", "MNIST", "FashionMNIST",
    "DatasetInfo", "dataset_info", "list_datasets", "load_dataset",
    "SmallNORB", "read_norb_matrix", "RawNorbLike", "norb_protocol",
    "NorbAugment", "resize", "standardize", "random_crop", "center_crop", "brightness_contrast",
]
