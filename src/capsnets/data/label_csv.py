"""Multi-label image folders: ``images/`` and a ``labels.csv`` naming every image's classes (``folder:PATH``).

Layout::

    PATH/labels.csv        file,labels[,split]
    PATH/images/001.png    001.png,cat dog        (two labels)
    PATH/images/sub/2.jpg  sub/2.jpg,             (an empty labels cell: no label)

``file`` is the image's path under ``images/`` (``/``-separated); ``labels`` holds the names of the classes
present, separated by spaces (a name given twice in one cell counts once). The classes are the sorted names found
in the whole file. An optional ``split`` column (``train`` or ``test`` on every row) gives the split; without it
the rows are shuffled by ``split_seed`` and ``test_fraction * N`` of them (rounded half up, at least 1 and at most
``N - 1``) form the test split. Other columns are ignored. Every image under ``images/`` must have a row, so that
an image forgotten in the file is reported rather than left out (hidden files and folders are skipped).

Limits: ``labels.csv`` may have at most :func:`max_labels_csv_bytes` bytes (64 MiB;
``CAPSNETS_MAX_LABELS_CSV_BYTES``), read before parsing, and name at most :data:`MAX_LABEL_CLASSES` classes.
The images are then read as in :mod:`capsnets.data.image_folder` (size, channels, byte limits).
"""

from __future__ import annotations

import csv
from pathlib import Path, PurePosixPath

import torch

from capsnets.images import IMAGE_FORMATS_TEXT, IMAGE_SUFFIXES, image_files
from capsnets.validation import limit_from_env

from .base import seeded_split
from .errors import DatasetError

__all__ = [
    "LABELS_FILE",
    "IMAGES_FOLDER",
    "MAX_LABEL_CLASSES",
    "MAX_LABELS_CSV_BYTES",
    "MAX_LABELS_CSV_BYTES_ENV",
    "max_labels_csv_bytes",
    "scan_labels_csv",
]

#: The file that makes a folder multi-label.
LABELS_FILE = "labels.csv"
#: The folder, beside :data:`LABELS_FILE`, that holds the images its ``file`` column names.
IMAGES_FOLDER = "images"
#: The most distinct class names a ``labels.csv`` may hold.
MAX_LABEL_CLASSES = 1000
#: The most bytes a ``labels.csv`` may have: 64 MiB.
MAX_LABELS_CSV_BYTES = 64 * 2**20
#: The environment variable that replaces :data:`MAX_LABELS_CSV_BYTES` (a whole number of bytes).
MAX_LABELS_CSV_BYTES_ENV = "CAPSNETS_MAX_LABELS_CSV_BYTES"
_SPLITS = ("train", "test")

#: One example: the image file and the indices of its classes (sorted; empty: no label).
Item = tuple[Path, tuple[int, ...]]


def max_labels_csv_bytes() -> int:
    """The most bytes a ``labels.csv`` may have: ``CAPSNETS_MAX_LABELS_CSV_BYTES`` if set, else
    :data:`MAX_LABELS_CSV_BYTES`."""
    return limit_from_env(MAX_LABELS_CSV_BYTES_ENV, MAX_LABELS_CSV_BYTES, "bytes")


def scan_labels_csv(
    root: Path, *, test_fraction: float, split_seed: int
) -> tuple[list[str], list[Item], list[Item], bool]:
    """Read ``root/labels.csv`` against ``root/images/`` (see the module docstring).

    Args:
        root: the folder holding ``labels.csv`` and ``images/``.
        test_fraction: share of the rows that forms the test split when there is no ``split`` column.
        split_seed: seed of that split.

    Returns:
        ``(classes, train, test, presplit)``: the sorted class names, the items of each split in file order, and
        whether the ``split`` column gave the split.

    Raises:
        DatasetError: a missing ``images/`` or column, a row naming no file, a missing or repeated file, an image
            without a row, an unknown split, fewer than 2 classes, more than :data:`MAX_LABEL_CLASSES`, a file
            over :func:`max_labels_csv_bytes`; each message names the file (and line) and the fix.
    """
    csv_path, images = root / LABELS_FILE, root / IMAGES_FOLDER
    if not images.is_dir():
        raise DatasetError(
            f"{csv_path} names the images of a multi-label folder, but {images} is not a folder; Fix: put the "
            f"images the {LABELS_FILE} lists in {images}"
        )
    rows, has_split = _read_rows(csv_path)
    files = {str(p.relative_to(images).as_posix()): p for p in image_files(images)}
    named: dict[str, int] = {}
    for line, row in rows:
        name = _checked_file(csv_path, line, row["file"], files, named)
        named[name] = line
    unlisted = sorted(set(files) - set(named))
    if unlisted:
        raise DatasetError(
            f"{csv_path}: {len(unlisted)} image(s) in {images} have no row, e.g. {unlisted[0]}; Fix: add a row for "
            f"each (an empty labels cell means no label), or move them out of {images}"
        )
    classes = _classes(csv_path, rows)
    index = {name: k for k, name in enumerate(classes)}
    items = [(files[row["file"].strip()], tuple(sorted({index[n] for n in row["labels"].split()}))) for _, row in rows]
    if has_split:
        return classes, *_given_split(csv_path, rows, items), True
    return classes, *_seeded_split(csv_path, items, test_fraction, split_seed), False


def _read_rows(csv_path: Path) -> tuple[list[tuple[int, dict[str, str]]], bool]:
    """The rows as ``(line, {column: cell})`` and whether there is a ``split`` column."""
    size, limit = csv_path.stat().st_size, max_labels_csv_bytes()
    if size > limit:
        raise DatasetError(
            f"{csv_path} has {size:,} bytes, more than the {limit:,} allowed; Fix: split the data set, or raise the "
            f"limit with the environment variable {MAX_LABELS_CSV_BYTES_ENV} (e.g. {MAX_LABELS_CSV_BYTES_ENV}={size})"
        )
    try:
        text = csv_path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DatasetError(f"{csv_path} is not UTF-8 text ({err}); Fix: save it as UTF-8 CSV") from None
    reader = csv.DictReader(text.splitlines())
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in ("file", "labels") if c not in columns]
    if missing:
        raise DatasetError(
            f"{csv_path} has no {' and no '.join(repr(c) for c in missing)} column (its header: "
            f"{','.join(columns) or 'empty'}); Fix: start it with the header line 'file,labels' (and ',split' to "
            "give the split)"
        )
    reader.fieldnames = columns
    rows = []
    for row in reader:
        if None in row:
            raise DatasetError(
                f"{csv_path}, line {reader.line_num}: more cells than the {len(columns)} columns of the header; "
                "Fix: quote a cell that holds a comma"
            )
        rows.append((reader.line_num, {key: value or "" for key, value in row.items()}))
    if not rows:
        raise DatasetError(f"{csv_path} has no rows; Fix: add one line 'FILE,LABELS' per image in its images/ folder")
    return rows, "split" in columns


def _checked_file(csv_path: Path, line: int, cell: str, files: dict[str, Path], named: dict[str, int]) -> str:
    """The row's ``file`` cell, after checking that it names an image of ``images/`` not named before."""
    name = cell.strip()
    where = f"{csv_path}, line {line}"
    if not name:
        raise DatasetError(f"{where}: the file cell is empty; Fix: give the image's path under {IMAGES_FOLDER}/")
    if name in named:
        raise DatasetError(
            f"{where}: {name} has a row already (line {named[name]}); Fix: give each image one row, with all its "
            "labels in its labels cell"
        )
    if name not in files:
        path = PurePosixPath(name)
        why = (
            "is not a path under images/ (absolute, or with '..')"
            if path.is_absolute() or ".." in path.parts
            else f"is not an image ({', '.join(IMAGE_SUFFIXES)})"
            if path.suffix.lower() not in IMAGE_SUFFIXES
            else f"is not in {csv_path.parent / IMAGES_FOLDER}"
        )
        raise DatasetError(
            f"{where}: {name} {why}; Fix: give the path under {IMAGES_FOLDER}/ of an image file there ({IMAGE_FORMATS_TEXT}) "
            "('/'-separated), or delete the row"
        )
    return name


def _classes(csv_path: Path, rows: list[tuple[int, dict[str, str]]]) -> list[str]:
    names = sorted({name for _, row in rows for name in row["labels"].split()})
    if not names:
        raise DatasetError(
            f"{csv_path}: no row has a label (every labels cell is empty); Fix: name each image's classes in its "
            "labels cell, separated by spaces"
        )
    if len(names) < 2:
        raise DatasetError(
            f"{csv_path}: only one class ({names[0]}) is named; a multi-label classifier needs at least 2 classes; "
            "Fix: name the other classes present in the images"
        )
    if len(names) > MAX_LABEL_CLASSES:
        raise DatasetError(
            f"{csv_path} names {len(names):,} classes, more than the {MAX_LABEL_CLASSES:,} allowed (e.g. "
            f"{', '.join(names[:3])}); Fix: check that the labels cell separates names by spaces and holds no "
            "free text, or merge classes"
        )
    return names


def _given_split(csv_path: Path, rows, items: list[Item]) -> tuple[list[Item], list[Item]]:
    splits: dict[str, list[Item]] = {name: [] for name in _SPLITS}
    for (line, row), item in zip(rows, items):
        split = row["split"].strip().lower()
        if split not in splits:
            raise DatasetError(
                f"{csv_path}, line {line}: split {row['split']!r} is unknown; Fix: write train or test in every "
                "row's split cell, or drop the split column for a seeded split"
            )
        splits[split].append(item)
    for name, other in (("train", "test"), ("test", "train")):
        if not splits[name]:
            raise DatasetError(
                f"{csv_path}: no row is in the {name} split (all {len(items)} are {other}); Fix: mark some rows "
                f"{name}, or drop the split column for a seeded split"
            )
    return splits["train"], splits["test"]


def _seeded_split(csv_path: Path, items: list[Item], test_fraction: float, seed: int) -> tuple[list, list]:
    train, test = seeded_split(items, test_fraction, torch.Generator().manual_seed(seed))
    if not test:
        raise DatasetError(
            f"{csv_path} has a single row, so no test split can be drawn; Fix: add images and their rows"
        )
    return train, test
