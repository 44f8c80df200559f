"""The one exception type the data package raises for bad or missing files."""

from __future__ import annotations


class DatasetError(ValueError):
    """A data file is missing, corrupt or not what was expected.

    Messages name the file, say what was expected and what was found, and how to fix it
    (point ``--data-dir`` / ``CAPSNETS_DATA`` at the right folder, or re-download with ``--download``).
    """


#: The words of every data set message that tell the user to download: a command without ``--download`` (the
#: experiments) replaces them with what it offers instead.
DOWNLOAD_HINT = "rerun with --download"
FIX_HINT = f"delete it and {DOWNLOAD_HINT}, or check --data-dir / the CAPSNETS_DATA variable"
