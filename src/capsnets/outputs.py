"""The files capsnets writes for a user carry a mark, so that no output option replaces a file capsnets did not write.

Each kind of file holds its mark where its format keeps such things:

- JSON: a first key ``"capsnets"``, ``{"version": ..., "content": PURPOSE}`` (:func:`json_header`);
- PNG: a text chunk ``capsnets`` = PURPOSE (:func:`png_text`; Matplotlib's ``savefig(metadata=...)`` and
  Pillow's ``PngInfo`` write it);
- YAML: a first line ``# capsnets: PURPOSE`` (:func:`yaml_mark`; a comment);
- Markdown: a last line ``<!-- capsnets: PURPOSE -->`` (:func:`markdown_mark`; a comment, not rendered);
- ONNX: the model's metadata property ``capsnets`` = PURPOSE;
- a ``torch.export`` archive (``.pt2``): its extra file ``capsnets`` holding PURPOSE.

:func:`written_for` reads the mark back, from the first kilobyte of a JSON file, the last of a Markdown file and
the header of a PNG, so that recognising a file costs little whatever its size. :func:`check_output` is the one rule every command
applies before it writes: an existing file is replaced only when capsnets wrote it for the same purpose (a
prediction JSON by a prediction JSON), or when the user asked for it (``--overwrite``, ``overwrite=True``).
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

from capsnets._version import __version__
from capsnets.validation import ArgumentError

#: The key of the mark in every format.
MARK = "capsnets"
#: How much of the start of a JSON file, or the end of a Markdown file, is read to find its mark.
_HEAD_BYTES = 1024
#: Largest ONNX file whose metadata is read (``onnx.load`` reads the whole file); a larger one is not recognised.
_MAX_ONNX_BYTES = 2**31
_YAML = re.compile(r"# capsnets: ([A-Za-z0-9_ -]+)\r?\n")
_MARKDOWN = re.compile(r"^<!-- capsnets: ([A-Za-z0-9_ -]+) -->$")


class OutputExistsError(ArgumentError):
    """An output would replace an existing file that capsnets did not write for the same purpose."""


def json_header(purpose: str) -> dict[str, dict[str, str]]:
    """The mark of a JSON file written for ``purpose``; put it first: ``{**json_header("predictions"), ...}``."""
    return {MARK: {"version": __version__, "content": purpose}}


def png_text(purpose: str) -> dict[str, str]:
    """The text chunks of a PNG file written for ``purpose`` (Matplotlib's ``metadata``, Pillow's ``PngInfo``)."""
    return {MARK: purpose, "Software": f"capsnets {__version__}"}


def yaml_mark(purpose: str) -> str:
    """The first line of a YAML file written for ``purpose`` (a comment)."""
    return f"# capsnets: {purpose}"


def markdown_mark(purpose: str) -> str:
    """The last line of a Markdown file written for ``purpose`` (an HTML comment: not rendered)."""
    return f"<!-- capsnets: {purpose} -->"


def written_for(path: str | os.PathLike) -> str | None:
    """The purpose in the mark of the file ``path`` (``"predictions"``, ``"figure"``, ``"onnx"``...), or None
    where the file carries no mark (capsnets did not write it), cannot be read, or does not exist."""
    try:
        with open(path, "rb") as file:
            head = file.read(_HEAD_BYTES)
        if head.startswith(b"\x89PNG\r\n\x1a\n"):
            return _png_mark(path)
        if head.startswith(b"PK\x03\x04"):
            return _archive_mark(path)
        if head.lstrip().startswith(b"{"):
            return _json_mark(head)
        if head.startswith(b"# capsnets: "):
            found = _YAML.match(head.decode("utf-8", "replace"))
            return found.group(1) if found else None
        suffix = Path(path).suffix.lower()
        if suffix == ".md":
            return _markdown_mark(path)
        if suffix == ".onnx":
            return _onnx_mark(path)
    except (OSError, ValueError, zipfile.BadZipFile):
        return None
    return None


def check_output(
    path: str | os.PathLike,
    purpose: str,
    *,
    overwrite: bool = False,
    flag: str | None = None,
    how: str = "name another file",
) -> Path:
    """``Path(path)``, where writing a ``purpose`` file there replaces nothing capsnets did not write.

    Args:
        path: the file about to be written.
        purpose: what it will hold, as its mark names it (:func:`written_for`).
        overwrite: replace an existing file whatever it holds.
        flag: the command-line option that named ``path`` (for the message), or None for a Python call.
        how: the way to a file of another name, for the message.

    Raises:
        OutputExistsError: ``path`` exists, is not a folder, and capsnets did not write it for ``purpose``; the
            message names the file, what it holds, and how to go on. Nothing is written.
    """
    path = Path(path)
    if overwrite or not path.exists() or path.is_dir():  # a folder is the caller's error to report
        return path
    found = written_for(path)
    if found == purpose:
        return path
    held = f"a capsnets {found} file, not {_article(purpose)}" if found else "a file capsnets did not write"
    name = f"{flag} '{path}'" if flag else f"'{path}'"
    replace = "--overwrite" if flag else "overwrite=True"
    raise OutputExistsError(
        f"{name} already exists and is {held}, so it was left as it is; {how}, or pass {replace} to replace it",
        "overwrite",
    )


def _article(purpose: str) -> str:
    return f"an {purpose}" if purpose[:1] in "aeiou" else f"a {purpose}"


def _json_mark(head: bytes) -> str | None:
    """The purpose of a JSON text whose first key is the mark, read from its first bytes ``head`` alone."""
    found = re.match(rb'\s*\{\s*"capsnets"\s*:\s*', head)
    if found is None:
        return None
    value, _ = json.JSONDecoder().raw_decode(head[found.end() :].decode("utf-8", "replace"))
    return value.get("content") if isinstance(value, dict) and isinstance(value.get("content"), str) else None


def _markdown_mark(path: str | os.PathLike) -> str | None:
    with open(path, "rb") as file:
        file.seek(max(0, os.fstat(file.fileno()).st_size - _HEAD_BYTES))
        tail = file.read().decode("utf-8", "replace").rstrip()
    found = _MARKDOWN.search(tail.rpartition("\n")[2])
    return found.group(1) if found else None


def _png_mark(path: str | os.PathLike) -> str | None:
    # Pillow reads a PNG's header and text chunks without decoding its pixels
    from PIL import Image  # noqa: PLC0415

    try:
        with Image.open(path) as image:
            value = getattr(image, "text", {}).get(MARK)
    except (Image.DecompressionBombError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def _archive_mark(path: str | os.PathLike) -> str | None:
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.filename.endswith(f"extra/{MARK}") and info.file_size <= _HEAD_BYTES:
                return archive.read(info).decode("utf-8", "replace")
    return None


def _onnx_mark(path: str | os.PathLike) -> str | None:
    if os.path.getsize(path) > _MAX_ONNX_BYTES:
        return None
    try:
        # optional dependency (capsnets[export]); only an existing .onnx output needs it
        import onnx  # noqa: PLC0415
    except ImportError:
        return None
    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
    except Exception:  # protobuf's DecodeError, and whatever a file of another kind makes the parser raise
        return None
    return next((entry.value for entry in model.metadata_props if entry.key == MARK), None)
