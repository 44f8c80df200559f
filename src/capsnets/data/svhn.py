"""SVHN (Street View House Numbers) from its official format-2 ``.mat`` files, torchvision-style.

Source: Netzer et al. 2011, "Reading Digits in Natural Images with Unsupervised Feature Learning",
http://ufldl.stanford.edu/housenumbers/. Format 2: cropped 32x32 colour digits, 73,257 train /
26,032 test (the 531,131-image ``extra`` set is not read). Files in ``<root>/svhn/``:
``train_32x32.mat`` (md5 ``e26dedcc434d2e4c54c9b2d4a06d8373``) and ``test_32x32.mat``
(md5 ``eb5a983be6a315427106f1b164d9cef3``); the URLs and md5s are those of torchvision's
``torchvision/datasets/svhn.py``.

Each file is a MATLAB v5 file read with ``scipy.io.loadmat`` (which parses the format; nothing is
unpickled): ``X`` is uint8 ``(32, 32, 3, N)`` (row, column, RGB, image) and ``y`` is ``(N, 1)`` with
labels 1..10, where 10 is the digit 0. Labels here are the digits themselves, 0..9.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import Tensor

from .base import DATA_ENV_VAR, data_root
from .download import ensure_file
from .errors import DOWNLOAD_HINT, FIX_HINT, DatasetError
from .idx import check_md5

__all__ = ["SVHN", "read_svhn_mat"]


def read_svhn_mat(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read one SVHN format-2 ``.mat`` file.

    Returns:
        ``images``: ``(N, 3, 32, 32)`` uint8 (RGB); ``labels``: ``(N,)`` int64 digits 0..9 (the file's
        label 10 becomes 0).

    Raises:
        DatasetError: the file is not a MATLAB v5 file, or ``X`` / ``y`` are missing or malformed.
    """
    # slow to import, and only SVHN's .mat files need it
    import scipy.io  # noqa: PLC0415

    try:
        mat = scipy.io.loadmat(path, variable_names=["X", "y"])
    except (ValueError, TypeError, OSError, NotImplementedError, IndexError, KeyError, EOFError) as err:
        # what scipy raises for files it cannot parse (its MatReadError is a ValueError)
        raise DatasetError(f"{path}: not a readable MATLAB v5 .mat file ({err}); " + FIX_HINT) from err
    if "X" not in mat or "y" not in mat:
        raise DatasetError(
            f"{path}: expected variables X and y, found {sorted(k for k in mat if not k.startswith('__'))}; " + FIX_HINT
        )
    images, labels = mat["X"], mat["y"]
    if images.ndim != 4 or images.shape[:3] != (32, 32, 3) or images.dtype != np.uint8:
        raise DatasetError(
            f"{path}: expected X to be uint8 (32, 32, 3, N), found {images.dtype} {images.shape}; " + FIX_HINT
        )
    if labels.ndim != 2 or labels.shape != (images.shape[3], 1):
        raise DatasetError(
            f"{path}: expected y to be ({images.shape[3]}, 1) for {images.shape[3]} images, "
            f"found {labels.shape}; " + FIX_HINT
        )
    labels = labels[:, 0].astype(np.int64)
    if len(labels) and (labels.min() < 1 or labels.max() > 10):
        raise DatasetError(
            f"{path}: labels must be 1..10 (10 is the digit 0), found {labels.min()}..{labels.max()}; " + FIX_HINT
        )
    return np.ascontiguousarray(images.transpose(3, 2, 0, 1)), labels % 10


class SVHN:
    """One split of SVHN format 2 (Netzer et al. 2011): cropped 32x32 house-number digits.

    Args:
        root: data root holding ``svhn/``; ``None`` means :func:`~capsnets.data.data_root`.
        train: the 73,257-image ``train_32x32.mat`` if True, else the 26,032-image ``test_32x32.mat``.
        download: fetch files that are missing or fail their md5 (both splits; atomic, md5-checked).

    Attributes:
        images: ``(N, 3, 32, 32)`` uint8 tensor, RGB.
        labels: ``(N,)`` int64 tensor, the digit 0..9.
        classes: ``["0", ..., "9"]``.

    Raises:
        DatasetError: the file is missing, fails its md5 or is malformed.

    Example::

        >>> test = SVHN("~/data", train=False, download=True)   # ~/data/svhn/test_32x32.mat
        >>> test.images.shape
        torch.Size([26032, 3, 32, 32])
    """

    name = "SVHN"
    folder = "svhn"
    mirrors = ["http://ufldl.stanford.edu/housenumbers/"]
    files = {True: "train_32x32.mat", False: "test_32x32.mat"}
    md5s = {"train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373", "test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3"}
    classes = [str(d) for d in range(10)]

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True, download: bool = False):
        self.root = data_root(root)
        self.train = train
        self.directory = self.root / self.folder
        self.path = self.directory / self.files[train]
        if download:
            self.download()
        if not self.path.is_file():
            raise DatasetError(
                f"{self.name}: missing {self.path.name} in {self.directory} (data root {self.root}). Fix: pass "
                f"--data-dir DIR (or set {DATA_ENV_VAR}=DIR) where DIR/{self.folder}/ holds the format-2 .mat "
                f"files, or {DOWNLOAD_HINT} (SVHN(..., download=True)) to fetch them from {self.mirrors[0]}."
            )
        check_md5(self.path, self.md5s[self.path.name])
        images, labels = read_svhn_mat(self.path)
        self.images, self.labels = torch.from_numpy(images), torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.images[index], int(self.labels[index])

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"{type(self).__name__}(split={split}, size={len(self)}, path={self.path})"

    def download(self) -> None:
        """Fetch both splits' files that are missing or fail their md5."""
        for filename in self.files.values():
            ensure_file(filename, self.directory, self.mirrors, self.md5s[filename])
