"""The embedded offline default: scikit-learn's 8x8 handwritten digits.

Source: the UCI "Optical Recognition of Handwritten Digits" test set (Alpaydin & Kaynak 1998) as shipped
inside the scikit-learn wheel (``sklearn.datasets.load_digits``): 1,797 images, 8x8, values 0..16.
No download is ever needed. The train/test split is ours: stratified, 1,437 / 360 by default, a pure
function of ``seed`` (numpy ``default_rng``), independent of torch's and numpy's global RNGs.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from capsnets.validation import ArgumentError

__all__ = ["load_digits_split", "stratified_split", "DIGITS_CLASSES"]

DIGITS_CLASSES = [str(d) for d in range(10)]


def stratified_split(labels: np.ndarray, test_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Split indices into train / test with every class in proportion, exactly ``test_size`` in test.

    Each class's indices are shuffled and the k-th of n gets the score ``(k + 0.5) / n``; the
    ``test_size`` lowest scores (ties broken by a random key) form the test set, so every class
    contributes ``round(test_size * n / N)`` give or take one.

    Args:
        labels: ``(N,)`` integer class labels.
        test_size: number of test examples, ``0 <= test_size <= N``.
        seed: seed of the ``numpy.random.default_rng`` that drives the shuffle.

    Returns:
        ``(train_indices, test_indices)``, each sorted ascending.
    """
    if not 0 <= test_size <= len(labels):
        raise ArgumentError(f"test_size must be in [0, {len(labels)}], got {test_size}")
    rng = np.random.default_rng(seed)
    score = np.empty(len(labels))
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        score[members] = (np.arange(len(members)) + 0.5) / len(members)
    order = np.lexsort((rng.random(len(labels)), score))
    return np.sort(order[test_size:]), np.sort(order[:test_size])


def load_digits_split(train: bool = True, *, test_size: int = 360, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Load one split of the scikit-learn digits.

    Args:
        train: the training split (1,437 by default) if True, else the test split (360).
        test_size: size of the test split.
        seed: split seed; the same seed always gives the same split.

    Returns:
        ``(images, labels)``: float32 images scaled from 0..16 to ``[0, 1]``, int64 labels, in the
        original (class-interleaved) order.

    Shape:
        - images: ``(N, 1, 8, 8)``
        - labels: ``(N,)``
    """
    pixels, target = _read_digits()
    train_idx, test_idx = stratified_split(target, test_size, seed)
    idx = train_idx if train else test_idx
    images = torch.from_numpy(pixels[idx].astype(np.float32).reshape(-1, 1, 8, 8) / 16.0)
    labels = torch.from_numpy(target[idx].astype(np.int64))
    return images, labels


def _read_digits() -> tuple[np.ndarray, np.ndarray]:
    """``(pixels (1797, 64), labels (1797,))`` of scikit-learn's digits, read from the file its wheel ships
    (``sklearn/datasets/data/digits.csv.gz``: 64 pixels and the label per row) without importing scikit-learn,
    which takes about a second; through ``sklearn.datasets.load_digits`` where the file is not found there."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits  # noqa: PLC0415

        bunch = load_digits()
        return bunch.data, bunch.target
    with gzip.open(path, "rt") as file:
        rows = np.loadtxt(file, delimiter=",")
    return rows[:, :-1], rows[:, -1].astype(np.int64)
