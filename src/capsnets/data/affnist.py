"""affNIST (Tieleman 2013, https://www.cs.toronto.edu/~tijmen/affNIST/) and its offline stand-ins.

Sabour, Frosst & Hinton (2017), Sec. 5.2: train on MNIST digits placed at random on a 40x40 black
canvas ("expanded MNIST", :class:`RandomPlacement`), test on affNIST, where each MNIST test digit is
given a small random affine transform: rotation within +-20 degrees, shear within +-0.2, horizontal and
vertical scale in [0.8, 1.2], then a translation within the 40x40 frame.

- :func:`read_affnist_mat` / :func:`load_affnist`: the real files. They are MATLAB v5 ``.mat`` files
  holding a struct ``affNISTdata`` whose field ``image`` is ``uint8 (1600, N)``, one image per column,
  and ``label_int`` ``(1, N)`` holds the digits. Each column is a 40x40 image in row-major order:
  ``image[:, n].reshape(40, 40)`` (numpy's C order) is row ``r``, column ``c`` at ``r * 40 + c``, which
  is how the public readers (``image.T.reshape(N, 40, 40)``) decode them. Needs ``scipy`` (installed
  with scikit-learn, a dependency of this package). No download: the site publishes no checksums;
  unzip ``transformed/test.mat.zip`` (or ``test_batches.zip``) into ``<root>/affnist/`` by hand.
- :func:`affnist_style`: an affNIST-style transform of a batch of 28x28 digits on their device (one
  ``affine_grid`` + ``grid_sample``), deterministic given the generator; :func:`make_affnist_style`
  builds a whole test set from MNIST test digits.

Deviations of the stand-in from the real set: the transform parameters are drawn uniformly over the
ranges above (Tieleman's exact sampling distribution is not published on the page); the translation is
drawn uniformly among the positions that keep the whole transformed digit inside the frame (a digit
too large to fit anywhere, rare at the range limits, is centred and may be clipped); sampling is
bilinear with zero padding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from capsnets.validation import ArgumentError

from .base import TensorData, data_root
from .device import random_shift
from .errors import DatasetError

__all__ = [
    "AFFNIST_SIZE",
    "AffineRanges",
    "AFFNIST_RANGES",
    "AffineParams",
    "affine_matrices",
    "sample_affine_params",
    "affnist_style",
    "make_affnist_style",
    "RandomPlacement",
    "place_randomly",
    "translated_test_set",
    "read_affnist_mat",
    "load_affnist",
]

AFFNIST_SIZE = 40
AFFNIST_URL = "https://www.cs.toronto.edu/~tijmen/affNIST/"
_CLASSES = [str(d) for d in range(10)]


# --------------------------------------------------------------------------------------------------------
# The real files


def read_affnist_mat(path: str | os.PathLike) -> tuple[Tensor, Tensor]:
    """Read one affNIST ``.mat`` file (``test.mat`` or a batch ``1.mat`` ... ``32.mat``).

    Returns:
        images ``uint8 (N, 40, 40)`` and labels ``int64 (N,)``.

    Raises:
        DatasetError: not a MATLAB file, no ``affNISTdata`` struct, or fields of the wrong shape.
    """
    try:
        # slow to import, and only affNIST's .mat files need it
        from scipy.io import loadmat  # noqa: PLC0415
    except ImportError as err:  # pragma: no cover - scipy comes with scikit-learn
        raise DatasetError("reading affNIST .mat files needs scipy (pip install scipy)") from err
    path = Path(path)
    try:
        content = loadmat(path, squeeze_me=False, struct_as_record=True)
    except (ValueError, TypeError, NotImplementedError) as err:  # NotImplementedError: MAT v7.3 (HDF5)
        raise DatasetError(f"{path} is not a MATLAB v5 .mat file affNIST-style: {err}") from None
    if "affNISTdata" not in content:
        found = sorted(k for k in content if not k.startswith("__"))
        raise DatasetError(f"{path} has no 'affNISTdata' struct (variables: {', '.join(found) or 'none'})")
    record = content["affNISTdata"]
    names = record.dtype.names or ()
    for needed in ("image", "label_int"):
        if needed not in names:
            raise DatasetError(f"{path}: affNISTdata has no field {needed!r} (fields: {', '.join(names)})")
    image = np.asarray(record["image"].reshape(-1)[0])
    label = np.asarray(record["label_int"].reshape(-1)[0]).reshape(-1)
    side = AFFNIST_SIZE
    if image.ndim != 2 or image.shape[0] != side * side or image.shape[1] != label.shape[0]:
        raise DatasetError(
            f"{path}: expected image ({side * side}, N) and label_int (1, N), got {image.shape} and {label.shape}"
        )
    if label.size and (label.min() < 0 or label.max() > 9):
        raise DatasetError(f"{path}: labels must be digits 0..9, got {label.min()}..{label.max()}")
    images = np.ascontiguousarray(image.T).reshape(-1, side, side)  # each column is row-major 40x40
    return torch.from_numpy(images.astype(np.uint8)), torch.from_numpy(label.astype(np.int64))


def _affnist_files(location: Path) -> list[Path]:
    if location.is_file():
        return [location]
    for folder in (location, location / "affnist"):
        if (folder / "test.mat").is_file():
            return [folder / "test.mat"]
        batches = folder / "test_batches"
        if batches.is_dir():
            files = sorted(batches.glob("*.mat"), key=lambda p: (len(p.stem), p.stem))
            if files:
                return files
    raise DatasetError(
        f"no affNIST test files under {location}: expected test.mat or test_batches/*.mat (in it or in "
        f"its affnist/ folder). Unzip transformed/test.mat.zip from {AFFNIST_URL} there."
    )


def load_affnist(root: str | os.PathLike | None = None) -> TensorData:
    """The real affNIST test set (transformed MNIST test digits, 40x40), as float images in ``[0, 1]``.

    Args:
        root: a ``.mat`` file, or a folder holding ``test.mat`` or ``test_batches/*.mat`` (directly or
            in ``affnist/``); ``None``: :func:`~capsnets.data.data_root`.
    """
    files = _affnist_files(data_root(root))
    parts = [read_affnist_mat(f) for f in files]
    images = torch.cat([p[0] for p in parts]).unsqueeze(1).float().div_(255.0)
    labels = torch.cat([p[1] for p in parts])
    return TensorData(images, labels, 10, list(_CLASSES), name="affnist")


# --------------------------------------------------------------------------------------------------------
# affNIST-style transforms


@dataclass(frozen=True)
class AffineRanges:
    """Ranges of the random affine transform (affNIST's by default): rotation in degrees (+-),
    shear (+-), and the ``[low, high]`` of the horizontal and vertical scales."""

    rotation: float = 20.0
    shear: float = 0.2
    scale: tuple[float, float] = (0.8, 1.2)

    def __post_init__(self) -> None:
        low, high = self.scale
        if not (self.rotation >= 0 and self.shear >= 0 and 0 < low <= high):
            raise ArgumentError(f"need rotation >= 0, shear >= 0 and 0 < scale[0] <= scale[1], got {self}")


AFFNIST_RANGES = AffineRanges()


@dataclass
class AffineParams:
    """Per-image transform parameters, each a float ``(B,)`` tensor.

    ``rotation`` in degrees, counter-clockwise on screen; ``shear`` moves each row sideways by
    ``shear`` times its height above the centre; ``scale_x``, ``scale_y``; ``shift_x``, ``shift_y`` in
    pixels of the 40x40 output (right and down), from a digit centred in the frame.
    """

    rotation: Tensor
    shear: Tensor
    scale_x: Tensor
    scale_y: Tensor
    shift_x: Tensor
    shift_y: Tensor


def affine_matrices(rotation: Tensor, shear: Tensor, scale_x: Tensor, scale_y: Tensor) -> Tensor:
    """``A = R(rotation) @ [[1, shear], [0, 1]] @ diag(scale_x, scale_y)`` acting on ``(x, y-down)`` pixel
    offsets from the image centre.

    Shape:
        each argument ``(B,)`` -> ``(B, 2, 2)``.
    """
    theta = torch.deg2rad(rotation)
    cos, sin = torch.cos(theta), torch.sin(theta)
    one, zero = torch.ones_like(shear), torch.zeros_like(shear)
    rotate = torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -2)  # CCW with y down
    shear_m = torch.stack([torch.stack([one, shear], -1), torch.stack([zero, one], -1)], -2)
    scale = torch.diag_embed(torch.stack([scale_x, scale_y], -1))
    return rotate @ shear_m @ scale


def sample_affine_params(
    batch: int, generator: torch.Generator, ranges: AffineRanges = AFFNIST_RANGES, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Draw ``(rotation, shear, scale_x, scale_y)`` uniformly over ``ranges`` on the generator's device."""

    def uniform(low: float, high: float) -> Tensor:
        u = torch.rand(batch, generator=generator, device=generator.device, dtype=dtype)
        return low + (high - low) * u

    low, high = ranges.scale
    return (
        uniform(-ranges.rotation, ranges.rotation),
        uniform(-ranges.shear, ranges.shear),
        uniform(low, high),
        uniform(low, high),
    )


def _content_box(images: Tensor, threshold: float) -> Tensor:
    """Per image, ``(x0, x1, y0, y1)`` pixel-centre offsets from the centre of the pixels above
    ``threshold``, widened by one pixel (bilinear sampling reaches that far); an empty image gives 0s.

    Shape:
        images ``(B, 1, H, W)`` -> ``(B, 4)``.
    """
    _, _, height, width = images.shape
    mask = images[:, 0] > threshold  # (B, H, W)

    def extent(present: Tensor, size: int) -> tuple[Tensor, Tensor]:
        index = torch.arange(size, device=images.device, dtype=images.dtype)
        big = torch.full_like(present, size, dtype=images.dtype)
        first = torch.where(present, index, big).amin(dim=1)
        last = torch.where(present, index, -big).amax(dim=1)
        empty = ~present.any(dim=1)
        centre = (size - 1) / 2
        first, last = first.masked_fill(empty, centre), last.masked_fill(empty, centre)
        return first - centre - 1, last - centre + 1

    x0, x1 = extent(mask.any(dim=1), width)
    y0, y1 = extent(mask.any(dim=2), height)
    return torch.stack([x0, x1, y0, y1], dim=1)


def _transformed_extent(matrices: Tensor, box: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Bounding box ``(xmin, xmax, ymin, ymax)`` of the image of ``box`` under ``matrices``."""
    x0, x1, y0, y1 = box.unbind(1)
    corners = torch.stack([torch.stack([x, y], -1) for x in (x0, x1) for y in (y0, y1)], 1)  # (B, 4, 2)
    mapped = corners @ matrices.transpose(1, 2)  # (B, 4, 2)
    return mapped[..., 0].amin(1), mapped[..., 0].amax(1), mapped[..., 1].amin(1), mapped[..., 1].amax(1)


def affnist_style(
    images: Tensor,
    generator: torch.Generator,
    *,
    ranges: AffineRanges = AFFNIST_RANGES,
    size: int = AFFNIST_SIZE,
    margin: float = 0.0,
    threshold: float = 0.0,
    params: AffineParams | None = None,
) -> tuple[Tensor, AffineParams]:
    """Transform digits as affNIST does: rotate, shear, scale about their centre, then translate.

    The translation is uniform among those keeping the whole transformed digit (its pixels above
    ``threshold``, widened by the bilinear kernel) at least ``margin`` pixels inside the
    ``size x size`` frame; a digit that cannot fit is centred.

    Args:
        images: digits in ``[0, 1]``, ``(B, 1, H, W)`` (e.g. 28x28 MNIST), on any device.
        generator: all randomness is drawn from it (on its device, then moved to the images').
        ranges: the transform ranges.
        size: output side.
        margin: the border, in pixels, the digit must keep free.
        threshold: intensities at or below it count as background when measuring the digit.
        params: explicit parameters instead of drawing them (``generator`` is then unused, and the
            given shifts are used as they are).

    Returns:
        the transformed images ``(B, 1, size, size)`` and the :class:`AffineParams` used.
    """
    if images.dim() != 4 or images.shape[1] != 1:
        raise ArgumentError(f"images must be (B, 1, H, W), got {tuple(images.shape)}")
    batch, _, height, width = images.shape
    device, dtype = images.device, images.dtype if images.dtype.is_floating_point else torch.float32
    images = images.to(dtype)
    if params is None:
        drawn = [p.to(device) for p in sample_affine_params(batch, generator, ranges, dtype)]
        matrices = affine_matrices(*drawn)
        xmin, xmax, ymin, ymax = _transformed_extent(matrices, _content_box(images, threshold))
        half = size / 2 - margin
        u = torch.rand(batch, 2, generator=generator, device=generator.device, dtype=dtype).to(device)
        shift_x = _uniform_or_centre(-half - xmin, half - xmax, u[:, 0])
        shift_y = _uniform_or_centre(-half - ymin, half - ymax, u[:, 1])
        params = AffineParams(*drawn, shift_x, shift_y)
    else:
        params = AffineParams(
            *(
                torch.as_tensor(p, dtype=dtype, device=device).expand(batch)
                for p in (params.rotation, params.shear, params.scale_x, params.scale_y, params.shift_x, params.shift_y)
            )
        )
        matrices = affine_matrices(params.rotation, params.shear, params.scale_x, params.scale_y)
    return _warp(images, matrices, params.shift_x, params.shift_y, size), params


def _uniform_or_centre(low: Tensor, high: Tensor, u: Tensor) -> Tensor:
    fits = low <= high
    return torch.where(fits, low + u * (high - low), torch.zeros_like(u))


def _warp(images: Tensor, matrices: Tensor, shift_x: Tensor, shift_y: Tensor, size: int) -> Tensor:
    """Sample ``out(p) = in(A^-1 (p - t))`` with pixel offsets from each image's centre (bilinear, zeros).

    ``affine_grid`` (``align_corners=False``) uses normalised coordinates ``u = offset / (side / 2)``,
    so the source coordinate is ``(size / W_in) A^-1 u_out - A^-1 t / (W_in / 2)`` (per axis).
    """
    batch, _, height, width = images.shape
    inverse = torch.linalg.inv(matrices)  # (B, 2, 2)
    out_half = torch.tensor([size / 2, size / 2], dtype=images.dtype, device=images.device)
    in_half = torch.tensor([width / 2, height / 2], dtype=images.dtype, device=images.device)
    linear = inverse * out_half[None, None, :] / in_half[None, :, None]  # (B, 2, 2)
    shift = torch.stack([shift_x, shift_y], dim=1)  # (B, 2)
    offset = -(inverse @ shift.unsqueeze(-1)).squeeze(-1) / in_half  # (B, 2)
    theta = torch.cat([linear, offset.unsqueeze(-1)], dim=2)  # (B, 2, 3)
    grid = F.affine_grid(theta, [batch, 1, size, size], align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False).clamp_(0, 1)


def make_affnist_style(
    digits: TensorData, *, seed: int = 0, ranges: AffineRanges = AFFNIST_RANGES, batch_size: int = 4096
) -> tuple[TensorData, AffineParams]:
    """An affNIST-style test set from 28x28 digits (MNIST test), on their device, the same for a seed.

    Returns:
        the 40x40 set (named ``"affnist_style"``) and the parameters of every image.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    outs, params = [], []
    for first in range(0, len(digits), batch_size):
        out, p = affnist_style(digits.images[first : first + batch_size], generator, ranges=ranges)
        outs.append(out)
        params.append(p)
    merged = AffineParams(*(torch.cat([getattr(p, f) for p in params]) for f in AffineParams.__dataclass_fields__))
    data = TensorData(
        torch.cat(outs), digits.labels.clone(), digits.num_classes, list(digits.classes), name="affnist_style"
    )
    return data, merged


# --------------------------------------------------------------------------------------------------------
# Expanded (translated) MNIST


def place_randomly(
    images: Tensor, generator: torch.Generator | None = None, *, size: int = AFFNIST_SIZE, offsets: Tensor | None = None
) -> Tensor:
    """Put each image at a random integer position on a black ``size x size`` canvas (nothing clipped).

    Args:
        images: ``(B, C, H, W)`` with ``H, W <= size``.
        generator: draws the top-left offsets ``(dy, dx)`` uniformly in ``[0, size - H] x [0, size - W]``.
        offsets: explicit ``(B, 2)`` integer offsets instead.

    Shape:
        ``(B, C, H, W)`` -> ``(B, C, size, size)``.
    """
    if images.dim() != 4:
        raise ArgumentError(f"images must be (B, C, H, W), got {tuple(images.shape)}")
    batch, _, height, width = images.shape
    if height > size or width > size:
        raise ArgumentError(f"images of {height}x{width} do not fit a {size}x{size} canvas")
    if offsets is None:
        device = generator.device if generator is not None else images.device
        dy = torch.randint(0, size - height + 1, (batch,), generator=generator, device=device)
        dx = torch.randint(0, size - width + 1, (batch,), generator=generator, device=device)
        offsets = torch.stack([dy, dx], dim=1)
    offsets = offsets.to(images.device, torch.long)
    if (
        offsets.shape != (batch, 2)
        or (offsets < 0).any()
        or (offsets[:, 0] > size - height).any()
        or (offsets[:, 1] > size - width).any()
    ):
        raise ArgumentError(f"offsets must be ({batch}, 2) within [0, {size - height}] x [0, {size - width}]")
    canvas = F.pad(images, (0, size - width, 0, size - height))  # digit at the top-left corner
    return random_shift(canvas, 0, shifts=offsets)


@dataclass(frozen=True)
class RandomPlacement:
    """``augment(images, generator)`` for :class:`~capsnets.data.DeviceLoader` / ``train_classifier``:
    :func:`place_randomly` on a ``size x size`` canvas (the paper's expanded MNIST)."""

    size: int = AFFNIST_SIZE

    def __call__(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return place_randomly(images, generator, size=self.size)

    def output_shape(self, shape: tuple[int, int, int]) -> tuple[int, int, int]:
        return (shape[0], self.size, self.size)


def translated_test_set(digits: TensorData, *, seed: int = 0, size: int = AFFNIST_SIZE) -> TensorData:
    """Digits placed at fixed random positions on a ``size x size`` canvas (the same for a seed)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    placed = place_randomly(digits.images, generator, size=size)
    return TensorData(
        placed, digits.labels.clone(), digits.num_classes, list(digits.classes), name=f"{digits.name}_translated{size}"
    )
