"""``load_viewpoints``: a rendered split, cached under ``<root>/viewpoints/`` as safetensors.

The cache file holds the tensors ``images`` (uint8 ``(N, H, W)``), ``labels`` and the four info fields
(int64 ``(N,)``); its safetensors metadata holds the format, generator version, seed, size, split and the
sha256 of the tensors. A file that cannot be read, or whose metadata, shapes or checksum disagree with
the request, is re-rendered and replaced (with a warning), never used. Files are written to a temporary
file in the same folder and moved into place with :func:`os.replace`, so readers never see half a file.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from capsnets.files import atomic_write

from ..base import data_root
from ..norb_common import NORB_INFO_KEYS, RawNorbLike
from .objects import VIEWPOINT_CLASSES
from .render import render_viewpoints

__all__ = ["load_viewpoints", "cache_path", "GENERATOR_VERSION"]

#: Bump whenever the rendered pixels or order change, so that old caches are re-rendered.
GENERATOR_VERSION = "1"
_FORMAT = "capsnets-viewpoints"
_KEYS = ("images", "labels", *NORB_INFO_KEYS)


def cache_path(root, train: bool, seed: int = 0, size: int = 48) -> Path:
    """``<root>/viewpoints/viewpoints-seed<seed>[-<size>px]-<train|test>.safetensors``."""
    px = "" if size == 48 else f"-{size}px"
    return data_root(root) / "viewpoints" / f"viewpoints-seed{seed}{px}-{'train' if train else 'test'}.safetensors"


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    sha = hashlib.sha256()
    for key in _KEYS:
        sha.update(key.encode())
        sha.update(tensors[key].contiguous().numpy().tobytes())
    return sha.hexdigest()


def _metadata(train: bool, seed: int, size: int) -> dict[str, str]:
    return {
        "format": _FORMAT,
        "version": GENERATOR_VERSION,
        "seed": str(seed),
        "size": str(size),
        "split": "train" if train else "test",
    }


def _read(path: Path, expected: dict[str, str]) -> RawNorbLike:
    """The cached split at ``path``; raises ``ValueError`` (or a safetensors error) if it is not right."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    wrong = {k: (meta.get(k), v) for k, v in expected.items() if meta.get(k) != v}
    if wrong:
        raise ValueError(f"metadata (found, wanted): {wrong}")
    tensors = load_file(str(path))
    if set(tensors) != set(_KEYS):
        raise ValueError(f"tensors {sorted(tensors)}, wanted {sorted(_KEYS)}")
    size = int(expected["size"])
    if tensors["images"].dtype != torch.uint8 or tuple(tensors["images"].shape[1:]) != (size, size):
        raise ValueError(f"images {tensors['images'].dtype} {tuple(tensors['images'].shape)}")
    if _digest(tensors) != meta.get("sha256"):
        raise ValueError("sha256 of the tensors does not match the one recorded")
    info = {k: tensors[k] for k in NORB_INFO_KEYS}
    return RawNorbLike(tensors["images"], tensors["labels"], info, list(VIEWPOINT_CLASSES))


def _write(path: Path, raw: RawNorbLike, metadata: dict[str, str]) -> None:
    tensors = {
        "images": raw.images.contiguous(),
        "labels": raw.labels.contiguous(),
        **{k: raw.info[k].contiguous() for k in NORB_INFO_KEYS},
    }
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={**metadata, "sha256": _digest(tensors)}))


def load_viewpoints(root=None, train: bool = True, seed: int = 0, *, size: int = 48, cache: bool = True) -> RawNorbLike:
    """One split of the offline viewpoint data set, rendered on first use and cached.

    Args:
        root: data root (``None``: :func:`~capsnets.data.base.data_root`); the cache lives in
            ``<root>/viewpoints/``.
        train: the training split (toys 0..4 of each class) if True, else the test split (toys 5..9).
        seed: generator seed (toy proportions and stored order); each seed has its own cache file.
        size: image side (48 like the downscaled smallNORB).
        cache: read and write the cache; False always renders and writes nothing.

    Returns:
        A :class:`~capsnets.data.norb_common.RawNorbLike` of 24,300 uint8 ``(size, size)`` images.
    """
    split = "train" if train else "test"
    if not cache:
        return render_viewpoints(split, seed, size)
    path = cache_path(root, train, seed, size)
    expected = _metadata(train, seed, size)
    if path.exists():
        try:
            return _read(path, expected)
        except Exception as err:  # noqa: BLE001 - any unreadable or mismatched cache is re-rendered
            warnings.warn(f"re-rendering the viewpoint cache {path}: {err}", stacklevel=2)
    raw = render_viewpoints(split, seed, size)
    _write(path, raw, expected)
    return raw
