"""Images in and out of the demo: bytes and data URLs to model inputs, drawings framed as training digits are,
tensors to PNG, coupling maps drawn over the input.

A drawing on the page's canvas is large, thin-stroked and anywhere on the canvas; a training digit fills its
frame. :func:`frame_drawing` crops the strokes and scales them into the frame as the data set's digits were
prepared: scikit-learn's 8x8 digits fill the frame's height (UCI "Optical Recognition of Handwritten Digits":
32x32 bitmaps of size-normalised digits, counted in 4x4 blocks, so area averaging here), MNIST's fit a 20x20 box
centred in 28x28 (LeCun et al. 1998; centred here by the box, not by the centre of mass).
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from capsnets.images import DARK_BACKGROUND, FRAMINGS, IMAGE_FORMATS, IMAGE_FORMATS_TEXT, NORB_LIKE, prepare_image
from capsnets.validation import ArgumentError

__all__ = [
    "MAX_IMAGE_PIXELS",
    "data_url",
    "decode_base64",
    "display",
    "frame_drawing",
    "grid_png",
    "heat_png",
    "map_png",
    "open_image",
    "read_image",
    "tensor_png",
]

#: Images with more pixels than this are refused before they are decoded (a canvas drawing has ~10^5).
MAX_IMAGE_PIXELS = 4096 * 4096
#: The fraction of the frame's height and width a drawing's strokes are scaled to fill, by data set.
FILL = {"digits": 1.0}
DEFAULT_FILL = 20 / 28  # MNIST and the data sets made from it
_DATA_URL = re.compile(r"^data:image/[A-Za-z0-9.+-]+;base64,", re.ASCII)


def decode_base64(text: str) -> bytes:
    """The bytes of a base64 string, or of a ``data:image/...;base64,`` URL (what ``canvas.toDataURL`` gives).

    Raises:
        ArgumentError: not base64.
    """
    body = _DATA_URL.sub("", text.strip(), count=1)
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ArgumentError(
            f"image must be an image file ({IMAGE_FORMATS_TEXT}) as base64 or as a data:image/...;base64, URL"
        ) from None


def open_image(data: bytes):
    """A Pillow image from file bytes, its pixels loaded; refused before decoding when larger than
    :data:`MAX_IMAGE_PIXELS`, or when not one of :data:`capsnets.images.IMAGE_FORMATS` (a file that another of
    Pillow's plugins would read, such as EPS, which runs Ghostscript, never reaches it).

    Raises:
        ArgumentError: not an image Pillow reads, or too large.
    """
    try:
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
        width, height = image.size
        if width * height > MAX_IMAGE_PIXELS:
            raise ArgumentError(f"image of {width}x{height} pixels is too large (at most {MAX_IMAGE_PIXELS:,} pixels)")
        image.load()
    except UnidentifiedImageError:
        raise ArgumentError(f"not an image file that can be read; send an image file ({IMAGE_FORMATS_TEXT})") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:  # a damaged file
        if isinstance(err, ArgumentError):
            raise
        raise ArgumentError(
            f"a damaged image ({str(err).splitlines()[0] if str(err) else type(err).__name__}); send an image file "
            f"({IMAGE_FORMATS_TEXT})"
        ) from None
    return image


def read_image(
    data: bytes, input_size: Sequence[int], dataset: str | None, *, frame: bool = False
) -> tuple[Tensor, list[str]]:
    """Image file bytes as the ``(C, H, W)`` input of a model trained on ``dataset``, and what was adapted.

    Prepared as ``capsnets predict`` prepares files (:func:`capsnets.images.prepare_image`), which frames a digit
    for a data set in :data:`capsnets.images.FRAMINGS` (MNIST) whatever ``frame`` says; with ``frame``, a drawing for
    another data set of light strokes on black (scikit-learn's digits) is first framed as its digits are
    (:func:`frame_drawing`; other data sets ignore it with a note).
    """
    image = open_image(data)
    if not frame or FRAMINGS.get(dataset):  # a data set whose framing predict repeats: the same transform
        return prepare_image(image, input_size, dataset)
    if dataset is not None and dataset not in DARK_BACKGROUND:
        tensor, notes = prepare_image(image, input_size, dataset)
        return tensor, [*notes, f"not framed: only drawings for digit data sets are ({dataset} is not one)"]
    channels = int(input_size[0])
    image = _plain(image) if channels == 1 else image
    full, notes = prepare_image(image, (channels, image.height, image.width), dataset or "mnist")
    framed, note = frame_drawing(full, (int(input_size[1]), int(input_size[2])), FILL.get(dataset, DEFAULT_FILL))
    return framed, [*notes, note]


def _plain(image):
    """A canvas drawing without what ``canvas.toDataURL`` adds to it: an opaque alpha channel, and three equal
    colour channels for a grey drawing (so that its notes say what matters)."""
    if image.mode == "RGBA" and image.getchannel("A").getextrema() == (255, 255):
        image = image.convert("RGB")
    if image.mode == "RGB":
        red, green, blue = image.split()
        if red.tobytes() == green.tobytes() == blue.tobytes():
            return red
    return image


def frame_drawing(image: Tensor, size: tuple[int, int], fill: float = DEFAULT_FILL) -> tuple[Tensor, str]:
    """Crop a drawing to its strokes and scale them, keeping their aspect ratio, to fill ``fill`` of a frame of
    ``size``, centred; averaged over areas (thin strokes stay visible) and stretched to a maximum of 1.

    Args:
        image: ``(C, h, w)`` light strokes on black in ``[0, 1]``.
        size: the frame's ``(H, W)``.
        fill: the fraction of the frame's height and width the strokes may take.

    Returns:
        ``(C, H, W)`` and a note saying what was done (an empty drawing comes back black).
    """
    channels = image.shape[0]
    height, width = size
    ink = image.amax(dim=0) > 0.1  # (h, w)
    if not bool(ink.any()):
        return image.new_zeros(channels, height, width), "empty drawing"
    rows, cols = ink.any(dim=1).nonzero()[:, 0], ink.any(dim=0).nonzero()[:, 0]
    crop = image[:, int(rows[0]) : int(rows[-1]) + 1, int(cols[0]) : int(cols[-1]) + 1]
    scale = min(fill * height / crop.shape[1], fill * width / crop.shape[2])
    inner = (max(1, min(height, round(crop.shape[1] * scale))), max(1, min(width, round(crop.shape[2] * scale))))
    scaled = F.interpolate(crop[None], size=inner, mode="area")[0]
    framed = image.new_zeros(channels, height, width)
    top, left = (height - inner[0]) // 2, (width - inner[1]) // 2
    framed[:, top : top + inner[0], left : left + inner[1]] = scaled
    framed = framed / framed.max().clamp_min(1e-6)
    note = f"framed: strokes of {crop.shape[2]}x{crop.shape[1]} px scaled to {inner[1]}x{inner[0]} in {width}x{height}"
    return framed.clamp(0, 1), note


def display(image: Tensor, dataset: str | None = None) -> Tensor:
    """A model input ``(C, H, W)`` as ``[0, 1]`` intensities to look at: as it is, except the standardised
    inputs of smallNORB-like data sets, which are stretched from their minimum to their maximum."""
    if dataset in NORB_LIKE:
        low, high = image.min(), image.max()
        return (image - low) / (high - low).clamp_min(1e-6)
    return image.clamp(0, 1)


def tensor_png(image: Tensor, scale: int = 1) -> bytes:
    """A ``(C, H, W)`` image in ``[0, 1]`` (C = 1 or 3; other counts: the first channel) as PNG bytes, each pixel
    repeated ``scale`` times in both directions."""
    image = image.detach().float().cpu().clamp(0, 1)
    if image.shape[0] not in (1, 3):
        image = image[:1]
    if scale > 1:
        image = image.repeat_interleave(scale, dim=1).repeat_interleave(scale, dim=2)
    pixels = (image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    picture = Image.fromarray(
        pixels[..., 0] if image.shape[0] == 1 else pixels, mode="L" if image.shape[0] == 1 else "RGB"
    )
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def grid_png(grid: Tensor, gap: int = 1) -> bytes:
    """A perturbation grid ``(D, S, C, H, W)`` of ``[0, 1]`` images as one PNG mosaic: row ``d``, column ``s`` is
    image ``grid[d, s]``, each in a grey border ``gap`` pixels wide, so that all cells are the same size (the page
    labels rows and columns in HTML, beside the picture)."""
    dims, steps, channels, height, width = grid.shape
    tiles = F.pad(grid.detach().float().cpu().clamp(0, 1), (gap, gap, gap, gap), value=0.5)  # (D, S, C, H', W')
    mosaic = tiles.permute(2, 0, 3, 1, 4).reshape(channels, dims * (height + 2 * gap), steps * (width + 2 * gap))
    return tensor_png(mosaic)


def heat_png(image: Tensor, heat: Tensor, *, top: float | None = None, side: int = 160, alpha: float = 0.55) -> bytes:
    """``heat`` (a map on a coarser grid) upsampled and drawn over ``image`` in matplotlib's ``inferno``, as
    ``capsnets.experiments.dimensions.plot_routing`` draws it, as PNG bytes of about ``side`` pixels.

    Args:
        image: ``(C, H, W)`` in ``[0, 1]``.
        heat: ``(h, w)``, non-negative.
        top: the value drawn brightest (default: the map's maximum), so that maps can share a scale.
    """
    scale = max(1, side // max(image.shape[-2:]))
    size = (image.shape[-2] * scale, image.shape[-1] * scale)
    grey = image.float().mean(dim=0)[None, None]
    grey = F.interpolate(grey, size=size, mode="nearest")[0, 0]  # (H', W')
    up = F.interpolate(heat.float()[None, None], size=size, mode="bilinear", align_corners=False)[0, 0]
    up = (up / (up.max() if top is None else torch.tensor(top)).clamp_min(1e-12)).clamp(0, 1)
    blended = (1 - alpha) * grey.cpu()[None] + alpha * _inferno(up)
    return tensor_png(blended)


def map_png(heat: Tensor, top: float | None = None) -> bytes:
    """A map ``(h, w)`` of non-negative values in matplotlib's ``inferno`` (``top`` brightest; default: its
    maximum), one pixel per value, as PNG bytes."""
    scaled = heat.float() / (heat.max() if top is None else torch.tensor(top)).clamp_min(1e-12)
    return tensor_png(_inferno(scaled.clamp(0, 1)))


def _inferno(values: Tensor) -> Tensor:
    """``(h, w)`` values in ``[0, 1]`` as ``(3, h, w)`` colours of matplotlib's ``inferno``."""
    # slow to import; only the heat maps need it
    from matplotlib import colormaps  # noqa: PLC0415

    return torch.from_numpy(colormaps["inferno"](values.detach().cpu().numpy())[..., :3]).float().permute(2, 0, 1)


def data_url(png: bytes) -> str:
    """PNG bytes as a ``data:image/png;base64,`` URL, for an ``<img src>``."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
