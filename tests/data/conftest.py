"""Fixtures for the data tests: an idx writer independent of the library, and fake data roots."""
from __future__ import annotations

import gzip
import hashlib
import os
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
