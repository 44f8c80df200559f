"""CIFAR-10 from its official binary tarball, torchvision-style (nothing is unpickled).

Source: Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny Images",
https://www.cs.toronto.edu/~kriz/cifar.html. 10 classes of 32x32 colour photographs, 50,000 train /
10,000 test. This reader takes the page's *binary version*, ``cifar-10-binary.tar.gz`` (md5
``c32a1d4ab5d03f1284b67883e8d87530``, as published on that page), not the python version that
torchvision's ``CIFAR10`` reads: that one holds pickles, and this library never unpickles.

The tarball lives in ``<root>/cifar-10/`` and is read in place (its members are never extracted to
disk): ``cifar-10-batches-bin/data_batch_1.bin`` .. ``data_batch_5.bin`` (train),
``test_batch.bin`` (test), each a run of 3,073-byte records (1 label byte, then 1,024 red, 1,024 green
and 1,024 blue bytes, each plane row-major), and ``batches.meta.txt`` (the class names, one a line).
"""

from __future__ import annotations

import os
import tarfile

import numpy as np
import torch
from torch import Tensor

from .base import DATA_ENV_VAR, data_root
from .download import ensure_file
from .errors import DOWNLOAD_HINT, FIX_HINT, DatasetError
from .idx import check_md5

__all__ = ["CIFAR10", "read_cifar_records"]

#: Bytes per record of the binary version: 1 label byte + 3 x 32 x 32 pixel bytes.
RECORD_BYTES = 1 + 3 * 32 * 32


def read_cifar_records(data: bytes, source: str, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Decode CIFAR binary-version records.

    Args:
        data: the bytes of one ``*.bin`` batch file (any number of whole records).
        source: the file's name, for error messages.
        num_classes: labels must lie in ``[0, num_classes)``.

    Returns:
        ``images``: ``(N, 3, 32, 32)`` uint8 (RGB); ``labels``: ``(N,)`` uint8.

    Raises:
        DatasetError: the length is not a whole number of records, or a label is out of range.
    """
    if len(data) == 0 or len(data) % RECORD_BYTES:
        raise DatasetError(
            f"{source}: {len(data)} bytes is not a whole number of {RECORD_BYTES}-byte CIFAR records "
            "(1 label byte + 3072 pixel bytes); " + FIX_HINT
        )
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    labels = records[:, 0].copy()
    if labels.max() >= num_classes:
        raise DatasetError(f"{source}: label {labels.max()} out of range for {num_classes} classes; " + FIX_HINT)
    return records[:, 1:].reshape(-1, 3, 32, 32).copy(), labels


class CIFAR10:
    """One split of CIFAR-10 (Krizhevsky 2009) from the binary-version tarball.

    Args:
        root: data root holding ``cifar-10/cifar-10-binary.tar.gz``; ``None`` means
            :func:`~capsnets.data.data_root`.
        train: the 50,000-image training split (``data_batch_1..5.bin``) if True, else the 10,000-image
            test split (``test_batch.bin``).
        download: fetch the tarball if it is missing or fails its md5 (atomic, md5-checked).

    Attributes:
        images: ``(N, 3, 32, 32)`` uint8 tensor, RGB.
        labels: ``(N,)`` int64 tensor.
        classes: class names, index = label (checked against ``batches.meta.txt``).

    Raises:
        DatasetError: the tarball is missing, fails its md5, lacks a member, or holds malformed records.

    Example::

        >>> test = CIFAR10("~/data", train=False, download=True)   # ~/data/cifar-10/cifar-10-binary.tar.gz
        >>> test.images.shape
        torch.Size([10000, 3, 32, 32])
    """

    name = "CIFAR-10"
    folder = "cifar-10"
    archive = "cifar-10-binary.tar.gz"
    md5 = "c32a1d4ab5d03f1284b67883e8d87530"
    mirrors = ["https://www.cs.toronto.edu/~kriz/"]
    members = {
        True: [f"cifar-10-batches-bin/data_batch_{i}.bin" for i in range(1, 6)],
        False: ["cifar-10-batches-bin/test_batch.bin"],
    }
    meta_member = "cifar-10-batches-bin/batches.meta.txt"
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True, download: bool = False):
        self.root = data_root(root)
        self.train = train
        self.directory = self.root / self.folder
        self.path = self.directory / self.archive
        if download:
            self.download()
        if not self.path.is_file():
            raise DatasetError(
                f"{self.name}: missing {self.archive} in {self.directory} (data root {self.root}). Fix: pass "
                f"--data-dir DIR (or set {DATA_ENV_VAR}=DIR) where DIR/{self.folder}/ holds the binary-version "
                f"tarball, or {DOWNLOAD_HINT} (CIFAR10(..., download=True)) to fetch it from "
                f"{self.mirrors[0]}{self.archive}."
            )
        check_md5(self.path, self.md5)
        self.images, self.labels = self._load()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.images[index], int(self.labels[index])

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"{type(self).__name__}(split={split}, size={len(self)}, path={self.path})"

    def download(self) -> None:
        """Fetch the tarball (both splits) if it is missing or fails its md5."""
        ensure_file(self.archive, self.directory, self.mirrors, self.md5)

    def _load(self) -> tuple[Tensor, Tensor]:
        wanted = [*self.members[self.train], self.meta_member]
        found: dict[str, bytes] = {}
        try:
            with tarfile.open(self.path, "r:gz") as tar:
                for member in tar:
                    if member.name in wanted and member.isfile():
                        found[member.name] = tar.extractfile(member).read()
        except (tarfile.TarError, OSError, EOFError) as err:
            raise DatasetError(f"{self.path}: not a readable .tar.gz ({err}); " + FIX_HINT) from err
        missing = [name for name in wanted if name not in found]
        if missing:
            raise DatasetError(
                f"{self.path}: the tarball lacks {', '.join(missing)}; is it the binary version "
                f"({self.archive})? " + FIX_HINT
            )
        meta = [line.strip() for line in found[self.meta_member].decode("ascii", "replace").splitlines()]
        if [name for name in meta if name] != self.classes:
            raise DatasetError(
                f"{self.path}: {self.meta_member} names the classes {[n for n in meta if n]}, "
                f"expected {self.classes}; " + FIX_HINT
            )
        parts = [
            read_cifar_records(found[name], f"{self.path}:{name}", len(self.classes))
            for name in self.members[self.train]
        ]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
        return torch.from_numpy(images), torch.from_numpy(labels).long()
