"""Predictions for image files: read, adapt to the model, classify (or segment), report.

:func:`read_images` turns PNG/JPEG files into the tensor a trained model takes, preparing them as the model's
training data was prepared (:func:`prepare_image`), and says what it had to adapt: a size or channel count
other than the model's, or a light background for a model trained on light strokes on black (MNIST).
:func:`predict` runs the model and returns one :class:`Prediction` per image. ``capsnets predict`` is the
command line of both.

Examples::

    >>> model = load_model("runs/capsnet_small_mnist")                          # doctest: +SKIP
    >>> images, notes = read_images(["seven.png"], model.input_size, "mnist")  # doctest: +SKIP
    >>> predict(model, images, classes=[str(k) for k in range(10)])[0].label   # doctest: +SKIP
    '7'
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor, nn

from capsnets.images import IMAGE_SUFFIXES, open_image, prepare_image
from capsnets.io import atomic_write
from capsnets.validation import ArgumentError

__all__ = ["Prediction", "collect_image_files", "predict", "read_images", "segment"]


@dataclass
class Prediction:
    """One image's prediction.

    Attributes:
        path: the image file.
        index: the predicted class index (None for segmentation).
        label: its name.
        score: a probability-like score of the prediction in ``[0, 1]``: the class capsule's length (vector
            capsules), its activation (matrix capsules), the softmax of the logits (CNNs).
        scores: every class's softmax probability, by class name (models whose scores are logits; capsule
            models give ``lengths`` instead).
        lengths: every class capsule's length (vector capsules) or activation (matrix capsules), by class name;
            empty for models without class capsules.
        adapted: what was changed to fit the image to the model (``"resized 640x480 -> 28x28"`` ...).
        mask: the written mask file (segmentation models).
        foreground: the fraction of pixels in the mask (segmentation models).
    """

    path: str
    index: int | None = None
    label: str | None = None
    score: float | None = None
    scores: dict[str, float] = field(default_factory=dict)
    lengths: dict[str, float] = field(default_factory=dict)
    adapted: list[str] = field(default_factory=list)
    mask: str | None = None
    foreground: float | None = None

    def to_dict(self) -> dict:
        """A JSON-able record (the fields that apply)."""
        return {key: value for key, value in self.__dict__.items() if value not in (None, {}, [])}


def collect_image_files(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """The image files named by ``inputs``: files as given, folders searched (recursively, sorted) for files
    with an :data:`IMAGE_SUFFIXES` suffix.

    Raises:
        FileNotFoundError: an input does not exist.
        ArgumentError: a folder holds no image, or nothing was named.
    """
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise ArgumentError(f"folder '{path}' holds no image file ({', '.join(IMAGE_SUFFIXES)})")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"'{path}' is neither an image file nor a folder")
    if not files:
        raise ArgumentError("no image given: name image files or folders of them")
    return files


def read_images(
    paths: Sequence[str | os.PathLike], input_size: Sequence[int], dataset: str | None = None, *, invert: str = "auto"
) -> tuple[Tensor, list[list[str]]]:
    """Read image files and prepare each as :func:`prepare_image` does.

    Returns:
        ``(images, notes)``: ``(N, C, H, W)`` float32 and, per image, what was adapted.

    Raises:
        ValueError: a file is not an image Pillow can read (naming it).
    """
    tensors, notes = [], []
    for path in paths:
        tensor, adapted = prepare_image(open_image(path), input_size, dataset, invert=invert)
        tensors.append(tensor)
        notes.append(adapted)
    return torch.stack(tensors), notes


@torch.no_grad()
def predict(
    model: nn.Module,
    images: Tensor,
    *,
    classes: Sequence[str] | None = None,
    paths: Sequence[str] | None = None,
    batch_size: int = 64,
) -> list[Prediction]:
    """Classify ``images`` with a classification model (in eval mode).

    Args:
        model: a model returning :class:`~capsnets.models.output.ModelOutput`.
        images: ``(N, C, H, W)`` as :func:`read_images` returns them.
        classes: the class names (default ``"0"``, ``"1"``...).
        paths: the images' files, recorded in the predictions.
        batch_size: images per forward pass.

    Shape:
        - images: ``(N, C, H, W)``; the result has ``N`` predictions.
    """
    classes = list(classes) if classes is not None else [str(k) for k in range(int(model.num_classes))]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    results: list[Prediction] = []
    try:
        for start in range(0, len(images), batch_size):
            output = model(images[start : start + batch_size].to(device))
            scores = output.scores.float()
            probs = scores.softmax(-1) if output.score_kind == "logits" else scores.clamp(0.0, 1.0)
            for row, (p, raw) in enumerate(zip(probs.cpu(), scores.cpu())):
                index = int(p.argmax())
                k = start + row
                results.append(
                    Prediction(
                        path=str(paths[k]) if paths is not None else str(k),
                        index=index,
                        label=classes[index],
                        score=float(p[index]),
                        scores=dict(zip(classes, p.tolist())) if output.score_kind == "logits" else {},
                        lengths=dict(zip(classes, raw.tolist())) if output.score_kind != "logits" else {},
                    )
                )
    finally:
        model.train(was_training)
    return results


@torch.no_grad()
def segment(
    model: nn.Module, images: Tensor, paths: Sequence[str], out: Path, *, threshold: float = 0.5
) -> list[Prediction]:
    """Segment ``images`` with a segmentation model and write each mask as ``out/<file stem>_mask.png``
    (white where the probability is above ``threshold``)."""
    device = next(model.parameters()).device
    model.eval()
    results = []
    out.mkdir(parents=True, exist_ok=True)
    for k, path in enumerate(paths):
        probabilities = model(images[k : k + 1].to(device)).probabilities[0, 0].float().cpu()
        mask = (probabilities > threshold).to(torch.uint8).mul_(255)
        target = out / f"{Path(path).stem}_mask.png"
        atomic_write(target, lambda tmp, mask=mask: Image.fromarray(mask.numpy(), mode="L").save(tmp, format="PNG"))
        results.append(Prediction(path=str(path), mask=str(target), foreground=float((mask > 0).float().mean())))
    return results
