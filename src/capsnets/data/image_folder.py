"""Your own images: a folder with one subfolder per class of image files (``folder:PATH``): PNG, JPEG, GIF, BMP,
TIFF and WebP (:data:`~capsnets.images.IMAGE_FORMATS`), found by the ending of their names
(:data:`~capsnets.images.IMAGE_SUFFIXES`).

Layouts (class names are the sorted subfolder names; hidden files and folders are skipped)::

    PATH/cat/001.png  PATH/dog/x.jpg ...              one folder: a seeded, stratified split
    PATH/train/cat/...  PATH/test/cat/...             train/ and test/: the split as given
    PATH/labels.csv  PATH/images/...                  multi-label: labels.csv names each image's classes

A folder with a ``labels.csv`` is multi-label (any number of classes per image, none included): the file, its
columns, its optional ``split`` column and its checks are described in :mod:`capsnets.data.label_csv`.

Without ``train/`` and ``test/``, each class's images are shuffled by ``split_seed`` and
``test_fraction * n`` of them (rounded half up; at least 1 and at most ``n - 1`` for classes of 2 or more)
form the test split, so both splits have every class in the folder's proportions and the same
arguments always give the same split.

Channels follow the images: 1 if every image of both splits is grayscale (modes ``1``, ``L``, ``LA``,
16-bit ``I;16`` / ``I``, or a palette of greys), else 3 (grayscale images are then repeated on three
channels). The mode decides, not the pixels: an RGB file whose pixels are grey counts as colour.
Transparent parts are laid on white, and JPEG EXIF orientation is applied. Every image is resized (Pillow, bilinear with
antialiasing) to ``image_size``; by default the size of the first training image (class by class,
files in sorted order), so a folder of same-sized images keeps its size. The whole
split is held in memory as float32 (N x C x H x W x 4 bytes): pass a small ``image_size`` for photos.

Limits, checked from the files' headers before any image is decoded: an image may have at most
:func:`~capsnets.images.max_image_pixels` pixels (8192x8192; ``CAPSNETS_MAX_IMAGE_PIXELS``), and a split at
most :func:`max_folder_bytes` bytes in memory (4 GiB; ``CAPSNETS_MAX_FOLDER_BYTES``).
Pillow reads the files, in the style of torchvision's ``ImageFolder``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from capsnets.images import (
    IMAGE_FORMATS_TEXT,
    IMAGE_SUFFIXES,
    MAX_IMAGE_PIXELS_ENV,
    ImageFileError,
    ImageTooLargeError,
    exif_orientation,
    image_files,
    image_to_tensor,
    is_grey,
    max_image_pixels,
    open_image_header,
)
from capsnets.validation import ArgumentError, limit_from_env

from .base import TensorData, seeded_split, shuffled
from .errors import DatasetError
from .label_csv import LABELS_FILE, scan_labels_csv

__all__ = [
    "FOLDER_PREFIX",
    "MAX_FOLDER_BYTES",
    "MAX_FOLDER_BYTES_ENV",
    "ImageFolderScan",
    "max_folder_bytes",
    "scan_image_folder",
    "load_image_folder",
    "read_image",
]

#: ``load_dataset`` names of the form ``folder:PATH`` read an image folder.
FOLDER_PREFIX = "folder:"
#: The most bytes one split of a folder may take in memory (``N x C x H x W x 4``, float32): 4 GiB. It is checked
#: from the files' headers, before any image is decoded.
MAX_FOLDER_BYTES = 4 * 2**30
#: The environment variable that replaces :data:`MAX_FOLDER_BYTES` (a whole number of bytes).
MAX_FOLDER_BYTES_ENV = "CAPSNETS_MAX_FOLDER_BYTES"


@dataclass(frozen=True)
class ImageFolderScan:
    """What :func:`scan_image_folder` found, before any image is decoded.

    Attributes:
        root: the folder.
        classes: class names (sorted subfolder names, or the names ``labels.csv`` holds), index = label.
        train: ``(file, label)`` pairs of the training split, class by class, files sorted; for a multi-label
            folder ``(file, (label, ...))`` in ``labels.csv``'s order.
        test: the same for the test split.
        presplit: True if the folder has ``train/`` and ``test/`` (or ``labels.csv`` a ``split`` column), False for
            a seeded split.
        channels: 1 (every image grayscale) or 3.
        image_size: ``(H, W)`` every image is resized to.
        multilabel: True for a folder with a ``labels.csv``.
    """

    root: Path
    classes: tuple[str, ...]
    train: tuple[tuple[Path, int], ...]
    test: tuple[tuple[Path, int], ...]
    presplit: bool
    channels: int
    image_size: tuple[int, int]
    multilabel: bool = False

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of the loaded images."""
        return (self.channels, *self.image_size)


def scan_image_folder(
    path: str | os.PathLike,
    *,
    image_size: int | tuple[int, int] | None = None,
    test_fraction: float = 0.2,
    split_seed: int = 0,
) -> ImageFolderScan:
    """List an image folder's classes and files, split them, and decide the channels and size.

    Every image's header is read (not its pixels), so an unreadable file is reported here.

    Args:
        path: the folder (``~`` is expanded; a relative path is relative to the working directory).
        image_size: ``H`` (square) or ``(H, W)``; ``None``: the size of the first image.
        test_fraction: share of each class that forms the test split when there is no ``train/`` + ``test/``.
        split_seed: seed of that split.

    Raises:
        DatasetError: a missing folder, no class subfolders, fewer than 2 classes, an empty class,
            ``train/`` and ``test/`` with different classes, an unreadable image, a ``labels.csv`` that does not
            describe ``images/`` (:func:`~capsnets.data.label_csv.scan_labels_csv`); each message names the folder
            or file and the fix.
        ValueError: ``image_size`` or ``test_fraction`` out of range.
    """
    root, size = _checked_arguments(
        FOLDER_PREFIX, path, image_size, test_fraction, f"one subfolder per class of images ({IMAGE_FORMATS_TEXT})"
    )
    multilabel = (root / LABELS_FILE).is_file()
    presplit = (root / "train").is_dir() or (root / "test").is_dir()
    if multilabel:
        classes, train, test, presplit = scan_labels_csv(root, test_fraction=test_fraction, split_seed=split_seed)
    elif presplit:
        classes, train, test = _presplit(root)
    else:
        classes = _class_folders(root)
        per_class = [_class_files(root / name) for name in classes]
        train, test = _seeded_split(root, per_class, test_fraction, split_seed)
    channels, first_size = _inspect([file for file, _ in train + test])
    return ImageFolderScan(
        root, tuple(classes), tuple(train), tuple(test), presplit, channels, size or first_size, multilabel
    )


def max_folder_bytes() -> int:
    """The most bytes one split of a folder may take in memory: ``CAPSNETS_MAX_FOLDER_BYTES`` if set, else
    :data:`MAX_FOLDER_BYTES`.

    Raises:
        ArgumentError: the variable is set to something other than a positive whole number.
    """
    return limit_from_env(MAX_FOLDER_BYTES_ENV, MAX_FOLDER_BYTES, "bytes")


def _check_split_bytes(source: str, split: str, content: str, stored: str, need: int, image_size_given: bool) -> None:
    """Refuse a split that takes ``need`` bytes in memory, more than :func:`max_folder_bytes`.

    Args:
        source: the data set's name, e.g. ``folder:PATH``.
        split: ``"training"`` or ``"test"``.
        content: what the split holds, e.g. ``"20 images of 3x32x32"``.
        stored: how it is held, e.g. ``"as float32"``.
        need: the bytes it takes.
        image_size_given: whether the size was given (else it is the first image's, which the message says).

    Raises:
        DatasetError: too large; the message gives the size, the limit, and the fixes.
    """
    limit = max_folder_bytes()
    if need > limit:
        origin = "" if image_size_given else " (the size of the first image, as no image size was given)"
        raise DatasetError(
            f"{source}: the {split} split's {content}{origin} take {need / 2**30:.1f} GiB in memory {stored}, more "
            f"than the {limit / 2**30:.1f} GiB allowed; Fix: give a smaller image size (--image-size, e.g. 64), or "
            f"raise the limit with the environment variable {MAX_FOLDER_BYTES_ENV} (e.g. {MAX_FOLDER_BYTES_ENV}={need})"
        )


def load_image_folder(
    path: str | os.PathLike,
    *,
    train: bool = True,
    image_size: int | tuple[int, int] | None = None,
    test_fraction: float = 0.2,
    split_seed: int = 0,
) -> TensorData:
    """One split of an image folder as float32 images in ``[0, 1]`` (see the module docstring).

    The examples come in an order shuffled by ``split_seed``, so a prefix (``--limit-train``) has
    roughly every class.

    Args:
        path, image_size, test_fraction, split_seed: as for :func:`scan_image_folder`.
        train: the training split if True, else the test split.

    Raises:
        DatasetError: as :func:`scan_image_folder`, or a file that cannot be decoded.

    Shape:
        - images: ``(N, C, H, W)`` with ``C`` 1 or 3 and ``(H, W) = image_size``; labels: ``(N,)``, or
          ``(N, K)`` float32 multi-hot for a folder with a ``labels.csv``.

    Example::

        >>> data = load_image_folder("photos", image_size=32)   # photos/cat/*.jpg, photos/dog/*.jpg
        >>> data.images.shape, data.classes
        (torch.Size([40, 3, 32, 32]), ['cat', 'dog'])
    """
    scan = scan_image_folder(path, image_size=image_size, test_fraction=test_fraction, split_seed=split_seed)
    items = scan.train if train else scan.test
    channels, height, width = scan.image_shape
    _check_split_bytes(
        f"{FOLDER_PREFIX}{scan.root}",
        "training" if train else "test",
        f"{len(items)} images of {channels}x{height}x{width}",
        "as float32",
        len(items) * channels * height * width * 4,
        image_size is not None,
    )
    items = shuffled(items, split_seed)
    images = torch.empty(len(items), *scan.image_shape)
    for i, (file, _) in enumerate(items):
        images[i] = read_image(file, scan.channels, scan.image_size)
    if scan.multilabel:
        labels = torch.zeros(len(items), len(scan.classes))
        for i, (_, present) in enumerate(items):
            labels[i, list(present)] = 1.0
    else:
        labels = torch.tensor([label for _, label in items], dtype=torch.long)
    return TensorData(images, labels, len(scan.classes), list(scan.classes), f"{FOLDER_PREFIX}{path}")


def read_image(path: str | os.PathLike, channels: int, size: tuple[int, int] | None = None) -> Tensor:
    """One image file (:data:`~capsnets.images.IMAGE_FORMATS`) as a float32 ``(channels, H, W)`` tensor in ``[0, 1]`` (see :func:`image_to_tensor`).

    Args:
        path: the file.
        channels: 1 (colour is converted to luminance, ITU-R 601-2 as Pillow's ``L``) or 3 (grey is repeated).
        size: ``(H, W)`` to resize to (bilinear, antialiased); ``None``: keep the file's size.

    Raises:
        DatasetError: the file cannot be decoded, or has more pixels than
            :func:`~capsnets.images.max_image_pixels` (checked from its header, before decoding); the message
            names it.
    """
    if channels not in (1, 3):
        raise ArgumentError(f"channels={channels!r} is invalid: expected 1 or 3")
    with _opened(Path(path)) as image:
        try:
            return image_to_tensor(image, channels, size)[0]
        except (OSError, ValueError, SyntaxError, EOFError, struct.error) as err:  # Pillow's errors for bad files
            raise _unreadable(Path(path), f"{type(err).__name__}: {err}") from None


# -- scanning ---------------------------------------------------------------------------------------------
def _checked_arguments(
    prefix: str, path: str | os.PathLike, image_size: int | tuple[int, int] | None, test_fraction: float, holds: str
) -> tuple[Path, tuple[int, int] | None]:
    """``(folder, (H, W) or None)`` of a folder data set's arguments, after checking them.

    Args:
        prefix: the data set's prefix (:data:`FOLDER_PREFIX`, ...), for the messages.
        path, image_size, test_fraction: as for :func:`scan_image_folder`.
        holds: what the folder should hold, for the fix of a missing folder.

    Raises:
        ValueError: ``image_size`` (more pixels than :func:`~capsnets.images.max_image_pixels`) or
            ``test_fraction`` out of range.
        DatasetError: ``path`` is not a folder.
    """
    size = None
    if image_size is not None:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in size):
            raise ArgumentError(f"image_size={image_size!r} is invalid: expected a positive integer or (height, width)")
        if size[0] * size[1] > max_image_pixels():
            raise ArgumentError(
                f"image_size={image_size!r} is invalid: {size[0]}x{size[1]} is more than the {max_image_pixels():,} "
                f"pixels an image may have (raise it with the environment variable {MAX_IMAGE_PIXELS_ENV})"
            )
    if not (isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1):
        raise ArgumentError(f"test_fraction={test_fraction!r} is invalid: expected a number in (0, 1)")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DatasetError(
            f"{prefix}{path}: {root} is not a folder{' (it is a file)' if root.exists() else ''}; "
            f"Fix: give the folder that holds {holds}"
        )
    return root, size


def _class_folders(folder: Path) -> list[str]:
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        loose = [p.name for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES]
        found = f" (it holds {len(loose)} images directly, e.g. {loose[0]})" if loose else ""
        raise DatasetError(
            f"{folder} has no class subfolders{found}; Fix: put each class's images ({IMAGE_FORMATS_TEXT}) in a "
            f"subfolder named after the class, e.g. {folder / 'cat' / '001.png'}"
        )
    if len(classes) < 2:
        raise DatasetError(
            f"{folder} has only one class subfolder ({classes[0]}); a classifier needs at least 2 "
            "classes; Fix: add a subfolder of images for each other class"
        )
    return classes


def _class_files(folder: Path) -> list[Path]:
    files = image_files(folder)
    if not files:
        raise DatasetError(
            f"class folder {folder} has no images ({IMAGE_FORMATS_TEXT}: {', '.join(IMAGE_SUFFIXES)}); "
            "Fix: add images to it, or remove the folder"
        )
    return files


def _presplit(root: Path) -> tuple[list[str], list, list]:
    for name, other in (("train", "test"), ("test", "train")):
        if not (root / name).is_dir():
            raise DatasetError(
                f"{root} has {other}/ but no {name}/; Fix: add {root / name} with the same class "
                f"subfolders, or move the class subfolders of {other}/ up into {root} for a seeded split"
            )
    train_classes, test_classes = _class_folders(root / "train"), _class_folders(root / "test")
    if train_classes != test_classes:
        only_train = sorted(set(train_classes) - set(test_classes))
        only_test = sorted(set(test_classes) - set(train_classes))
        raise DatasetError(
            f"{root}: train/ and test/ have different classes (only in train/: {only_train or 'none'}; "
            f"only in test/: {only_test or 'none'}); Fix: give both the same class subfolders"
        )
    splits = [
        [(file, label) for label, name in enumerate(train_classes) for file in _class_files(root / split / name)]
        for split in ("train", "test")
    ]
    return train_classes, splits[0], splits[1]


def _seeded_split(root: Path, per_class: list[list[Path]], test_fraction: float, seed: int) -> tuple[list, list]:
    """A stratified :func:`~capsnets.data.base.seeded_split`: each class's files in turn, with one generator."""
    generator = torch.Generator().manual_seed(seed)
    train, test = [], []
    for label, files in enumerate(per_class):
        class_train, class_test = seeded_split(files, test_fraction, generator)
        train += [(file, label) for file in class_train]
        test += [(file, label) for file in class_test]
    if not test:
        raise DatasetError(
            f"{root}: every class has a single image, so no test split can be drawn; Fix: add images, "
            "or give train/ and test/ subfolders"
        )
    return train, test


def _inspect(files: list[Path]) -> tuple[int, tuple[int, int]]:
    """``(channels, (H, W) of the first image)`` from the files' headers, each file's size checked."""
    colour, first = False, None
    for file in files:
        with _opened(file) as image:
            colour = colour or not is_grey(image)
            first = first or _upright_size(image)
    return (3 if colour else 1), first


def _upright_size(image) -> tuple[int, int]:
    """``(H, W)`` of an opened image as it is read, with its EXIF orientation applied: a photo's JPEG header gives
    the sensor's size, and orientations 5 to 8 turn it by a quarter (the EXIF of other formats may lie after
    their pixels, so only JPEG's is read)."""
    turned = image.format in ("JPEG", "MPO") and exif_orientation(image) >= 5
    return (image.width, image.height) if turned else (image.height, image.width)


def _opened(file: Path):
    """The file opened with its header read (format and size checked), or a :class:`DatasetError` naming it."""
    try:
        return open_image_header(file)
    except ImageTooLargeError as err:
        raise DatasetError(str(err)) from None
    except ImageFileError as err:
        raise _unreadable(file, err.reason) from None


def _unreadable(file: Path, reason: str) -> DatasetError:
    return DatasetError(
        f"{file}: cannot be read as an image ({reason}); Fix: replace or delete the file (the image formats read: "
        f"{IMAGE_FORMATS_TEXT})"
    )
