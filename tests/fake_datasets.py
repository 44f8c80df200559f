"""CIFAR-10 and SVHN files fabricated in their real formats, for tests that read them without the internet
(importable as ``fake_datasets``: pyproject.toml puts ``tests/`` on the path).

- CIFAR-10's binary version (https://www.cs.toronto.edu/~kriz/cifar.html): a ``cifar-10-binary.tar.gz`` holding
  ``cifar-10-batches-bin/`` with ``batches.meta.txt`` and ``*.bin`` runs of 3,073-byte records (1 label byte,
  then the red, green and blue 32x32 planes).
- SVHN format 2 (http://ufldl.stanford.edu/housenumbers/): MATLAB v5 files with ``X`` uint8 ``(32, 32, 3, N)``
  and ``y`` ``(N, 1)`` in 1..10, 10 being the digit 0.

The real files' md5s do not match these: tests patch ``CIFAR10.md5`` / ``SVHN.md5s`` with :func:`md5_of`.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import numpy as np
import scipy.io

CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def md5_of(path: Path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def cifar_records(images: np.ndarray, labels: np.ndarray) -> bytes:
    """The binary version's records, written from the format description on the CIFAR page."""
    return b"".join(bytes([label]) + image.tobytes() for image, label in zip(images, labels))


def write_cifar_tarball(
    path: Path,
    splits: dict[str, tuple[np.ndarray, np.ndarray]],
    meta: str = "\n".join(CIFAR_CLASSES) + "\n\n",
    extra: bytes = b"",
) -> Path:
    """The tarball's layout: cifar-10-batches-bin/{batches.meta.txt, readme.html, *.bin}; ``extra`` is
    appended to test_batch.bin."""
    members = {
        "batches.meta.txt": meta.encode(),
        "readme.html": b"<html></html>",
        **{f"{name}.bin": cifar_records(*arrays) for name, arrays in splits.items()},
    }
    if "test_batch.bin" in members:
        members["test_batch.bin"] += extra
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def fake_cifar_splits(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Random images of labels 0, 1, ... 9, 0, ...: 4+5+6+7+8 = 30 train (data_batch_1..5), 7 test."""
    rng = np.random.default_rng(seed)
    sizes = {**{f"data_batch_{i}": 3 + i for i in range(1, 6)}, "test_batch": 7}
    return {
        name: (rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8), (np.arange(n) % 10).astype(np.uint8))
        for name, n in sizes.items()
    }


def write_svhn_mat(path: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """X: uint8 (32, 32, 3, n); y: uint8 (n, 1) in 1..10 (10 is the digit 0), as the official files."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    labels = (np.arange(n) % 10 + 1).astype(np.uint8).reshape(n, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(path, {"X": images, "y": labels}, format="5")
    return images, labels
