"""smallNORB (LeCun, Huang & Bottou 2004) from its official NORB-format files, torchvision-style.

Source: https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/. 5 classes of toys (10 instances each;
instances 4, 6, 7, 8, 9 train, 0, 1, 2, 3, 5 test), 18 azimuths x 9 elevations x 6 lightings,
24,300 stereo pairs of 96x96 grey images per split. Per split, three files in ``<root>/smallnorb/``:
``-dat.mat`` (uint8, ``(N, 2, 96, 96)``: left and right camera), ``-cat.mat`` (int32 class, ``(N,)``)
and ``-info.mat`` (int32 ``(N, 4)``: instance 0..9; elevation 0..8, i.e. 30, 35, ..., 70 degrees;
azimuth 0, 2, ..., 34, times 10 for degrees; lighting 0..5). Each is read from ``NAME.mat.gz`` (what
:meth:`SmallNORB.download` fetches) or, failing that, from an uncompressed ``NAME.mat``.

Checksums: the md5s below are those published in several independent public smallNORB loaders
(e.g. the ``disent`` library's ``SmallNorbData`` and torchvision-style ``SmallNORB`` datasets), which
agree with each other; NYU publishes none itself. A file that fails its md5 is rejected.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .base import DATA_ENV_VAR, data_root
from .download import ensure_file
from .errors import DOWNLOAD_HINT, FIX_HINT, DatasetError
from .idx import check_md5
from .norb_common import NORB_INFO_KEYS, RawNorbLike
from .norb_format import read_norb_matrix

__all__ = ["SmallNORB", "SMALLNORB_CLASSES", "azimuth_degrees", "elevation_degrees"]

SMALLNORB_CLASSES = ["animal", "human", "airplane", "truck", "car"]
_PREFIX = {True: "smallnorb-5x46789x9x18x6x2x96x96-training", False: "smallnorb-5x01235x9x18x6x2x96x96-testing"}


def azimuth_degrees(azimuth: Tensor) -> Tensor:
    """smallNORB azimuth units (0, 2, ..., 34) to degrees (0, 20, ..., 340)."""
    return azimuth * 10


def elevation_degrees(elevation: Tensor) -> Tensor:
    """smallNORB elevation index (0..8) to degrees above the horizontal (30, 35, ..., 70)."""
    return 30 + 5 * elevation


class SmallNORB:
    """One split of smallNORB, read (and checked) in full.

    Args:
        root: data root holding ``smallnorb/``; ``None`` means :func:`~capsnets.data.data_root`.
        train: the training split (instances 4, 6, 7, 8, 9) if True, else the test split.
        download: fetch the ``.mat.gz`` files that are missing or fail their md5 (both splits).
        stereo: keep both cameras (``images`` ``(N, 2, 96, 96)``); default: the left camera only
            (channel 0 of each pair), ``(N, 96, 96)``, as most smallNORB work uses.

    Attributes:
        images: uint8 ``(N, 96, 96)`` (or ``(N, 2, 96, 96)`` with ``stereo``).
        labels: int64 ``(N,)`` in ``0..4``, index into :attr:`classes`.
        info: int64 ``(N,)`` tensors ``instance``, ``elevation`` (index 0..8, see
            :func:`elevation_degrees`), ``azimuth`` (file units 0, 2, ..., 34; degrees =
            10 x azimuth, :func:`azimuth_degrees`), ``lighting`` (0..5).
        classes: ``["animal", "human", "airplane", "truck", "car"]``.
    """

    folder = "smallnorb"
    mirrors = ["https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/"]
    classes = SMALLNORB_CLASSES
    image_size = (96, 96)
    parts = ("dat", "cat", "info")
    #: file name -> md5 (of the .gz as served, and of the uncompressed .mat).
    md5s = {
        "smallnorb-5x46789x9x18x6x2x96x96-training-dat.mat.gz": "66054832f9accfe74a0f4c36a75bc0a2",
        "smallnorb-5x46789x9x18x6x2x96x96-training-cat.mat.gz": "23c8b86101fbf0904a000b43d3ed2fd9",
        "smallnorb-5x46789x9x18x6x2x96x96-training-info.mat.gz": "51dee1210a742582ff607dfd94e332e3",
        "smallnorb-5x01235x9x18x6x2x96x96-testing-dat.mat.gz": "e4ad715691ed5a3a5f138751a4ceb071",
        "smallnorb-5x01235x9x18x6x2x96x96-testing-cat.mat.gz": "5aa791cd7e6016cf957ce9bdb93b8603",
        "smallnorb-5x01235x9x18x6x2x96x96-testing-info.mat.gz": "a9454f3864d7fd4bb3ea7fc3eb84924e",
        "smallnorb-5x46789x9x18x6x2x96x96-training-dat.mat": "8138a0902307b32dfa0025a36dfa45ec",
        "smallnorb-5x46789x9x18x6x2x96x96-training-cat.mat": "fd5120d3f770ad57ebe620eb61a0b633",
        "smallnorb-5x46789x9x18x6x2x96x96-training-info.mat": "19faee774120001fc7e17980d6960451",
        "smallnorb-5x01235x9x18x6x2x96x96-testing-dat.mat": "e9920b7f7b2869a8f1a12e945b2c166c",
        "smallnorb-5x01235x9x18x6x2x96x96-testing-cat.mat": "fd5120d3f770ad57ebe620eb61a0b633",
        "smallnorb-5x01235x9x18x6x2x96x96-testing-info.mat": "7c5b871cc69dcadec1bf6a18141f5edc",
    }

    def __init__(
        self, root: str | os.PathLike | None = None, train: bool = True, download: bool = False, stereo: bool = False
    ):
        self.root = data_root(root)
        self.train, self.stereo = train, stereo
        self.directory = self.root / self.folder
        if download:
            self.download()
        paths = [self._find(part) for part in self.parts]
        for path in paths:
            check_md5(path, self.md5s[path.name])
        self.images, self.labels, self.info = self._load(*paths)

    @classmethod
    def filename(cls, train: bool, part: str, compressed: bool = True) -> str:
        """Official file name of ``part`` (``"dat"``, ``"cat"`` or ``"info"``) of a split."""
        return f"{_PREFIX[train]}-{part}.mat" + (".gz" if compressed else "")

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"SmallNORB(split={split}, size={len(self)}, stereo={self.stereo}, directory={self.directory})"

    def raw(self) -> RawNorbLike:
        """The split as a :class:`~capsnets.data.norb_common.RawNorbLike` (left camera if stereo)."""
        images = self.images[:, 0].contiguous() if self.stereo else self.images
        return RawNorbLike(images, self.labels, dict(self.info), list(self.classes))

    def _find(self, part: str) -> Path:
        for compressed in (True, False):
            path = self.directory / self.filename(self.train, part, compressed)
            if path.is_file():
                return path
        name = self.filename(self.train, part)
        raise DatasetError(
            f"smallNORB: missing {name} (or {name[:-3]}) in {self.directory} (data root {self.root}). "
            f"Fix: pass --data-dir DIR (or set {DATA_ENV_VAR}=DIR) where DIR/{self.folder}/ holds the six "
            f"smallnorb-*.mat.gz files, or {DOWNLOAD_HINT} (SmallNORB(..., download=True)) to fetch them."
        )

    def download(self) -> None:
        """Fetch every ``.mat.gz`` of both splits that is missing or fails its md5 (atomic, md5-checked)."""
        for train in (True, False):
            for part in self.parts:
                filename = self.filename(train, part)
                ensure_file(filename, self.directory, self.mirrors, self.md5s[filename])

    def _load(self, dat: Path, cat: Path, info: Path) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        images, labels, meta = read_norb_matrix(dat), read_norb_matrix(cat), read_norb_matrix(info)
        _expect(dat, images, "uint8", (None, 2, *self.image_size))
        _expect(cat, labels, "int32", (None,))
        _expect(info, meta, "int32", (None, len(NORB_INFO_KEYS)))
        for path, array in ((cat, labels), (info, meta)):
            if len(array) != len(images):
                raise DatasetError(
                    f"{dat} has {len(images)} image pairs but {path} has {len(array)} rows; "
                    "the files belong to different splits or one is incomplete; " + FIX_HINT
                )
        if len(labels) and not 0 <= labels.min() <= labels.max() < len(self.classes):
            raise DatasetError(
                f"{cat}: labels must be in 0..{len(self.classes) - 1}, found {labels.min()}..{labels.max()}; "
                + FIX_HINT
            )
        images_t = torch.from_numpy(images if self.stereo else np.ascontiguousarray(images[:, 0]))
        info_t = {key: torch.from_numpy(meta[:, i].astype(np.int64)) for i, key in enumerate(NORB_INFO_KEYS)}
        return images_t, torch.from_numpy(labels.astype(np.int64)), info_t


def _expect(path: Path, array: np.ndarray, dtype: str, shape: tuple) -> None:
    """Raise a :class:`DatasetError` unless ``array`` has ``dtype`` and ``shape`` (``None``: any size)."""
    ok = (
        array.dtype.name == dtype
        and array.ndim == len(shape)
        and all(want is None or want == got for want, got in zip(shape, array.shape))
    )
    if not ok:
        wanted = "(" + ", ".join("N" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise DatasetError(
            f"{path}: expected a {dtype} matrix of shape {wanted}, found {array.dtype.name} {array.shape}; "
            "wrong file for this slot? " + FIX_HINT
        )
