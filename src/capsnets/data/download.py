"""Atomic, checksummed download of one file from a list of mirrors (standard library only)."""

from __future__ import annotations

import logging
import os
import urllib.request
from pathlib import Path

from capsnets.files import temp_beside

from .errors import DatasetError
from .idx import check_md5, md5sum

__all__ = ["MAX_DATA_FILE_BYTES", "download_file"]

#: The largest file a data set download may bring (the largest known, smallNORB's compressed training images, takes
#: a few hundred MB): a mirror that sends more is cut off there, and the next mirror is tried.
MAX_DATA_FILE_BYTES = 1 << 30

_log = logging.getLogger(__name__)


def download_file(filename: str, folder: Path, mirrors: list[str], md5: str, timeout: float = 60.0) -> Path:
    """Fetch ``filename`` into ``folder`` from the first mirror that serves a file with ``md5``.

    Each attempt writes to a temporary file in ``folder`` and only ``os.replace``-s it into place
    once its md5 matches, so an interrupted or corrupt download never leaves a partial file.

    Args:
        filename: the file name appended to each mirror URL.
        folder: destination folder (created if needed).
        mirrors: base URLs ending in ``/``, tried in order (``file://`` URLs work too).
        md5: expected hex digest.
        timeout: seconds per connection attempt.

    Raises:
        DatasetError: every mirror failed; the message lists each URL and its error.
    """
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / filename
    errors = []
    for mirror in mirrors:
        url = mirror + filename
        tmp_name = temp_beside(target, suffix=".part")
        try:
            _log.info("downloading %s to %s", url, target)
            with open(tmp_name, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
                _copy_bounded(response, out, MAX_DATA_FILE_BYTES)
            actual = md5sum(tmp_name)
            if actual == md5.lower():
                os.replace(tmp_name, target)
                return target
            errors.append(f"  {url}: md5 mismatch: expected {md5.lower()}, found {actual}")
        except OSError as err:  # URLError and timeouts are OSErrors
            errors.append(f"  {url}: {err}")
        finally:
            if os.path.exists(tmp_name):
                os.remove(tmp_name)
    raise DatasetError(
        f"could not download {filename} into {folder}; tried:\n" + "\n".join(errors) + "\n"
        "If this machine is offline, copy the file there by hand, or point --data-dir / CAPSNETS_DATA "
        "at a folder that already has it."
    )


def _copy_bounded(source, out, limit: int) -> None:
    """Copy ``source`` into ``out``, raising ``OSError`` once more than ``limit`` bytes have come."""
    copied = 0
    while chunk := source.read(1 << 20):
        copied += len(chunk)
        if copied > limit:
            raise OSError(f"the server sent more than {limit:,} bytes, more than any data set file takes")
        out.write(chunk)


def ensure_file(filename: str, folder: Path, mirrors: list[str], md5: str) -> Path:
    """Keep ``folder/filename`` if it passes its md5, else download it (a corrupt copy is replaced
    only once a good one has arrived)."""
    path = Path(folder) / filename
    try:
        if path.is_file():
            check_md5(path, md5)
            return path
    except DatasetError:
        pass
    return download_file(filename, Path(folder), mirrors, md5)
