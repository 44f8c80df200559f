"""Figures for training runs and trained capsule models: learning curves, reconstructions, confusion matrices,
and the perturbation grid of a class capsule.

Every function draws on a private :class:`matplotlib.figure.Figure` rendered by
:class:`matplotlib.backends.backend_agg.FigureCanvasAgg`, so nothing here touches pyplot's global state or
the backend a user has chosen. Every function creates the parent directory of ``out_png``, writes the PNG
atomically (a temporary file in the same directory, then :func:`os.replace`) and returns the path; other
figures (the experiments') are written the same way by :func:`save_figure`.

The figures follow the ones in Sabour, Frosst & Hinton (2017), "Dynamic Routing Between Capsules",
arXiv 1710.09829: Figure 3 pairs inputs with their reconstructions and marks the label and prediction; Figure 4
perturbs each dimension of the winning class capsule and decodes the result.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from torch import Tensor, nn

from capsnets.files import atomic_write, read_json_lines
from capsnets.functional import capsule_length
from capsnets.images import class_colours
from capsnets.outputs import png_text
from capsnets.validation import ArgumentError

__all__ = [
    "PERTURBATIONS",
    "image_rows",
    "perturbation_grid",
    "plot_confusion_matrix",
    "plot_perturbation_grid",
    "plot_reconstructions",
    "plot_training_curves",
    "save_figure",
]

#: The steps by which :func:`perturbation_grid` moves each capsule dimension: -0.25 ... +0.25 by 0.05
#: (Sabour et al. 2017, Sec. 5.1).
PERTURBATIONS = torch.arange(-5, 6) * 0.05

_PAIRS_PER_ROW = 8  # reconstruction pairs per block of two rows


def _to_numpy(x) -> np.ndarray:
    """Return ``x`` (tensor, array or nested sequence) as a float64 NumPy array on the host."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def save_figure(fig: Figure, out_png: str | os.PathLike) -> Path:
    """Render a figure to a PNG file atomically, the way every figure of this module is written.

    Args:
        fig: a :class:`matplotlib.figure.Figure` made without pyplot (``Figure(...)``); it is attached to
            an Agg canvas, drawn at 100 dpi and cleared afterwards, so it must not be used again.
        out_png: where to write the PNG; missing parent directories are created, and the file appears
            complete or not at all (a temporary file in the same directory, then :func:`os.replace`).

    Returns:
        ``Path(out_png)``.

    Example:
        >>> fig = Figure(figsize=(4, 3))
        >>> _ = fig.subplots().plot([0, 1], [1, 0])
        >>> save_figure(fig, "runs/example/line.png")  # doctest: +SKIP
    """
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    try:
        return atomic_write(out, lambda tmp: fig.savefig(tmp, format="png", dpi=100, metadata=png_text("figure")))
    finally:
        fig.clear()


# --------------------------------------------------------------------------------------------------------
# Training curves


def _read_metrics(path: Path) -> list[dict]:
    """The records of a JSON-lines file (:func:`capsnets.files.read_json_lines`); none raises ``ValueError``."""
    records = read_json_lines(path)
    if not records:
        raise ArgumentError(f"metrics_jsonl_path={str(path)!r} holds no records")
    return records


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    """Return ``(epochs, values)`` for the records that carry a finite number under ``key``."""
    xs, ys = [], []
    for index, record in enumerate(records):
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            epoch = record.get("epoch", index + 1)
            xs.append(float(epoch) if isinstance(epoch, (int, float)) else float(index + 1))
            ys.append(float(value))
    return xs, ys


def _as_percent(values: list[float]) -> list[float]:
    """Accuracies stored as fractions (all <= 1) are scaled to percent; percentages pass through."""
    return [100.0 * v for v in values] if values and max(values) <= 1.0 else values


def _draw_loss(ax, records: list[dict]) -> None:
    for key, label in (("train_loss", "train"), ("test_loss", "test")):
        xs, ys = _series(records, key)
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.set(title="Loss", xlabel="epoch", ylabel="loss")


def _draw_accuracy(ax, records: list[dict]) -> None:
    for key, label in (("train_accuracy", "train"), ("test_accuracy", "test")):
        xs, ys = _series(records, key)
        if xs:
            ax.plot(xs, _as_percent(ys), marker="o", markersize=3, label=label)
    xs, ys = _series(records, "test_accuracy")
    if xs:
        ys = _as_percent(ys)
        best = int(np.argmax(ys))
        ax.scatter([xs[best]], [ys[best]], color="red", zorder=3)
        ax.annotate(
            f"best {ys[best]:.2f}% (epoch {xs[best]:g})",
            (xs[best], ys[best]),
            xytext=(0.35, 0.1),
            textcoords="axes fraction",
            arrowprops={"arrowstyle": "->", "color": "red"},
            color="red",
        )
    ax.set(title="Accuracy", xlabel="epoch", ylabel="accuracy (%)")


def plot_training_curves(metrics_jsonl_path: str | os.PathLike, out_png: str | os.PathLike) -> Path:
    """Plot loss and accuracy per epoch from a ``metrics.jsonl`` file.

    Args:
        metrics_jsonl_path: one JSON object per line (one per epoch) with any of the keys ``epoch``,
            ``train_loss``, ``test_loss``, ``train_accuracy``, ``test_accuracy``, ``lr``. Missing keys,
            ``null`` and non-finite values are skipped; a missing ``epoch`` becomes the line's 1-based index.
            Accuracies may be fractions in ``[0, 1]`` or percentages; they are drawn as percentages.
        out_png: where to write the PNG.

    Returns:
        ``Path(out_png)``. Raises ``ValueError`` for an empty file or a line that is not a JSON object.

    Example:
        >>> plot_training_curves("runs/capsnet/metrics.jsonl", "runs/capsnet/curves.png")  # doctest: +SKIP
    """
    records = _read_metrics(Path(metrics_jsonl_path))
    fig = Figure(figsize=(11, 4), layout="constrained")
    loss_ax, acc_ax = fig.subplots(1, 2)
    _draw_loss(loss_ax, records)
    _draw_accuracy(acc_ax, records)
    xs, lrs = _series(records, "lr")
    if xs:  # learning rate on a faint secondary axis of the loss panel
        lr_ax = loss_ax.twinx()
        lr_ax.plot(xs, lrs, color="grey", linestyle=":", label="lr")
        lr_ax.set_ylabel("learning rate", color="grey")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="best")
    return save_figure(fig, out_png)


# --------------------------------------------------------------------------------------------------------
# Reconstructions


def _check_images(name: str, x: np.ndarray) -> None:
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ArgumentError(f"{name} must have shape (B, C, H, W) with C = 1 or 3, got {tuple(x.shape)}")


def _check_labels(name: str, values, batch: int) -> np.ndarray | None:
    if values is None:
        return None
    out = _to_numpy(values).astype(np.int64).reshape(-1)
    if out.shape[0] != batch:
        raise ArgumentError(f"{name} must hold one entry per image ({batch}), got {out.shape[0]}")
    return out


def _strip(images: np.ndarray) -> np.ndarray:
    """``(N, C, H, W)`` images in [0, 1] side by side as one RGBA picture ``(H, N * W + (N - 1) * gap, 4)``, the
    gaps transparent."""
    n, c, h, w = images.shape
    gap = max(1, w // 8)
    rgb = np.clip(images, 0.0, 1.0).transpose(0, 2, 3, 1)
    rgb = np.repeat(rgb, 3, axis=-1) if c == 1 else rgb
    strip = np.zeros((h, n * w + (n - 1) * gap, 4))
    for k in range(n):
        strip[:, k * (w + gap) : k * (w + gap) + w, :3] = rgb[k]
        strip[:, k * (w + gap) : k * (w + gap) + w, 3] = 1.0
    return strip


def image_rows(
    rows: Sequence[tuple[str, Tensor | np.ndarray]],
    *,
    figsize: tuple[float, float],
    titles: Sequence[Sequence[tuple[str, str]] | None] | None = None,
    label_size: float = 8,
) -> Figure:
    """A figure of rows of images, each row named on its left, with an optional title over each image: the
    galleries of the training reports and the experiments.

    Each row is drawn as one image (the images side by side, transparent gaps between them) on one axes, so a
    figure of hundreds of small images draws in a fraction of the time one axes per image takes. Rows of fewer
    images than the longest keep the images' size.

    Args:
        rows: ``(name, images)`` pairs; ``images`` ``(N, C, H, W)`` in ``[0, 1]`` (clipped), ``C`` = 1 (grey)
            or 3 (RGB), of one ``H`` and ``W`` across rows.
        figsize: the figure's size in inches.
        titles: per row from the first (rows past its end have none), None or a ``(text, colour)`` pair per
            image, drawn over it (9 points, 7 for a text longer than 12 characters).
        label_size: the font size of the row names.

    Returns:
        A :class:`~matplotlib.figure.Figure` with constrained layout, to add a title to and pass to
        :func:`save_figure`.

    Example:
        >>> images = torch.rand(4, 1, 8, 8)
        >>> fig = image_rows([("input", images), ("twice", images * 2)], figsize=(5, 3))
        >>> save_figure(fig, "runs/example/rows.png")  # doctest: +SKIP
    """
    arrays = [_to_numpy(images) for _, images in rows]
    for array in arrays:
        _check_images("images", array)
    slots = max(array.shape[0] for array in arrays)
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
    for row, (ax, (name, _), array) in enumerate(zip(axes, rows, arrays)):
        w = array.shape[-1]
        gap = max(1, w // 8)
        ax.imshow(_strip(array), interpolation="nearest")
        ax.set_xlim(-0.5, slots * (w + gap) - gap - 0.5)
        ax.set_xticks([]), ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_ylabel(name, fontsize=label_size)
        for k, (text, colour) in enumerate((titles[row] if titles and row < len(titles) else None) or ()):
            fontsize = 9 if len(text) <= 12 else 7
            ax.text(k * (w + gap) + (w - 1) / 2, -0.5, text, ha="center", va="bottom", fontsize=fontsize, color=colour)
    return fig


def _title(label: int | None, prediction: int | None, names: Sequence[str] | None = None) -> tuple[str, str]:
    """Text and colour for an input's title, classes by name where ``names`` are given: red when the prediction
    disagrees with the label."""

    def name(k: int) -> str:
        return str(names[k]) if names is not None and 0 <= k < len(names) else str(k)

    parts = [f"y={name(label)}"] if label is not None else []
    if prediction is not None:
        parts.append(f"p={name(prediction)}")
    wrong = label is not None and prediction is not None and label != prediction
    return " ".join(parts), ("red" if wrong else "black")


def plot_segmentations(
    images,
    masks,
    predictions,
    out_png: str | os.PathLike,
    *,
    class_names: Sequence[str],
    title: str | None = None,
) -> Path:
    """Draw images with their true and predicted class masks, one column per image.

    Args:
        images: ``(B, C, H, W)`` in ``[0, 1]``, ``C`` = 1 or 3.
        masks: ``(B, 1, H, W)`` true class indices.
        predictions: ``(B, 1, H, W)`` predicted class indices.
        out_png: where to write the PNG.
        class_names: ``K`` names (the legend; class colours from :func:`~capsnets.images.class_colours`).
        title: optional line above the grid (e.g. which checkpoint segmented).

    Returns:
        ``Path(out_png)``. Raises ``ValueError`` for shapes that do not match or a class beyond ``class_names``.
    """
    images, masks, predictions = _to_numpy(images), _to_numpy(masks).astype(int), _to_numpy(predictions).astype(int)
    _check_images("images", images)
    expected = (images.shape[0], 1, *images.shape[2:])
    if masks.shape != expected or predictions.shape != expected:
        raise ArgumentError(f"masks and predictions must be {expected}, got {masks.shape} and {predictions.shape}")
    if (
        max(masks.max(initial=0), predictions.max(initial=0)) >= len(class_names)
        or min(masks.min(initial=0), predictions.min(initial=0)) < 0
    ):
        raise ArgumentError(f"mask classes must lie in [0, {len(class_names)})")
    colours = class_colours(len(class_names)) / 255.0
    masks, predictions = (colours[m[:, 0]].transpose(0, 3, 1, 2) for m in (masks, predictions))
    rows = [("input", images), ("true", masks), ("predicted", predictions)]
    fig = image_rows(rows, figsize=(1.4 * images.shape[0] + 1.0, 4.6), label_size=9)
    handles = [Patch(color=colours[k], label=name) for k, name in enumerate(class_names) if k > 0][:20]
    if handles:
        fig.legend(handles=handles, loc="outside right center", fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, out_png)


def plot_reconstructions(
    images,
    reconstructions,
    out_png: str | os.PathLike,
    *,
    labels: Sequence[int] | None = None,
    predictions: Sequence[int] | None = None,
    n: int = 16,
    title: str | None = None,
    class_names: Sequence[str] | None = None,
) -> Path:
    """Draw inputs above their reconstructions, in blocks of up to 8 pairs per row.

    Args:
        images: ``(B, C, H, W)`` tensor or array in ``[0, 1]``, ``C`` = 1 (grey) or 3 (RGB).
        reconstructions: same shape as ``images`` (e.g. ``ModelOutput.reconstruction``).
        out_png: where to write the PNG.
        labels: optional ``(B,)`` true classes, shown above each input as ``y=``.
        predictions: optional ``(B,)`` predicted classes, shown as ``p=`` (red when wrong).
        n: how many of the first examples to draw (at most ``B``).
        title: optional line above the grid (e.g. which checkpoint made the reconstructions).
        class_names: the names that ``labels`` and ``predictions`` are shown by (None: their numbers).

    Shape:
        Odd rows of the grid are inputs, even rows their reconstructions, ``min(n, B)`` pairs in all.

    Returns:
        ``Path(out_png)``. Raises ``ValueError`` for bad shapes, mismatched lengths or ``n < 1``.
    """
    images, reconstructions = _to_numpy(images), _to_numpy(reconstructions)
    _check_images("images", images)
    if reconstructions.shape != images.shape:
        raise ArgumentError(
            f"reconstructions must have the shape of images {tuple(images.shape)}, got {tuple(reconstructions.shape)}"
        )
    if n < 1:
        raise ArgumentError(f"n must be >= 1, got {n}")
    labels = _check_labels("labels", labels, images.shape[0])
    predictions = _check_labels("predictions", predictions, images.shape[0])
    count = min(n, images.shape[0])
    cols = min(count, _PAIRS_PER_ROW)
    blocks = math.ceil(count / cols)
    rows, titles = [], []
    for first in range(0, count, cols):
        last = min(count, first + cols)
        rows += [("input", images[first:last]), ("recon.", reconstructions[first:last])]
        texts = [
            _title(
                None if labels is None else int(labels[k]),
                None if predictions is None else int(predictions[k]),
                class_names,
            )
            for k in range(first, last)
        ]
        titles += [texts if labels is not None or predictions is not None else None, None]
    fig = image_rows(rows, figsize=(1.2 * cols + 0.6, 2.6 * blocks), titles=titles, label_size=9)
    if title:
        fig.suptitle(_wrapped(title, fig, 9), fontsize=9)
    return save_figure(fig, out_png)


def _wrapped(text: str, fig: Figure, fontsize: float) -> str:
    """``text`` broken into lines that fit the width of ``fig`` at ``fontsize`` points (a long path too)."""
    per_line = max(20, int(0.9 * fig.get_figwidth() * 72 / (0.62 * fontsize)))
    return textwrap.fill(text, per_line, break_long_words=True, break_on_hyphens=False)


# --------------------------------------------------------------------------------------------------------
# Confusion matrix


def _check_matrix(matrix: np.ndarray, class_names: Sequence[str] | None) -> list[str]:
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
        raise ArgumentError(f"matrix must be square (K, K) with K >= 1, got shape {tuple(matrix.shape)}")
    if not np.all(np.isfinite(matrix)) or np.any(matrix < 0):
        raise ArgumentError("matrix must hold finite, non-negative counts")
    k = matrix.shape[0]
    names = [str(i) for i in range(k)] if class_names is None else [str(c) for c in class_names]
    if len(names) != k:
        raise ArgumentError(f"class_names must have {k} entries (one per row of matrix), got {len(names)}")
    return names


def _cell_text(value: float, normalize: bool) -> str:
    if normalize:
        return f"{value:.2f}"
    return f"{int(round(value))}" if float(value).is_integer() else f"{value:.1f}"


def plot_confusion_matrix(
    matrix,
    class_names: Sequence[str] | None,
    out_png: str | os.PathLike,
    *,
    normalize: bool = False,
    title: str | None = None,
) -> Path:
    """Draw a confusion matrix with the value written in every cell.

    Args:
        matrix: ``(K, K)`` tensor or array of counts; row ``i`` is the true class, column ``j`` the
            predicted class.
        class_names: ``K`` names for the axes (``None``: ``0 .. K-1``).
        out_png: where to write the PNG.
        normalize: divide each row by its sum (rows that sum to zero stay zero), so cells are recalls.
        title: the figure's title (default ``"Confusion matrix"``), e.g. naming the checkpoint evaluated; wrapped
            to the figure's width.

    Returns:
        ``Path(out_png)``. Raises ``ValueError`` for a non-square matrix, negative or non-finite
        entries, or a wrong number of class names.
    """
    values = _to_numpy(matrix)
    names = _check_matrix(values, class_names)
    if normalize:
        sums = values.sum(axis=1, keepdims=True)
        values = np.divide(values, sums, out=np.zeros_like(values), where=sums > 0)
    k = values.shape[0]
    side = max(4.0, 0.5 * k + 2.0)
    fig = Figure(figsize=(side + 1.0, side), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(values, cmap="Blues", vmin=0.0, vmax=max(float(values.max()), 1e-12))
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    threshold = values.max() / 2.0
    for i in range(k):
        for j in range(k):
            ax.text(
                j,
                i,
                _cell_text(values[i, j], normalize),
                ha="center",
                va="center",
                fontsize=max(5, 10 - k // 8),
                color="white" if values[i, j] > threshold else "black",
            )
    rotate = max(len(name) for name in names) > 3
    ax.set_xticks(range(k), names, rotation=45 if rotate else 0, ha="right" if rotate else "center")
    ax.set_yticks(range(k), names)
    ax.set(xlabel="predicted class", ylabel="true class")
    text = (title or "Confusion matrix") + (" (row-normalised)" if normalize else "")
    fig.suptitle(_wrapped(text, fig, 11), fontsize=11)  # centred on the figure, whose width it is wrapped to
    return save_figure(fig, out_png)


@torch.no_grad()
def perturbation_grid(
    model: nn.Module, image: Tensor, steps: Tensor = PERTURBATIONS, *, capsule: int | None = None
) -> tuple[Tensor, int]:
    """Decode the active class capsule of ``image`` (or class capsule ``capsule``) with each dimension moved by
    each step (Sabour et al. 2017, Sec. 5.1). ``model`` is a capsule classifier with ``encode`` (images to class
    capsules) and a ``decoder`` that takes capsules and the class to reconstruct, as
    :class:`~capsnets.models.capsnet.CapsNet`.

    Shape:
        image ``(C, H, W)`` -> grid ``(D, len(steps), C, H, W)`` and the class decoded (the winner by default).
    """
    capsules = model.encode(image[None])[0]  # (K, D)
    winner = int(capsule_length(capsules).argmax()) if capsule is None else int(capsule)
    dims, count = capsules.shape[1], len(steps)
    moved = capsules.expand(dims, count, *capsules.shape).clone()  # (D, S, K, D)
    rows = torch.arange(dims, device=image.device)
    moved[rows, :, winner, rows] += steps.to(capsules)[None, :]
    decoded = model.decoder(moved.flatten(0, 1), torch.full((dims * count,), winner, device=image.device))
    return decoded.view(dims, count, *decoded.shape[1:]), winner


def plot_perturbation_grid(
    grid: Tensor,
    winner: int,
    out_png: str | os.PathLike,
    steps: Tensor = PERTURBATIONS,
    class_names: Sequence[str] | None = None,
) -> Path:
    """Draw a :func:`perturbation_grid` as one tiled image: rows are capsule dimensions, columns the ``steps``
    (Sabour et al. 2017, Fig. 4); the title names the class by ``class_names[winner]`` where given.

    Shape:
        grid ``(D, len(steps), C, H, W)``; the first channel is drawn.
    """
    dims, count, _, height, width = grid.shape
    pad = F.pad(grid[:, :, 0], (1, 1, 1, 1), value=0.5)  # (D, S, H+2, W+2), grey separators
    mosaic = pad.permute(0, 2, 1, 3).reshape(dims * (height + 2), count * (width + 2))
    fig = Figure(figsize=(0.55 * count + 1.2, 0.55 * dims + 0.9))
    ax = fig.add_subplot(1, 1, 1)
    ax.imshow(mosaic.cpu().numpy(), cmap="gray", vmin=0, vmax=1)
    ax.set_xticks(
        [(width + 2) * (s + 0.5) for s in range(count)], [f"{v:+.2f}" for v in steps.tolist()], fontsize=6, rotation=90
    )
    ax.set_yticks([(height + 2) * (d + 0.5) for d in range(dims)], [str(d) for d in range(dims)], fontsize=6)
    ax.set_xlabel("perturbation", fontsize=8), ax.set_ylabel("dimension", fontsize=8)
    shown = class_names[winner] if class_names is not None and 0 <= winner < len(class_names) else winner
    ax.set_title(f"class {shown}: each of the {dims} dimensions perturbed", fontsize=9)
    return save_figure(fig, out_png)
