"""Images as a model's input: files, Pillow images, arrays and tensors prepared as its training data was.

:func:`image_to_tensor` reads a Pillow image as ``folder:PATH`` data sets read their files; :func:`prepare_image`
adapts it to a model trained on a given data set (size, channels, background, the smallNORB protocol);
:class:`ImageTransform` does both for any input (a path, a Pillow image, an array or a tensor), as the
``transforms()`` of a pretrained weight (torchvision's ``weights.transforms()``) and as ``capsnets.predict`` does.
Every image file is opened by :func:`open_image_header` (or :func:`open_image`, which decodes it): only the
:data:`IMAGE_FORMATS`, and refused from its header, before any pixel is decoded, when it has more than
:func:`max_image_pixels` pixels (8192x8192 unless ``CAPSNETS_MAX_IMAGE_PIXELS`` says otherwise).

Examples::

    >>> transform = ImageTransform((1, 28, 28), "mnist")
    >>> transform(torch.rand(28, 28)).shape
    torch.Size([1, 28, 28])
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from capsnets.functional.crop import center_crop
from capsnets.validation import ArgumentError, choice, limit_from_env

__all__ = [
    "DARK_BACKGROUND",
    "DIGIT_BOX",
    "FRAMINGS",
    "IMAGE_FORMATS",
    "IMAGE_FORMATS_TEXT",
    "IMAGE_SUFFIXES",
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_PIXELS_ENV",
    "NORB_CROP",
    "NORB_LIKE",
    "NORB_SIZE",
    "ImageFileError",
    "ImageTooLargeError",
    "ImageTransform",
    "class_colours",
    "exif_orientation",
    "frame_digit",
    "framing",
    "image_files",
    "image_to_tensor",
    "max_image_pixels",
    "open_image",
    "open_image_header",
    "prepare_image",
    "standardize",
]

#: The image file formats read (Pillow's names; JPEG includes the multi-picture JPEG of cameras): the one list of
#: them. Folders (``folder:PATH`` data sets, ``capsnets predict``) take the files named with their endings
#: (:data:`IMAGE_SUFFIXES`); every image file is opened as one of them, by its content, whatever its name; messages
#: and the docs name them as :data:`IMAGE_FORMATS_TEXT` does. Other formats Pillow knows (EPS, which runs
#: Ghostscript; PSD, ICNS...) are refused.
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP")
#: The file name endings of each of :data:`IMAGE_FORMATS`.
_SUFFIXES = {
    "PNG": (".png",),
    "JPEG": (".jpg", ".jpeg"),
    "GIF": (".gif",),
    "BMP": (".bmp",),
    "TIFF": (".tif", ".tiff"),
    "WEBP": (".webp",),
}
#: File name endings read as images (case-insensitive), those of the :data:`IMAGE_FORMATS`; other files are ignored.
IMAGE_SUFFIXES = tuple(suffix for name in IMAGE_FORMATS for suffix in _SUFFIXES[name])
#: :data:`IMAGE_FORMATS` as messages, help texts and the docs name them: ``"PNG, JPEG, GIF, BMP, TIFF, WebP"``.
IMAGE_FORMATS_TEXT = ", ".join({"WEBP": "WebP"}.get(name, name) for name in IMAGE_FORMATS)
#: The most pixels (width x height) an image file may decode to: 8192x8192, more than any camera's photo. A larger
#: file is refused from its header, before its pixels are decoded (Pillow's ``PIL.Image.MAX_IMAGE_PIXELS`` check).
MAX_IMAGE_PIXELS = 8192 * 8192
#: The environment variable that replaces :data:`MAX_IMAGE_PIXELS` (a whole number of pixels).
MAX_IMAGE_PIXELS_ENV = "CAPSNETS_MAX_IMAGE_PIXELS"
#: Data sets of light strokes on a dark background: an image with a light background is inverted (``invert="auto"``).
DARK_BACKGROUND = ("digits", "mnist", "fashion_mnist", "multimnist", "affnist")
#: Data sets prepared by the smallNORB protocol (resized to 48x48, centre 32x32, standardised per image).
NORB_LIKE = ("smallnorb", "viewpoints")
#: The smallNORB protocol's resized side (Hinton et al. 2018, Sec. 5: images downsampled to 48x48).
NORB_SIZE = 48
#: The side of its crops (random 32x32 patches for training, the centre 32x32 for testing).
NORB_CROP = 32
INVERT_MODES = ("auto", "yes", "no")
_GREY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}
_BOMB_PIXELS = re.compile(r"\((\d+) pixels\)")
_ORIENTATION = 0x0112  # the EXIF tag of a photo's orientation
_TRANSPOSE = {  # EXIF orientation -> what turns the image upright (as Pillow's ImageOps.exif_transpose)
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


class ImageFileError(ValueError):
    """An image file that cannot be read: the message names the file, what is wrong and the fix.

    Attributes:
        path: the file (or a description of the image).
        reason: what is wrong, in words, without the file's name or the fix.
    """

    def __init__(self, message: str, path: str | os.PathLike, reason: str) -> None:
        super().__init__(message)
        self.path, self.reason = path, reason


class ImageTooLargeError(ImageFileError):
    """An image file with more pixels than :func:`max_image_pixels`; the message names the file, its size, the
    limit and how to raise it."""


def max_image_pixels() -> int:
    """The most pixels an image file may decode to: ``CAPSNETS_MAX_IMAGE_PIXELS`` if set, else
    :data:`MAX_IMAGE_PIXELS`.

    Raises:
        ArgumentError: the variable is set to something other than a positive whole number.
    """
    return limit_from_env(MAX_IMAGE_PIXELS_ENV, MAX_IMAGE_PIXELS, "pixels")


@contextlib.contextmanager
def _pixel_limit(source: str | os.PathLike):
    """Pillow's decompression-bomb guard, which reads an image's size from its header, at :func:`max_image_pixels`
    while the block runs: ``PIL.Image.MAX_IMAGE_PIXELS`` set to it and ``DecompressionBombWarning`` made an error
    (as Pillow's documentation says), either raised as an :class:`ImageTooLargeError` naming ``source``."""
    limit = max_image_pixels()
    saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, limit
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
        raise _too_large(source, int(_BOMB_PIXELS.search(str(err)).group(1)), limit) from None
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def _too_large(source, pixels: int, limit: int) -> ImageTooLargeError:
    reason = f"an image of {pixels:,} pixels, more than the {limit:,} an image may decode to"
    return ImageTooLargeError(
        f"'{source}' is {reason}; make it smaller, or raise the limit with the environment variable "
        f"{MAX_IMAGE_PIXELS_ENV} (e.g. {MAX_IMAGE_PIXELS_ENV}={pixels})",
        source,
        reason,
    )


def exif_orientation(image) -> int:
    """The EXIF orientation of an opened Pillow image: 1 (upright) to 8, and 1 where the EXIF is missing, damaged
    or out of range. Orientations 5 to 8 swap the width and the height.

    Only a JPEG's EXIF is read before its pixels are decoded; other formats may keep it after their pixels.
    """
    try:
        value = image.getexif().get(_ORIENTATION)
    except (OSError, SyntaxError, ValueError, TypeError, KeyError, IndexError, struct.error):  # damaged EXIF
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _upright(image):
    """The image turned as its EXIF orientation says (``ImageOps.exif_transpose`` without rewriting the EXIF,
    which fails on a damaged one)."""
    image.load()  # a damaged file fails here, not in reading its EXIF (which a PNG keeps after its pixels)
    method = _TRANSPOSE.get(exif_orientation(image))
    return image if method is None else image.transpose(method)


def image_to_tensor(image, channels: int, size: tuple[int, int] | None = None) -> tuple[Tensor, list[str]]:
    """A Pillow image as a float32 ``(channels, H, W)`` tensor in ``[0, 1]``, and what was changed, in words.

    JPEG EXIF orientation is applied; transparent parts are laid on white (as on paper); colour is converted to
    luminance (ITU-R 601-2, Pillow's ``L``) for ``channels=1`` and grey repeated for ``channels=3``; 16-bit and
    float images keep their precision; the image is resized to ``size`` (bilinear, antialiased). The notes name
    the changes a user would not expect: transparency, a change between colour and grey, the resizing. This is
    how ``folder:PATH`` data sets read their files and how ``capsnets predict`` reads a user's image.

    Args:
        image: a ``PIL.Image.Image``.
        channels: 1 or 3.
        size: ``(H, W)``, or None to keep the image's size.
    """
    if channels not in (1, 3):
        raise ArgumentError(f"channels={channels!r} is invalid: expected 1 or 3")
    notes: list[str] = []
    image = _upright(image)
    grey = is_grey(image)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        paper = Image.new("RGBA", image.size, (255, 255, 255, 255))
        paper.alpha_composite(image if image.mode == "RGBA" else image.convert("RGBA"))  # in place: no third copy
        image = paper
        notes.append("transparency flattened onto white")
    if channels == 1 and not grey:
        notes.append(f"converted colour ({image.mode}) -> grayscale")
    elif channels == 3 and grey:
        notes.append(f"converted grayscale ({image.mode}) -> RGB")
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        pixels = np.asarray(image, dtype=np.float32) / (1.0 if image.mode == "F" else 65535.0)
        image, scale = Image.fromarray(np.clip(pixels, 0, 1)), 1.0  # float32: mode "F"
    else:
        image, scale = image.convert("L" if channels == 1 else "RGB"), 255.0
    if size is not None and image.size != (size[1], size[0]):
        before = image.size
        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
        changed = abs(before[0] / before[1] - size[1] / size[0]) > 0.02 * size[1] / size[0]
        notes.append(
            f"resized {before[0]}x{before[1]} -> {size[1]}x{size[0]}" + (" (aspect ratio changed)" if changed else "")
        )
    pixels = np.asarray(image, dtype=np.float32) / scale
    tensor = torch.from_numpy(np.ascontiguousarray(pixels))
    tensor = tensor.unsqueeze(0) if tensor.dim() == 2 else tensor.permute(2, 0, 1)
    if tensor.shape[0] != channels:
        tensor = tensor.expand(channels, -1, -1)
    return tensor.clamp(0, 1).contiguous(), notes


def prepare_image(
    image, input_size: Sequence[int], dataset: str | None = None, *, invert: str = "auto"
) -> tuple[Tensor, list[str]]:
    """One Pillow image as the ``(C, H, W)`` float32 tensor a model trained on ``dataset`` takes.

    The image is read as the ``folder:PATH`` data sets read their files
    (:func:`image_to_tensor`: EXIF orientation, transparency on white, the model's
    channels), resized to its ``H x W`` (smallNORB-like data sets: to 48x48, then the centre 32x32, as their
    test split), scaled to ``[0, 1]`` (smallNORB-like: standardised per image), and, for a data set of light strokes on a dark background
    (:data:`DARK_BACKGROUND`), inverted when its border is lighter than its middle (``invert="auto"``).

    Args:
        image: a ``PIL.Image.Image``.
        input_size: the model's ``(C, H, W)``; ``C`` is 1 or 3.
        dataset: the name of the data set the model was trained on (None: scale to ``[0, 1]`` only).
        invert: ``"auto"``, ``"yes"`` (always) or ``"no"`` (never).

    Returns:
        The tensor and the list of what was adapted, in words (empty when the image fitted as it was).
    """
    if invert not in INVERT_MODES:
        raise ArgumentError(f"invert must be one of {', '.join(INVERT_MODES)}, got {invert!r}")
    channels, height, width = (int(v) for v in input_size)
    if channels not in (1, 3):
        raise ArgumentError(
            f"the model takes {channels}-channel images; only 1 (grayscale) and 3 (RGB) can be made from image files"
        )
    norb = dataset in NORB_LIKE
    if norb and (height, width) != (NORB_CROP, NORB_CROP):
        raise ArgumentError(
            f"the model takes {height}x{width} images, not the {NORB_CROP}x{NORB_CROP} crops of "
            f"its data set {dataset!r}"
        )
    framing = FRAMINGS.get(dataset)
    if framing is not None:  # found in the image as it is (at most _FRAMING_SIDE on a side), framed below
        scale = min(1.0, _FRAMING_SIDE / max(image.size))
        read = (max(1, round(image.size[1] * scale)), max(1, round(image.size[0] * scale)))
        tensor, notes = image_to_tensor(image, channels, read)
        notes = [note for note in notes if not note.startswith("resized")]
    else:
        tensor, notes = image_to_tensor(image, channels, (NORB_SIZE, NORB_SIZE) if norb else (height, width))
    if dataset in DARK_BACKGROUND and invert != "no":
        border = torch.cat([tensor[:, 0], tensor[:, -1], tensor[:, :, 0], tensor[:, :, -1]], dim=1).mean()
        if invert == "yes" or border > 0.5:
            tensor = 1.0 - tensor
            notes.append(
                "inverted ("
                + (
                    "--invert yes"
                    if invert == "yes"
                    else "light background; the model was trained on light strokes on black"
                )
                + ")"
            )
    if framing is not None:
        tensor = frame_digit(tensor, (height, width))
        notes.append(
            f"framed as {dataset}'s digits: the strokes' box scaled to {round(DIGIT_BOX * min(height, width))} px and "
            f"centred by their centre of mass in {height}x{width}"
        )
    if norb:
        tensor = standardize(center_crop(tensor.unsqueeze(0), NORB_CROP))[0]
    return tensor.contiguous(), notes


#: How a data set's training images were framed, where a user's image must be framed the same way to be read:
#: MNIST's digits are their strokes' bounding box scaled to 20x20 (aspect kept), placed in 28x28 with their centre
#: of mass at the centre (LeCun et al., the MNIST database's description).
FRAMINGS = {"mnist": "digit"}
#: The side a digit's box is scaled to, as a fraction of the image's side (MNIST: 20 of 28).
DIGIT_BOX = 20 / 28
#: Images are read at most this many pixels on a side before a digit is found in them (the digit ends at 20 px).
_FRAMING_SIDE = 256


def framing(dataset: str | None, input_size: Sequence[int]) -> str:
    """How the training images of ``dataset`` were framed for a model of ``input_size``, in words: what
    :func:`prepare_image` does to a user's image for that model (a weight's ``meta["framing"]``).

    Examples:
        >>> framing("mnist", (1, 28, 28))
        "the digit's bounding box scaled to 20x20 (aspect kept) and placed by its centre of mass at the centre of 28x28; light strokes on black"
    """
    height, width = int(input_size[1]), int(input_size[2])
    if FRAMINGS.get(dataset) == "digit":
        side = round(DIGIT_BOX * min(height, width))
        text = (
            f"the digit's bounding box scaled to {side}x{side} (aspect kept) and placed by its centre of mass at the "
            f"centre of {height}x{width}"
        )
    elif dataset in NORB_LIKE:
        text = f"the image at {NORB_SIZE}x{NORB_SIZE}, its centre {NORB_CROP}x{NORB_CROP}, standardised per image"
    else:
        text = f"the whole image at {height}x{width}"
    return text + ("; light strokes on black" if dataset in DARK_BACKGROUND else "")


def frame_digit(tensor: Tensor, size: Sequence[int]) -> Tensor:
    """A digit of light strokes on a dark background, found in ``tensor`` and framed as MNIST's digits are: the
    strokes' bounding box scaled (aspect kept) to :data:`DIGIT_BOX` of the output's side, the background
    subtracted and the strokes stretched to 1, placed with their centre of mass at the centre.

    The strokes are told from the background by Otsu's threshold after a 3x3 median filter (which removes the
    grain of a photo or a scan), and their box is the one that holds all but 0.5% of their mass on each side; the
    pixels taken are the image's own within a pixel of the strokes (their anti-aliased edges), the rest zero. An
    image without strokes (uniform) gives zeros.

    Args:
        tensor: ``(C, H, W)`` in ``[0, 1]``, light strokes on dark.
        size: the output's ``(H', W')``.

    Shape:
        ``(C, H, W)`` -> ``(C, H', W')``, every channel the same.

    Examples:
        >>> canvas = torch.zeros(1, 100, 100)
        >>> canvas[0, 10:40, 60:70] = 1.0  # a "1", small and off-centre
        >>> framed = frame_digit(canvas, (28, 28))
        >>> framed.shape, int((framed[0] > 0.5).any(1).sum())  # 20 rows tall
        (torch.Size([1, 28, 28]), 20)
    """
    channels = tensor.shape[0]
    height, width = int(size[0]), int(size[1])
    grey = tensor.mean(0)
    padded = F.pad(grey[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
    smooth = padded.unfold(0, 3, 1).unfold(1, 3, 1).reshape(*grey.shape, 9).median(-1).values
    threshold = _otsu(smooth)
    ink = smooth > (2.0 if threshold is None else threshold)  # None: a uniform image, no strokes
    if not ink.any() or ink.all():
        return tensor.new_zeros(channels, height, width)
    mass = (smooth - threshold).clamp(min=0)
    (top, bottom), (left, right) = _span(mass.sum(1)), _span(mass.sum(0))
    background = smooth[~ink].median()
    level = torch.quantile(smooth[ink].float(), 0.9)
    near = F.max_pool2d(ink[None, None].float(), 3, stride=1, padding=1)[0, 0] > 0  # the strokes and their edges
    strokes = ((grey - background) / (level - background).clamp(min=1e-6)).clamp(0, 1) * near
    crop = strokes[top : bottom + 1, left : right + 1]
    side = max(1, round(DIGIT_BOX * min(height, width)))
    scale = side / max(crop.shape)
    shape = (max(1, round(crop.shape[0] * scale)), max(1, round(crop.shape[1] * scale)))
    digit = F.interpolate(crop[None, None], size=shape, mode="bilinear", antialias=True, align_corners=False)[0, 0]
    digit = digit.clamp(0, 1)
    total = digit.sum().clamp(min=1e-12)
    cy = float((digit.sum(1) * torch.arange(shape[0], dtype=digit.dtype)).sum() / total)
    cx = float((digit.sum(0) * torch.arange(shape[1], dtype=digit.dtype)).sum() / total)
    y0 = min(max(round((height - 1) / 2 - cy), 0), height - shape[0])
    x0 = min(max(round((width - 1) / 2 - cx), 0), width - shape[1])
    out = tensor.new_zeros(height, width)
    out[y0 : y0 + shape[0], x0 : x0 + shape[1]] = digit
    return out.expand(channels, -1, -1).contiguous()


def _otsu(values: Tensor) -> float | None:
    """Otsu's threshold of values in ``[0, 1]`` (256 bins), None if they are all equal."""
    histogram = torch.histc(values.float(), bins=256, min=0.0, max=1.0).double()
    if (histogram > 0).sum() < 2:
        return None
    centres = (torch.arange(256, dtype=torch.float64) + 0.5) / 256
    weight = histogram.cumsum(0)
    mean = (histogram * centres).cumsum(0)
    total, grand = weight[-1], mean[-1]
    between = (grand * weight - total * mean) ** 2 / (weight * (total - weight)).clamp(min=1e-12)
    return float(centres[int(between[:-1].argmax())] + 0.5 / 256)


def _span(profile: Tensor) -> tuple[int, int]:
    """The first and last index of ``profile`` (a mass per row or column) within its central 99%."""
    cumulative = profile.cumsum(0) / profile.sum()
    first = int((cumulative < 0.005).sum())
    last = int((cumulative < 0.995).sum())
    return first, min(max(last, first), len(profile) - 1)


#: Colours of segmentation classes 1, 2, ... when the training masks give none (class 0, the background, is black).
_CLASS_COLOURS = (
    (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240),
    (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (220, 190, 255), (170, 110, 40),
    (255, 250, 200), (128, 0, 0), (170, 255, 195), (128, 128, 0), (255, 215, 180), (0, 0, 128), (128, 128, 128),
)  # fmt: skip


def class_colours(num_classes: int, mask_format: dict | None = None) -> np.ndarray:
    """A colour per segmentation class, ``(K, 3)`` uint8 RGB: the colours of colour masks (``mask_format`` mode
    ``"RGB"``) or of a palette (mode ``"P"``) where the training masks had them, else black for the background
    (class 0) and distinct colours for the others (repeating after 20).

    Examples:
        >>> class_colours(3).tolist()
        [[0, 0, 0], [230, 25, 75], [60, 180, 75]]
    """
    mode = (mask_format or {}).get("mode")
    values = (mask_format or {}).get("values") or []
    if mode == "RGB" and len(values) == num_classes:
        return np.asarray(values, dtype=np.uint8).reshape(num_classes, 3)
    palette = (mask_format or {}).get("palette") or []
    if mode == "P" and len(values) == num_classes and all(3 * v + 3 <= len(palette) for v in values):
        return np.asarray([palette[3 * v : 3 * v + 3] for v in values], dtype=np.uint8)
    rest = [_CLASS_COLOURS[k % len(_CLASS_COLOURS)] for k in range(max(num_classes - 1, 0))]
    return np.asarray([(0, 0, 0), *rest][:num_classes], dtype=np.uint8).reshape(num_classes, 3)


def standardize(images: Tensor) -> Tensor:
    """Per-image zero mean and unit variance: ``(x - mean) / max(std, 1 / sqrt(C*H*W))``.

    The floor on the standard deviation (as TensorFlow's ``per_image_standardization``) keeps a
    constant image finite (it becomes all zeros).

    Shape:
        - images, output: ``(B, C, H, W)``
    """
    if images.dim() != 4:
        raise ArgumentError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    std = images.std(dim=(1, 2, 3), keepdim=True, unbiased=False)
    return (images - mean) / std.clamp_min(images[0].numel() ** -0.5)


def is_grey(image) -> bool:
    """Whether a Pillow image is grayscale by its mode (a palette of greys counts; RGB pixels that are grey do not)."""
    if image.mode in _GREY_MODES:
        return True
    if image.mode in ("P", "PA"):
        palette = _palette_colours(image)
        return bool((palette == palette[:, :1]).all())
    return False


def _palette_colours(image) -> np.ndarray:
    """A palette image's colours ``(K, 3)`` in the file's channel order, from its header where the file holds the
    palette there (Pillow's ``getpalette`` decodes the pixels first)."""
    layouts = {"RGB": 3, "BGR": 3, "RGBX": 4, "BGRX": 4, "RGBA": 4, "BGRA": 4}
    if image.palette is not None:
        mode, data = image.palette.getdata()
        raw = np.frombuffer(data, dtype=np.uint8)
        if mode in layouts and len(raw) >= layouts[mode]:
            width = layouts[mode]
            return raw[: len(raw) // width * width].reshape(-1, width)[:, :3]
        if mode == "RGB;L" and len(raw) >= 3:  # planar: every red, then every green, then every blue
            return raw[: len(raw) // 3 * 3].reshape(3, -1).T
    return np.asarray(image.getpalette() or [0, 0, 1], dtype=np.int64).reshape(-1, 3)


def image_files(folder: str | os.PathLike) -> list[Path]:
    """The image files under ``folder``, searched recursively and sorted: the files with an :data:`IMAGE_SUFFIXES`
    suffix (any case), hidden ones and those in hidden folders (names starting with ``.``) left out.

    Example::

        >>> image_files("photos")   # photos/b.JPG, photos/a/1.png, photos/.cache/2.png, photos/notes.txt
        [PosixPath('photos/a/1.png'), PosixPath('photos/b.JPG')]
    """
    folder = Path(folder)
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix.lower() in IMAGE_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def open_image_header(path: str | os.PathLike) -> Image.Image:
    """The image file ``path`` opened by Pillow with its header read and its pixels not yet decoded, after checking
    its format (:data:`IMAGE_FORMATS`) and its size (Pillow's ``PIL.Image.MAX_IMAGE_PIXELS`` check, set to
    :func:`max_image_pixels`). Close it (``with``) when done.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ImageTooLargeError: more pixels than :func:`max_image_pixels`.
        ImageFileError: not an image of :data:`IMAGE_FORMATS` whose header Pillow can read; the message names the
            file.
    """
    with _pixel_limit(path):
        try:
            return Image.open(path, formats=_readable_formats())
        except FileNotFoundError:
            raise
        except (OSError, SyntaxError, ValueError, EOFError, struct.error) as err:
            raise _unreadable(path, err) from None


def open_image(path: str | os.PathLike) -> Image.Image:
    """The image file ``path``, decoded (Pillow), with a clear error for a file that is not a readable image or
    that is too large; the size is checked from the header, before any pixel is decoded
    (:func:`open_image_header`).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ImageTooLargeError: more pixels than :func:`max_image_pixels` (``CAPSNETS_MAX_IMAGE_PIXELS``).
        ImageFileError: the file is not an image Pillow can read; the message names the file.
    """
    with open_image_header(path) as image:
        try:
            image.load()
        except (OSError, SyntaxError, ValueError, EOFError, struct.error) as err:
            raise _unreadable(path, err) from None
        return image


def _readable_formats() -> tuple[str, ...]:
    """:data:`IMAGE_FORMATS` that this Pillow can open (WebP needs Pillow built with libwebp)."""
    Image.init()
    return tuple(name for name in IMAGE_FORMATS if name in Image.OPEN)


def _unreadable(path, err: Exception) -> ImageFileError:
    reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no details'}"
    return ImageFileError(
        f"'{path}' is not an image that can be read ({reason}); give an image file of one of the formats read: "
        f"{IMAGE_FORMATS_TEXT}",
        path,
        reason,
    )


class ImageTransform:
    """Any image as the ``(C, H, W)`` float32 input of a model trained on ``dataset`` (a weight's ``transforms()``),
    and any batch of images as its ``(B, C, H, W)`` input.

    Accepts a file path, a ``PIL.Image.Image``, a NumPy array or a tensor, and prepares it as
    :func:`prepare_image` does. Arrays and tensors are ``(H, W)``, ``(H, W, C)`` (arrays) or ``(C, H, W)``
    (tensors) with ``C`` in 1, 3, 4, either ``uint8`` in ``[0, 255]`` or floating point in ``[0, 1]``; they
    are converted to a Pillow image first (floating point values at full precision for one channel). A batch is
    a ``(B, C, H, W)`` tensor or a list (or tuple) of any of these; each of its images is prepared alone.

    Args:
        input_size: the model's ``(C, H, W)``; ``C`` is 1 or 3.
        dataset: the data set the model was trained on (see :func:`prepare_image`); None: resize and scale only.
        invert: ``"auto"``, ``"yes"`` or ``"no"``, as :func:`prepare_image`.

    Shape:
        - image: one image, as above; output: ``(C, H, W)`` of ``input_size``.
        - a batch: ``(B, C', H', W')``, or a list of ``B`` images; output: ``(B, C, H, W)``.

    Raises:
        ArgumentError: an input that is no image (or an empty batch); the message says what is taken.

    Examples::

        >>> transform = ImageTransform((1, 28, 28), "mnist")
        >>> transform(np.zeros((64, 64), dtype=np.uint8)).shape
        torch.Size([1, 28, 28])
        >>> transform(torch.rand(4, 1, 56, 56)).shape
        torch.Size([4, 1, 28, 28])
        >>> transform([np.zeros((64, 64), dtype=np.uint8), torch.rand(3, 28, 28)]).shape
        torch.Size([2, 1, 28, 28])
    """

    def __init__(self, input_size: Sequence[int], dataset: str | None = None, *, invert: str = "auto") -> None:
        size = tuple(int(v) for v in input_size)
        if len(size) != 3 or size[0] not in (1, 3) or min(size) < 1:
            raise ArgumentError(f"input_size must be (C, H, W) with C 1 or 3, got {tuple(input_size)!r}", "input_size")
        self.input_size = size
        self.dataset = dataset
        self.invert = choice("invert", invert, INVERT_MODES)

    def __call__(self, image) -> Tensor:
        if isinstance(image, (list, tuple)) or (isinstance(image, Tensor) and image.dim() == 4):
            if len(image) == 0:
                raise ArgumentError(
                    "an empty batch of images: give at least one image (a (B, C, H, W) tensor with B > 0, or a "
                    "non-empty list of images)",
                    "image",
                )
            return torch.stack([self.prepare(item)[0] for item in image])
        return self.prepare(image)[0]

    def prepare(self, image) -> tuple[Tensor, list[str]]:
        """One image's prepared ``(C, H, W)`` tensor and what was adapted, in words (:func:`prepare_image`)."""
        if isinstance(image, (str, os.PathLike)):
            image = open_image(image)
        elif isinstance(image, (np.ndarray, Tensor)):
            image = _array_to_pil(image)
        elif not isinstance(image, Image.Image):
            raise ArgumentError(
                f"cannot read an image from {type(image).__name__}: give a file path, a PIL image, "
                "a NumPy array or a tensor",
                "image",
            )
        elif image.width * image.height > max_image_pixels():  # opened by the caller, perhaps not decoded yet
            source = getattr(image, "filename", "") or "the Pillow image"
            raise _too_large(source, image.width * image.height, max_image_pixels())
        return prepare_image(image, self.input_size, self.dataset, invert=self.invert)

    def __repr__(self) -> str:
        return f"ImageTransform(input_size={self.input_size}, dataset={self.dataset!r}, invert={self.invert!r})"


def _array_to_pil(array) -> Image.Image:
    """An ``(H, W)``, ``(H, W, C)`` array or ``(H, W)``, ``(C, H, W)`` tensor as a Pillow image."""
    if isinstance(array, Tensor):
        tensor = array.detach().cpu()
        if tensor.dim() == 3:
            tensor = tensor.permute(1, 2, 0)
        array = tensor.numpy()
    array = np.asarray(array)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)) or 0 in array.shape:
        raise ArgumentError(
            f"an image array must be (H, W) or (H, W, C) (a tensor (H, W) or (C, H, W)) with C in 1, 3, 4; "
            f"got shape {tuple(array.shape)} (a batch is a (B, C, H, W) tensor or a list of images)",
            "image",
        )
    if array.dtype == np.uint8:
        return Image.fromarray(array)
    if array.dtype == bool or not np.issubdtype(array.dtype, np.number):
        raise ArgumentError(f"an image array must be uint8 or floating point, got {array.dtype}", "image")
    pixels = array.astype(np.float32)
    if not np.isfinite(pixels).all() or pixels.min() < 0 or pixels.max() > 1:
        raise ArgumentError(
            "a floating-point image must hold values in [0, 1] (uint8 images: 0-255); "
            f"found {np.nanmin(pixels):.3g}..{np.nanmax(pixels):.3g}",
            "image",
        )
    if pixels.ndim == 2:
        return Image.fromarray(pixels)  # mode "F"
    return Image.fromarray(np.round(pixels * 255).astype(np.uint8))
