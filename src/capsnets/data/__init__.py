"""Data sets and device-side batching.

- :func:`load_dataset` ``("digits" | "mnist" | "fashion_mnist")`` -> :class:`TensorData`
- :class:`MNIST`, :class:`FashionMNIST`: torchvision-style idx.gz readers with md5 checks and download
- :class:`DeviceLoader`, :func:`random_shift`: batching and CapsNet's shift augmentation on the device
"""
from .base import DATA_ENV_VAR, TensorData, data_root
from .device import DeviceLoader, random_shift
from .digits import load_digits_split
from .errors import DatasetError
from .idx import check_md5, md5sum, read_idx
from .mnist import MNIST, FashionMNIST
from .registry import DatasetInfo, dataset_info, list_datasets, load_dataset

__all__ = [
    "DATA_ENV_VAR", "TensorData", "data_root", "DeviceLoader", "random_shift", "load_digits_split",
    "DatasetError", "check_md5", "md5sum", "read_idx", "MNIST", "FashionMNIST",
    "DatasetInfo", "dataset_info", "list_datasets", "load_dataset",
]
