"""Reader for the idx format of MNIST and Fashion-MNIST, plain or gzip-compressed.

Format (LeCun, Cortes & Burges, http://yann.lecun.com/exdb/mnist/, section "FILE FORMATS"):
a 4-byte big-endian magic ``0x00 0x00 <dtype code> <rank>``, then ``rank`` big-endian int32
dimension sizes, then the values in C order, big-endian. Every way a file can disagree with this
raises :class:`~capsnets.data.errors.DatasetError` naming the file.
"""

from __future__ import annotations

import gzip
import hashlib
import struct
import zlib
from pathlib import Path

import numpy as np

from .errors import DOWNLOAD_HINT, FIX_HINT, DatasetError

__all__ = ["read_idx", "md5sum", "check_md5", "IDX_DTYPES"]

#: idx dtype code -> big-endian numpy dtype.
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    """Return the (decompressed) content of ``path``; gzip is detected by its magic bytes."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found; check --data-dir or " + DOWNLOAD_HINT) from None
    if raw[:2] != _GZIP_MAGIC:
        if path.suffix == ".gz":
            raise DatasetError(
                f"{path}: corrupt gzip file: expected gzip magic 1f8b, found {raw[:2].hex() or 'empty file'}; "
                + FIX_HINT
            )
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as err:
        raise DatasetError(f"{path}: corrupt gzip file ({err}); " + FIX_HINT) from err


def read_idx(path: str | Path) -> np.ndarray:
    """Read an idx (or idx.gz) file into a native-endian numpy array.

    Args:
        path: the file; compressed files are recognised by the gzip magic bytes, not by the name.

    Returns:
        An array whose shape is the file's dims and whose dtype is the file's (uint8, int8, int16,
        int32, float32 or float64), converted to native byte order.

    Raises:
        DatasetError: wrong magic, unknown dtype code, truncated data, trailing bytes, corrupt gzip.

    Examples:
        >>> images = read_idx("mnist/t10k-images-idx3-ubyte.gz")  # doctest: +SKIP
        >>> images.shape, images.dtype  # doctest: +SKIP
        ((10000, 28, 28), dtype('uint8'))
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise DatasetError(f"{path}: truncated idx header: expected at least 4 bytes, found {len(data)}; " + FIX_HINT)
    zeros, code, rank = data[:2], data[2], data[3]
    if zeros != b"\x00\x00":
        raise DatasetError(
            f"{path}: wrong idx magic number: expected 0x0000 followed by dtype and rank, "
            f"found 0x{data[:4].hex()}; not an idx file? " + FIX_HINT
        )
    if code not in IDX_DTYPES:
        known = ", ".join(f"0x{c:02X}" for c in IDX_DTYPES)
        raise DatasetError(f"{path}: unknown idx dtype code 0x{code:02X} (known: {known}); " + FIX_HINT)
    header = 4 + 4 * rank
    if len(data) < header:
        raise DatasetError(
            f"{path}: truncated idx header: rank {rank} needs {header} bytes, found {len(data)}; " + FIX_HINT
        )
    dims = struct.unpack(f">{rank}i", data[4:header])
    if any(d < 0 for d in dims):
        raise DatasetError(f"{path}: negative dimension in idx header {dims}; " + FIX_HINT)
    dtype = IDX_DTYPES[code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    found = len(data) - header
    if found < expected:
        raise DatasetError(
            f"{path}: truncated file: dims {dims} need {expected} data bytes, found {found}; " + FIX_HINT
        )
    if found > expected:
        raise DatasetError(
            f"{path}: {found - expected} trailing bytes: dims {dims} need {expected} data bytes, "
            f"found {found}; " + FIX_HINT
        )
    array = np.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize, offset=header)
    return array.astype(dtype.newbyteorder("="), copy=True).reshape(dims)


def md5sum(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex md5 digest of a file's bytes (as stored, i.e. of the .gz file itself)."""
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_md5(path: str | Path, expected: str) -> None:
    """Raise :class:`DatasetError` naming the file and both digests unless ``md5sum(path) == expected``."""
    actual = md5sum(path)
    if actual != expected.lower():
        raise DatasetError(
            f"{path}: md5 mismatch: expected {expected.lower()}, found {actual}; the file is corrupt, "
            "incomplete or a different release; " + FIX_HINT
        )
