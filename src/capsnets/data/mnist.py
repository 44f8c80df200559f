"""MNIST and Fashion-MNIST from their official idx.gz files, torchvision-style.

Sources: MNIST, LeCun et al. 1998, http://yann.lecun.com/exdb/mnist/ (mirrors as torchvision uses);
Fashion-MNIST, Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747, https://github.com/zalandoresearch/fashion-mnist.
Files live in ``<root>/mnist/`` and ``<root>/fashion-mnist/`` under their official names and are
checked against the official md5s every time they are loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from .base import DATA_ENV_VAR, data_root
from .download import ensure_file
from .errors import DOWNLOAD_HINT, FIX_HINT, DatasetError
from .idx import check_md5, read_idx

__all__ = ["MNIST", "FashionMNIST"]


class IdxImageDataset:
    """Base class: a split of an idx-format image classification data set.

    Args:
        root: data root holding ``<folder>/``; ``None`` means :func:`~capsnets.data.data_root`.
        train: the 60,000-example training split if True, else the 10,000-example test split.
        download: fetch files that are missing or fail their md5 from the official mirrors.

    Attributes:
        images: ``(N, 28, 28)`` uint8 tensor.
        labels: ``(N,)`` int64 tensor.
        classes: class names, index = label.
    """

    name = ""
    folder = ""
    mirrors: list[str] = []
    classes: list[str] = []
    #: split -> (images file, labels file)
    files = {
        True: ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
        False: ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
    }
    #: file name -> official md5
    md5s: dict[str, str] = {}
    image_size = (28, 28)

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True, download: bool = False):
        self.root = data_root(root)
        self.train = train
        self.directory = self.root / self.folder
        if download:
            self.download()
        self._check_present()
        images_file, labels_file = (self.directory / f for f in self.files[train])
        for path in (images_file, labels_file):
            check_md5(path, self.md5s[path.name])
        self.images, self.labels = self._load(images_file, labels_file)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.images[index], int(self.labels[index])

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"{type(self).__name__}(split={split}, size={len(self)}, directory={self.directory})"

    def _check_present(self) -> None:
        missing = [f for f in self.files[self.train] if not (self.directory / f).is_file()]
        if missing:
            raise DatasetError(
                f"{self.name}: missing {', '.join(missing)} in {self.directory} (data root {self.root}). "
                f"Fix: pass --data-dir DIR (or set {DATA_ENV_VAR}=DIR) where DIR/{self.folder}/ holds the "
                f"idx.gz files, or {DOWNLOAD_HINT} (MNIST(..., download=True)) to fetch them."
            )

    def download(self) -> None:
        """Fetch every file of both splits that is missing or fails its md5 (atomic, md5-checked)."""
        for names in self.files.values():
            for filename in names:
                ensure_file(filename, self.directory, self.mirrors, self.md5s[filename])

    def _load(self, images_file: Path, labels_file: Path) -> tuple[Tensor, Tensor]:
        images, labels = read_idx(images_file), read_idx(labels_file)
        if images.ndim != 3 or images.shape[1:] != self.image_size or images.dtype.name != "uint8":
            raise DatasetError(
                f"{images_file}: expected uint8 images of shape (N, {self.image_size[0]}, {self.image_size[1]}), "
                f"found {images.dtype} {images.shape}; " + FIX_HINT
            )
        if labels.ndim != 1 or labels.dtype.name != "uint8":
            raise DatasetError(
                f"{labels_file}: expected uint8 labels (N,), found {labels.dtype} {labels.shape}; " + FIX_HINT
            )
        if len(images) != len(labels):
            raise DatasetError(
                f"{images_file} has {len(images)} images but {labels_file} has {len(labels)} labels; " + FIX_HINT
            )
        if len(labels) and labels.max() >= len(self.classes):
            raise DatasetError(
                f"{labels_file}: label {labels.max()} out of range for {len(self.classes)} classes; " + FIX_HINT
            )
        return torch.from_numpy(images), torch.from_numpy(labels).long()


class MNIST(IdxImageDataset):
    """MNIST handwritten digits (LeCun et al. 1998): 60,000 train / 10,000 test, 28x28 grey."""

    name = "MNIST"
    folder = "mnist"
    mirrors = [
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
    ]
    classes = [str(d) for d in range(10)]
    md5s = {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }


class FashionMNIST(IdxImageDataset):
    """Fashion-MNIST (Xiao et al. 2017): Zalando clothing, same layout and sizes as MNIST."""

    name = "Fashion-MNIST"
    folder = "fashion-mnist"
    mirrors = ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"]
    classes = [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ]
    md5s = {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    }
