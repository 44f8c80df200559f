"""Reader for the NORB binary matrix format (``.mat`` files of smallNORB), plain or gzip-compressed.

Format (LeCun, Huang & Bottou 2004, https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/, "file format"):
all little-endian; a 4-byte magic number naming the element type, an int32 ``ndim``, then
``max(3, ndim)`` int32 dimension sizes (a matrix of fewer than 3 dimensions still stores 3 size
fields; the unused ones are ignored), then the values in C order. These are not MATLAB files despite
the ``.mat`` suffix. Every way a file can disagree with this raises
:class:`~capsnets.data.errors.DatasetError` naming the file.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from .errors import FIX_HINT, DatasetError
from .idx import _read_bytes

__all__ = ["read_norb_matrix", "NORB_DTYPES", "NORB_MAGIC"]

#: magic number -> little-endian numpy dtype (0x1E3D4C52, the "packed" matrix, is not supported).
NORB_DTYPES = {
    0x1E3D4C51: np.dtype("<f4"),  # single
    0x1E3D4C53: np.dtype("<f8"),  # double
    0x1E3D4C54: np.dtype("<i4"),  # integer
    0x1E3D4C55: np.dtype("<u1"),  # byte
    0x1E3D4C56: np.dtype("<i2"),  # short
}
#: numpy dtype name -> magic number (the inverse of :data:`NORB_DTYPES`).
NORB_MAGIC = {dtype.name: magic for magic, dtype in NORB_DTYPES.items()}
_MAX_NDIM = 64


def _header(path: Path, data: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """Element type, dims and header length of a NORB matrix held in ``data``."""
    if len(data) < 8:
        raise DatasetError(f"{path}: truncated NORB header: expected at least 8 bytes, found {len(data)}; " + FIX_HINT)
    magic, ndim = struct.unpack("<Ii", data[:8])
    if magic not in NORB_DTYPES:
        known = ", ".join(f"0x{m:08X} ({d.name})" for m, d in NORB_DTYPES.items())
        raise DatasetError(
            f"{path}: wrong NORB magic number: expected one of {known}, found 0x{magic:08X}; "
            "not a NORB matrix file (or still compressed by something other than gzip)? " + FIX_HINT
        )
    if not 0 <= ndim <= _MAX_NDIM:
        raise DatasetError(f"{path}: bad NORB rank: expected 0..{_MAX_NDIM}, found {ndim}; " + FIX_HINT)
    stored = max(3, ndim)
    header = 8 + 4 * stored
    if len(data) < header:
        raise DatasetError(
            f"{path}: truncated NORB header: rank {ndim} stores {stored} dims and needs {header} bytes, "
            f"found {len(data)}; " + FIX_HINT
        )
    dims = struct.unpack(f"<{stored}i", data[8:header])[:ndim]
    if any(d < 0 for d in dims):
        raise DatasetError(f"{path}: negative dimension in NORB header {dims}; " + FIX_HINT)
    return NORB_DTYPES[magic], dims, header


def read_norb_matrix(path: str | Path) -> np.ndarray:
    """Read a NORB binary matrix (``.mat`` or ``.mat.gz``) into a native-endian numpy array.

    Args:
        path: the file; compressed files are recognised by the gzip magic bytes, not by the name.

    Returns:
        An array of shape ``dims[:ndim]`` and the file's element type (uint8, int16, int32,
        float32 or float64).

    Raises:
        DatasetError: missing file, unknown magic, bad rank, truncated data, trailing bytes, corrupt gzip.

    Examples:
        >>> cat = read_norb_matrix("smallnorb/smallnorb-5x01235x9x18x6x2x96x96-testing-cat.mat.gz")  # doctest: +SKIP
        >>> cat.shape, cat.dtype  # doctest: +SKIP
        ((24300,), dtype('int32'))
    """
    path = Path(path)
    data = _read_bytes(path)
    dtype, dims, header = _header(path, data)
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    found = len(data) - header
    if found != expected:
        problem = "truncated file" if found < expected else f"{found - expected} trailing bytes"
        raise DatasetError(
            f"{path}: {problem}: {dtype.name} dims {dims} need {expected} data bytes, found {found}; " + FIX_HINT
        )
    array = np.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize, offset=header)
    return array.astype(dtype.newbyteorder("="), copy=True).reshape(dims)
