"""Your own segmentation data: a folder of images and their masks (``segfolder:PATH``).

Layouts (an image and its mask share a file name up to the suffix, e.g. ``images/a/001.jpg`` and
``masks/a/001.png``; hidden files and folders are skipped)::

    PATH/images/...  PATH/masks/...                          one folder: a seeded split
    PATH/train/images/... PATH/train/masks/... PATH/test/...  train/ and test/: the split as given
    PATH/classes.json                                          optional: the classes' names and values

Without ``train/`` and ``test/``, the pairs are shuffled by ``split_seed`` and ``test_fraction * n`` of them
(rounded half up; at least 1, at most ``n - 1``) form the test split.

A mask is a PNG with its image's size, of one of two kinds (every mask of a folder of the same kind):

- class indices: a grey (``1``, ``L``, ``I``, ``I;16``) or palette (``P``) PNG whose pixel values are the
  classes, 0 the background. Masks whose values are only 0 and 255 are binary (255: the object); otherwise the
  classes are ``0 .. the largest value`` (a value absent from every mask is a class never seen).
- colours: an RGB or RGBA PNG (fully transparent pixels count as black). The classes are the colours found,
  sorted by ``(R, G, B)``, so black, the background, is class 0.

``classes.json`` fixes the classes instead, in its order (the first is the background): an object mapping each
class name to its pixel value (index masks) or colour (``[R, G, B]`` or ``"#rrggbb"``), e.g.
``{"background": [0, 0, 0], "road": [128, 64, 128]}``; a value a mask holds that it does not list is an error.
Without it, a class is named by its value (``"3"``, ``"#ff0000"``). A folder has 2 to
:data:`MAX_SEGMENTATION_CLASSES` classes.

Images are read as ``folder:PATH`` reads them (:func:`~capsnets.data.image_folder.read_image`: channels,
``image_size``, the limits on pixels per file and bytes per split, checked from the headers); masks are resized
to the same size with nearest-neighbour sampling, so every pixel keeps a class.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from capsnets.images import IMAGE_FORMATS_TEXT, image_files
from capsnets.validation import ArgumentError, positive_int

from .base import seeded_split, shuffled
from .errors import DatasetError
from .image_folder import (
    _check_split_bytes,
    _checked_arguments,
    _inspect,
    _opened,
    _unreadable,
    _upright_size,
    read_image,
)
from .segmentation import SegmentationData

__all__ = [
    "SEGFOLDER_PREFIX",
    "MAX_SEGMENTATION_CLASSES",
    "SegmentationFolderScan",
    "scan_segmentation_folder",
    "load_segmentation_folder",
    "write_digit_segfolder",
]

#: ``load_dataset`` names of the form ``segfolder:PATH`` read a folder of images and masks.
SEGFOLDER_PREFIX = "segfolder:"
#: The most classes a folder may have (masks are held as 8-bit class indices).
MAX_SEGMENTATION_CLASSES = 256
#: The optional file naming the classes.
CLASSES_FILE = "classes.json"
_INDEX_MODES = ("1", "L", "P", "I", "I;16", "I;16B", "I;16L", "I;16N")
_COLOUR_MODES = ("RGB", "RGBA")
_FIX_MODE = "save masks as PNG of class indices (mode L or P) or of class colours (RGB)"


@dataclass(frozen=True)
class SegmentationFolderScan:
    """What :func:`scan_segmentation_folder` found: files, split, image shape and classes.

    Attributes:
        root: the folder.
        train: ``(image, mask)`` file pairs of the training split, sorted by name.
        test: the same for the test split.
        presplit: True if the folder has ``train/`` and ``test/``.
        channels: 1 (every image grayscale) or 3.
        image_size: ``(H, W)`` every image and mask is resized to.
        classes: class names, index = class.
        values: each class's pixel value (index masks) or ``0xRRGGBB`` colour (colour masks).
        colour: True for colour masks.
        palette: the first mask's palette (flat ``[R, G, B, ...]``) for palette masks, else None.
    """

    root: Path
    train: tuple[tuple[Path, Path], ...]
    test: tuple[tuple[Path, Path], ...]
    presplit: bool
    channels: int
    image_size: tuple[int, int]
    classes: tuple[str, ...]
    values: tuple[int, ...]
    colour: bool
    palette: tuple[int, ...] | None

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of the loaded images."""
        return (self.channels, *self.image_size)

    @property
    def mask_format(self) -> dict:
        """How to write a mask as the folder's are (``SegmentationData.mask_format``)."""
        if self.colour:
            return {"mode": "RGB", "values": [[v >> 16, (v >> 8) & 255, v & 255] for v in self.values]}
        if self.palette is not None:
            return {"mode": "P", "values": list(self.values), "palette": list(self.palette)}
        return {"mode": "L", "values": list(self.values)}


def scan_segmentation_folder(
    path: str | os.PathLike,
    *,
    image_size: int | tuple[int, int] | None = None,
    test_fraction: float = 0.2,
    split_seed: int = 0,
) -> SegmentationFolderScan:
    """Pair a folder's images with their masks, split them, and find the classes (see the module docstring).

    Every image's header is read and every mask decoded (to find its classes), so a bad file is reported here.

    Args:
        path: the folder (``~`` is expanded).
        image_size: ``H`` (square) or ``(H, W)``; ``None``: the size of the first training image.
        test_fraction: share of the pairs that forms the test split when there is no ``train/`` + ``test/``.
        split_seed: seed of that split.

    Raises:
        DatasetError: a missing folder, an image without a mask (or a mask without an image), a mask that is
            not a PNG of a mode above, a mask of another size than its image, fewer than 2 or more than
            :data:`MAX_SEGMENTATION_CLASSES` classes, a mask value ``classes.json`` does not list, a bad
            ``classes.json``; each message names the file and the fix.
        ValueError: ``image_size`` (more pixels than :func:`~capsnets.images.max_image_pixels`) or
            ``test_fraction`` out of range.
    """
    root, size = _checked_arguments(SEGFOLDER_PREFIX, path, image_size, test_fraction, "images/ and masks/")
    presplit = (root / "train").is_dir() or (root / "test").is_dir()
    if presplit:
        for name in ("train", "test"):
            if not (root / name).is_dir():
                raise DatasetError(
                    f"{root} has train/ or test/ but no {name}/; Fix: add {root / name} with images/ and masks/"
                )
        train, test = _pairs(root / "train"), _pairs(root / "test")
    else:
        train, test = _seeded_split(root, _pairs(root), test_fraction, split_seed)
    declared = _read_classes_file(root / CLASSES_FILE)
    colour, palette, values = _mask_classes(train + test, declared)
    if declared is not None:
        names, values = tuple(declared[0]), tuple(declared[0].values())
    else:
        names = tuple(f"#{v:06x}" if colour else str(v) for v in values)
    channels, first_size = _inspect([image for image, _ in train + test])
    return SegmentationFolderScan(
        root, tuple(train), tuple(test), presplit, channels, size or first_size, names, values, colour, palette
    )


def load_segmentation_folder(
    path: str | os.PathLike,
    *,
    train: bool = True,
    image_size: int | tuple[int, int] | None = None,
    test_fraction: float = 0.2,
    split_seed: int = 0,
) -> SegmentationData:
    """One split of a folder of images and masks (see the module docstring), in an order shuffled by
    ``split_seed``.

    Args:
        path, image_size, test_fraction, split_seed: as for :func:`scan_segmentation_folder`.
        train: the training split if True, else the test split.

    Raises:
        DatasetError: as :func:`scan_segmentation_folder`; a split too large for memory.

    Shape:
        - images: ``(N, C, H, W)`` float32 in ``[0, 1]``; masks: ``(N, 1, H, W)`` uint8 class indices.

    Example::

        >>> data = load_segmentation_folder("scans", image_size=64)   # scans/images/*.png, scans/masks/*.png
        >>> data.images.shape, data.masks.shape, data.classes
        (torch.Size([40, 1, 64, 64]), torch.Size([40, 1, 64, 64]), ('0', '255'))
    """
    scan = scan_segmentation_folder(path, image_size=image_size, test_fraction=test_fraction, split_seed=split_seed)
    items = scan.train if train else scan.test
    channels, height, width = scan.image_shape
    _check_split_bytes(
        f"{SEGFOLDER_PREFIX}{scan.root}",
        "training" if train else "test",
        f"{len(items)} images and masks of {height}x{width}",
        "as float32 images and 8-bit masks",
        len(items) * (channels * 4 + 1) * height * width,
        image_size is not None,
    )
    items = shuffled(items, split_seed)
    images = torch.empty(len(items), *scan.image_shape)
    masks = torch.empty(len(items), 1, height, width, dtype=torch.uint8)
    for i, (image_file, mask_file) in enumerate(items):
        images[i] = read_image(image_file, channels, scan.image_size)
        masks[i, 0] = torch.from_numpy(_class_mask(mask_file, scan, (height, width)))
    return SegmentationData(
        images, masks, len(scan.classes), scan.classes, f"{SEGFOLDER_PREFIX}{path}", scan.mask_format
    )


# -- files ------------------------------------------------------------------------------------------------
def _files(folder: Path) -> dict[str, Path]:
    """Image files under ``folder`` by their path relative to it, without the suffix."""
    found: dict[str, Path] = {}
    for file in image_files(folder):
        key = file.relative_to(folder).with_suffix("").as_posix()
        if key in found:
            raise DatasetError(f"{found[key]} and {file} have the same name; Fix: keep one file per name in {folder}")
        found[key] = file
    return found


def _pairs(folder: Path) -> list[tuple[Path, Path]]:
    """``(image, mask)`` pairs of ``folder/images`` and ``folder/masks``, sorted by name."""
    for name in ("images", "masks"):
        if not (folder / name).is_dir():
            raise DatasetError(
                f"{folder} has no {name}/ folder; Fix: put the images in {folder / 'images'} and a mask of the "
                f"same name for each in {folder / 'masks'} (e.g. images/001.jpg and masks/001.png)"
            )
    images, masks = _files(folder / "images"), _files(folder / "masks")
    if not images:
        raise DatasetError(f"{folder / 'images'} has no images ({IMAGE_FORMATS_TEXT}); Fix: add images to it")
    missing = sorted(set(images) - set(masks))
    if missing:
        raise DatasetError(
            f"{len(missing)} image(s) in {folder / 'images'} have no mask, e.g. {images[missing[0]]} (expected "
            f"{folder / 'masks' / missing[0]}.png); Fix: add a mask of the same name for each, or remove the image"
        )
    orphans = sorted(set(masks) - set(images))
    if orphans:
        raise DatasetError(
            f"{len(orphans)} mask(s) in {folder / 'masks'} have no image, e.g. {masks[orphans[0]]}; Fix: name each "
            "mask as its image (up to the suffix), or remove it"
        )
    for key in sorted(masks):
        if masks[key].suffix.lower() != ".png":
            raise DatasetError(
                f"mask {masks[key]} is not a PNG (JPEG compression changes the pixel values, and so the classes); "
                f"Fix: {_FIX_MODE}"
            )
    return [(images[key], masks[key]) for key in sorted(images)]


def _seeded_split(root: Path, pairs: list, test_fraction: float, seed: int) -> tuple[list, list]:
    train, test = seeded_split(pairs, test_fraction, torch.Generator().manual_seed(seed))
    if not test:
        raise DatasetError(
            f"{root} has a single image, so no test split can be drawn; Fix: add images, or give train/ and test/"
        )
    return train, test


def _read_classes_file(path: Path) -> tuple[dict[str, int], bool] | None:
    """``classes.json`` as ``{name: value}`` (colours packed as ``0xRRGGBB``) and whether the values are colours,
    or None where there is none."""
    if not path.is_file():
        return None
    fix = (
        "Fix: write an object mapping each class name to its mask value or colour, the background first, e.g. "
        '{"background": 0, "tumour": 1} or {"background": [0, 0, 0], "road": "#804080"}'
    )
    try:
        text = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(f"{path} cannot be read as JSON ({err}); {fix}") from None
    if not isinstance(text, dict) or not 2 <= len(text) <= MAX_SEGMENTATION_CLASSES:
        raise DatasetError(f"{path} must hold an object of 2 to {MAX_SEGMENTATION_CLASSES} classes; {fix}")
    classes = {name: _class_value(path, name, value, fix) for name, value in text.items()}
    if len(set(classes.values())) != len(classes):
        raise DatasetError(f"{path} gives two classes the same value; {fix}")
    kinds = {isinstance(value, (list, str)) for value in text.values()}
    if len(kinds) > 1:
        raise DatasetError(f"{path} mixes mask values and colours; {fix}")
    return classes, kinds == {True}


def _class_value(path: Path, name: str, value, fix: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 256:
        return value
    if isinstance(value, str) and len(value) == 7 and value.startswith("#"):
        try:
            return int(value[1:], 16)
        except ValueError:
            pass
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) and 0 <= v < 256 for v in value):
        return value[0] << 16 | value[1] << 8 | value[2]
    raise DatasetError(
        f"{path}: class {name!r} has value {value!r}, which is neither a mask value (0 to 255) nor a colour; {fix}"
    )


# -- masks ------------------------------------------------------------------------------------------------
def _mask_pixels(file: Path, image_size: tuple[int, int] | None = None) -> tuple[np.ndarray, bool, list | None]:
    """A mask's raw values ``(H, W)`` int64 (colours packed as ``0xRRGGBB``), whether they are colours, and its
    palette (``P`` masks); with ``image_size`` (its image's ``(H, W)``), its size is checked against it."""
    with _opened(file) as mask:
        if mask.format != "PNG" or mask.mode not in _INDEX_MODES + _COLOUR_MODES:
            raise DatasetError(f"mask {file} is a {mask.format} image of mode {mask.mode}; Fix: {_FIX_MODE}")
        if image_size is not None and (mask.height, mask.width) != image_size:
            raise DatasetError(
                f"mask {file} is {mask.width}x{mask.height} but its image is {image_size[1]}x{image_size[0]}; "
                "Fix: save each mask at its image's size"
            )
        try:
            pixels = np.asarray(mask).astype(np.int64)
        except (OSError, ValueError, SyntaxError, EOFError, struct.error) as err:
            raise _unreadable(file, f"{type(err).__name__}: {err}") from None
        palette = mask.getpalette() if mask.mode == "P" else None
    if pixels.ndim == 3:  # RGB(A): pack the colour, fully transparent pixels black
        packed = pixels[..., 0] << 16 | pixels[..., 1] << 8 | pixels[..., 2]
        return (np.where(pixels[..., 3] == 0, 0, packed) if pixels.shape[-1] == 4 else packed), True, None
    return pixels, False, palette


def _mask_classes(pairs: list, declared: tuple[dict[str, int], bool] | None) -> tuple[bool, list | None, tuple]:
    """Read every mask: ``(colour, palette, values)``, the classes' values sorted (binary 0/255 masks: 0, 255)."""
    found: set[int] = set()
    colour, palette = None, None
    allowed = None if declared is None else set(declared[0].values())
    for image, file in pairs:
        with _opened(image) as opened:
            size = _upright_size(opened)
        pixels, is_colour, file_palette = _mask_pixels(file, size)
        if colour is None:
            colour, palette = is_colour, file_palette
        elif colour != is_colour:
            raise DatasetError(
                f"mask {file} holds {'colours' if is_colour else 'class indices'} but earlier masks hold "
                f"{'colours' if colour else 'class indices'}; Fix: save every mask of the folder the same way"
            )
        values = np.unique(pixels)
        if declared is not None:
            if declared[1] != is_colour:
                raise DatasetError(
                    f"{CLASSES_FILE} gives {'indices' if is_colour else 'colours'} but mask {file} holds "
                    f"{'colours' if is_colour else 'class indices'}; Fix: give each class's "
                    f"{'colour' if is_colour else 'mask value'} in {CLASSES_FILE}"
                )
            unknown = [int(v) for v in values if int(v) not in allowed]
            if unknown:
                shown = f"#{unknown[0]:06x}" if is_colour else str(unknown[0])
                raise DatasetError(
                    f"mask {file} holds {'colour' if is_colour else 'value'} {shown}, which {CLASSES_FILE} does not "
                    f"list; Fix: add its class to {CLASSES_FILE}, or correct the mask"
                )
        elif not is_colour and (values[-1] >= MAX_SEGMENTATION_CLASSES or values[0] < 0):
            raise DatasetError(
                f"mask {file} holds the value {values[-1] if values[0] >= 0 else values[0]}: too many classes (index masks hold classes 0 to "
                f"{MAX_SEGMENTATION_CLASSES - 1}); Fix: {_FIX_MODE}"
            )
        found.update(int(v) for v in values)
        if len(found) > MAX_SEGMENTATION_CLASSES:
            raise DatasetError(
                f"the masks up to {file} hold more than {MAX_SEGMENTATION_CLASSES} colours: too many classes (a "
                f"resized or antialiased mask mixes colours at edges); Fix: save masks with one exact colour per "
                f"class, unblended"
            )
    if declared is not None:
        return colour, palette, ()
    if colour:
        values = tuple(sorted(found))
    else:
        values = (0, 255) if 255 in found and found <= {0, 255} else tuple(range(max(found) + 1))
    if len(values) < 2:
        raise DatasetError(
            f"every mask holds the one value {values[0] if values else 0}; a segmentation needs at least 2 classes "
            "(the background and an object); Fix: mark the objects in the masks"
        )
    return colour, palette, values


def _class_mask(file: Path, scan: SegmentationFolderScan, size: tuple[int, int]) -> np.ndarray:
    """A mask as uint8 class indices ``(H, W)``, resized to ``size`` by nearest-neighbour sampling."""
    pixels, _, _ = _mask_pixels(file)
    values = np.asarray(scan.values, dtype=np.int64)
    order = np.argsort(values)
    position = np.searchsorted(values[order], pixels).clip(0, len(values) - 1)
    indices = order[position].astype(np.uint8)
    mask = Image.fromarray(indices, mode="L")
    if mask.size != (size[1], size[0]):
        mask = mask.resize((size[1], size[0]), Image.Resampling.NEAREST)
    return np.asarray(mask, dtype=np.uint8).copy()


def write_digit_segfolder(
    root: str | os.PathLike,
    digits: torch.Tensor,
    labels: torch.Tensor,
    *,
    classes: tuple[int, ...] = (0, 1, 2),
    count: int = 400,
    size: int = 16,
    seed: int = 0,
    per_image: int = 1,
    digit_size: int | None = None,
) -> Path:
    """Write a ``segfolder:PATH`` folder of real digits whose masks label each digit's class: an example of the
    format, and the multi-class task of the tests and of ``benchmarks/segfolder_digits.py``.

    The digits of ``digits`` whose label is in ``classes`` (the first ``count * per_image`` of them) are shrunk to
    ``digit_size`` pixels (bilinear, antialiased) and put at seeded random places on black ``size x size``
    canvases, ``per_image`` on each: one digit at an offset of 0 to ``size - digit_size`` pixels (by default
    ``size - 4``: 0 to 4), several anywhere, a later digit drawn over an earlier one where they overlap (the
    lighter pixel kept; the mask takes the later digit's class where its pixel is above 0.5). The folder holds
    ``images/<k>.png`` (grey), ``masks/<k>.png`` (mode ``L`` class indices: 0 the background, ``i + 1`` the
    pixels above 0.5 of a digit of class ``classes[i]``) and ``classes.json`` (``background``, ``digit C``, ...).

    Args:
        root: the folder to write (created; existing files of the same names are replaced).
        digits: ``(N, 1, 28, 28)`` images in ``[0, 1]``, e.g. ``load_dataset("mnist").images``.
        labels: ``(N,)`` their digits.
        classes: the digits to keep, in the order of their class indices.
        count: at most this many images (fewer when the kept digits run out).
        size: the images' side, at least 5.
        seed: the places' seed.
        per_image: digits on each image.
        digit_size: the digits' side, from 1 to ``size`` (default ``size - 4``).

    Returns:
        ``root`` as a :class:`~pathlib.Path`.

    Examples:
        >>> from capsnets.data import load_dataset
        >>> mnist = load_dataset("mnist", train=True, download=True)  # doctest: +SKIP
        >>> folder = write_digit_segfolder("digits", mnist.images, mnist.labels, count=600)  # doctest: +SKIP
        >>> load_dataset(f"segfolder:{folder}", train=True).num_classes  # doctest: +SKIP
        4
        >>> large = write_digit_segfolder("scenes", mnist.images, mnist.labels, size=64, per_image=4, digit_size=20)  # doctest: +SKIP
    """
    if size < 5:
        raise ArgumentError(f"size must be at least 5 (digits of size - 4 pixels), got {size}")
    per_image = positive_int("per_image", per_image)
    side = size - 4 if digit_size is None else positive_int("digit_size", digit_size)
    if side > size:
        raise ArgumentError(f"digit_size must be at most size ({size}), got {side}")
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    keep = torch.isin(labels, torch.tensor(classes))
    digits, labels = digits[keep][: count * per_image], labels[keep][: count * per_image]
    small = torch.nn.functional.interpolate(digits.float(), size=(side, side), mode="bilinear", antialias=True)
    small = small.clamp(0, 1)
    offsets = torch.randint(0, size - side + 1, (len(small), 2), generator=torch.Generator().manual_seed(seed))
    for k in range(len(small) // per_image):
        image, mask = np.zeros((size, size), np.uint8), np.zeros((size, size), np.uint8)
        for j in range(k * per_image, (k + 1) * per_image):
            (dy, dx), digit = offsets[j].tolist(), small[j, 0].numpy()
            window = (slice(dy, dy + side), slice(dx, dx + side))
            image[window] = np.maximum(image[window], (digit * 255).round().astype(np.uint8))
            mask[window] = np.where(digit > 0.5, classes.index(int(labels[j])) + 1, mask[window])
        Image.fromarray(image, mode="L").save(root / "images" / f"{k:05d}.png")
        Image.fromarray(mask, mode="L").save(root / "masks" / f"{k:05d}.png")
    names = {"background": 0, **{f"digit {c}": i + 1 for i, c in enumerate(classes)}}
    (root / CLASSES_FILE).write_text(json.dumps(names))
    return root
