"""Fixtures for the data tests: an idx writer independent of the library, and fake data roots."""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}


def idx_bytes(array: np.ndarray) -> bytes:
    """The idx encoding of ``array``, written from the format description (big-endian everything)."""
    header = bytes([0, 0, _CODES[array.dtype.type], array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx_file(path: Path, array: np.ndarray, compress: bool | None = None) -> Path:
    data = idx_bytes(array)
    compress = path.suffix == ".gz" if compress is None else compress
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def fake_split(folder: Path, prefix: str, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    write_idx_file(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
    write_idx_file(folder / f"{prefix}-labels-idx1-ubyte.gz", (np.arange(n) % 10).astype(np.uint8))


@pytest.fixture
def write_idx():
    return write_idx_file


@pytest.fixture
def fake_mnist_root(tmp_path, monkeypatch):
    """A data root with small fake MNIST files (50 train / 20 test) and MNIST's md5s patched to match."""
    from capsnets.data import MNIST

    folder = tmp_path / "root" / "mnist"
    folder.mkdir(parents=True)
    fake_split(folder, "train", 50, 0)
    fake_split(folder, "t10k", 20, 1)
    md5s = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    monkeypatch.setattr(MNIST, "md5s", md5s)
    return folder.parent


# --- NORB binary matrix format (smallNORB), written from the NYU page's description -------------------
_NORB_MAGIC = {
    np.uint8: 0x1E3D4C55,
    np.int32: 0x1E3D4C54,
    np.float32: 0x1E3D4C51,
    np.float64: 0x1E3D4C53,
    np.int16: 0x1E3D4C56,
}


def norb_bytes(array: np.ndarray, magic: int | None = None) -> bytes:
    """Little-endian magic, int32 ndim, max(3, ndim) int32 dims (padding with 1), then the data."""
    dims = list(array.shape) + [1] * (3 - array.ndim)
    magic = _NORB_MAGIC[array.dtype.type] if magic is None else magic
    header = struct.pack("<Ii", magic, array.ndim) + struct.pack(f"<{len(dims)}i", *dims)
    return header + array.astype(array.dtype.newbyteorder("<")).tobytes()


def write_norb_file(path: Path, array: np.ndarray, compress: bool | None = None) -> Path:
    data = norb_bytes(array)
    compress = path.suffix == ".gz" if compress is None else compress
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def fake_norb_split(folder: Path, prefix: str, n: int, seed: int, compress: bool = True) -> dict[str, np.ndarray]:
    """Write ``n`` random stereo pairs with labels and info; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {
        "dat": rng.integers(0, 256, (n, 2, 96, 96), dtype=np.uint8),
        "cat": (np.arange(n) % 5).astype(np.int32),
        "info": np.stack(
            [rng.integers(0, 10, n), rng.integers(0, 9, n), 2 * rng.integers(0, 18, n), rng.integers(0, 6, n)], axis=1
        ).astype(np.int32),
    }
    suffix = ".mat.gz" if compress else ".mat"
    for part, array in arrays.items():
        write_norb_file(folder / f"{prefix}-{part}{suffix}", array)
    return arrays


@pytest.fixture
def write_norb():
    return write_norb_file


@pytest.fixture
def fake_smallnorb_root(tmp_path, monkeypatch):
    """A data root with fake smallNORB files (12 train / 8 test pairs) and md5s patched to match.

    Returns ``(root, {"train": arrays, "test": arrays})``.
    """
    from capsnets.data import SmallNORB

    folder = tmp_path / "root" / "smallnorb"
    folder.mkdir(parents=True)
    arrays = {
        "train": fake_norb_split(folder, "smallnorb-5x46789x9x18x6x2x96x96-training", 12, 0),
        "test": fake_norb_split(folder, "smallnorb-5x01235x9x18x6x2x96x96-testing", 8, 1),
    }
    md5s = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    monkeypatch.setattr(SmallNORB, "md5s", md5s)
    return folder.parent, arrays
