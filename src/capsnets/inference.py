"""Predictions for images: prepare them as the model's training data was, classify (or segment), report.

:func:`predict` takes file paths, folders, Pillow images, NumPy arrays or tensors, prepares each with
:class:`~capsnets.images.ImageTransform` (size, channels, background, the smallNORB protocol), runs the model and
returns one :class:`Prediction` per image: the class, its name, its score, every class's score, what was adapted
to fit the image to the model, and whether the answer is uncertain (:func:`uncertainty`, and for a model with a
decoder :func:`reconstruction_errors` against the limits of its checkpoint's :func:`calibrate_reconstruction`); a
multi-label model (one
trained on data with several classes per image) answers with the set of classes whose probability reaches their
threshold instead. :func:`segment` writes
the masks of a segmentation model. ``capsnets predict`` is the command line of both.

Examples::

    >>> model = capsnets.create_model("capsnet_small", pretrained="mnist")   # doctest: +SKIP
    >>> result = capsnets.predict(model, "seven.png")[0]                     # doctest: +SKIP
    >>> result.label, result.uncertain                                       # doctest: +SKIP
    ('7', False)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, PngImagePlugin
from torch import Tensor, nn

from capsnets.data import dataset_info
from capsnets.files import atomic_write
from capsnets.images import IMAGE_SUFFIXES, ImageTransform, class_colours, image_files
from capsnets.models.output import ModelOutput, independent_probabilities
from capsnets.models.registry import model_task
from capsnets.outputs import check_output, png_text
from capsnets.validation import ArgumentError, number, positive_int, to_float_images

__all__ = [
    "MIN_MARGIN",
    "MIN_SCORE",
    "RECONSTRUCTION_QUANTILE",
    "Prediction",
    "calibrate_reconstruction",
    "checkpoint_class_names",
    "collect_image_files",
    "doubts",
    "mask_path",
    "overlay_path",
    "predict",
    "read_images",
    "reconstruction_errors",
    "segment",
    "uncertainty",
]

#: :func:`predict`'s defaults: the least top score of a certain answer, and its least gap to the second score.
MIN_SCORE, MIN_MARGIN = 0.7, 0.3
#: The fraction of a model's training images whose reconstruction errors :func:`calibrate_reconstruction` puts
#: inside its limits: an answer whose reconstruction is worse than all but 0.5% of them is uncertain.
RECONSTRUCTION_QUANTILE = 0.995


@dataclass
class Prediction:
    """One image's prediction.

    Attributes:
        path: the image file (None for an image given in memory).
        index: the predicted class index (None for segmentation).
        label: its name.
        score: a probability-like score of the prediction in ``[0, 1]``: the class capsule's length (vector
            capsules), its activation (matrix capsules), the softmax of the logits (CNNs).
        scores: every class's score, by class name, in ``[0, 1]``: the scores the prediction ranks, ``score``
            among them. The softmax probability for models whose scores are logits; the class capsule's length or
            activation (clamped to ``[0, 1]``) for capsule models; for a multi-label model every class's
            independent probability. Empty for segmentation.
        lengths: every class capsule's length (vector capsules) or activation (matrix capsules), by class name,
            as the model gives it; empty for models without class capsules.
        adapted: what was changed to fit the image to the model (``"resized 640x480 -> 28x28"`` ...).
        uncertain: whether the answer is uncertain (:func:`uncertainty`, or a reconstruction outside the
            checkpoint's limits); None for segmentation.
        doubt: why it is, in words (``"below 0.5"``, ``"3 close behind at 0.81"``, ``"reconstruction error
            0.095 per pixel, where 99.5% of the training images stay below 0.067"``); None when it is not.
        unsure_rule: what ``uncertain`` checks: ``"score"`` (:func:`uncertainty`), or ``"score and
            reconstruction"`` for a model with a decoder whose checkpoint records its limits
            (:func:`calibrate_reconstruction`); None for multi-label and segmentation answers.
        reconstruction_error: where ``unsure_rule`` includes the reconstruction, the reconstruction's errors
            against the prepared image (:func:`reconstruction_errors`): ``"pixel"`` and ``"relative"``.
        mask: the written mask file (segmentation models).
        foreground: the fraction of pixels not of the background, class 0 (segmentation models).
        labels: multi-label models: the classes predicted present (probability at least their threshold) with
            their probabilities, highest first; empty when none is. None for other models.
        overlay: the written overlay of the mask on the image (segmentation models).
        areas: the fraction of pixels of each class, by class name (segmentation models).
    """

    path: str | None = None
    index: int | None = None
    label: str | None = None
    score: float | None = None
    scores: dict[str, float] = field(default_factory=dict)
    lengths: dict[str, float] = field(default_factory=dict)
    adapted: list[str] = field(default_factory=list)
    uncertain: bool | None = None
    doubt: str | None = None
    unsure_rule: str | None = None
    reconstruction_error: dict[str, float] = field(default_factory=dict)
    mask: str | None = None
    foreground: float | None = None
    labels: dict[str, float] | None = None
    overlay: str | None = None
    areas: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """A JSON-able record (the fields that apply; a multi-label answer's ``labels`` even when empty)."""
        return {
            key: value
            for key, value in self.__dict__.items()
            if value is not None and (key == "labels" or (value != {} and value != []))
        }


def uncertainty(scores: Tensor, *, min_score: float, min_margin: float) -> Tensor:
    """Which answers are uncertain: the top score is below ``min_score``, or the second is within ``min_margin``
    of it.

    Works alike for capsule lengths or activations (one independent score per class: a low top score means no
    class capsule is present, two high ones mean two classes are) and for softmax probabilities (a distribution:
    a low top score or a close second means the mass is spread).

    Args:
        scores: class scores in ``[0, 1]`` (capsule lengths, activations or softmax probabilities).
        min_score: the least top score of a certain answer.
        min_margin: the least gap between the top score and the second of a certain answer.

    Shape:
        - scores: ``(N, K)``; output: ``(N,)`` bool.

    Examples::

        >>> uncertainty(torch.tensor([[0.9, 0.1], [0.3, 0.1], [0.9, 0.8]]), min_score=0.5, min_margin=0.2)
        tensor([False,  True,  True])
    """
    top = scores.topk(min(2, scores.shape[-1]), dim=-1).values
    second = top[:, 1] if top.shape[-1] > 1 else torch.zeros_like(top[:, 0])
    return (top[:, 0] < min_score) | (top[:, 0] - second < min_margin)


def reconstruction_errors(reconstruction: Tensor, images: Tensor) -> Tensor:
    """How far each reconstruction is from its image, two ways: the mean squared error per pixel, and the squared
    error relative to both images' energy, ``||r - x||^2 / (||r||^2 + ||x||^2)``.

    The first is large for images unlike any the decoder learnt (another data set, noise); the second, one minus
    the soft Dice overlap of the two images for values in ``[0, 1]``, is 1 where they share no ink, as for a blank
    image the decoder draws a faint digit on (1 where both are blank: nothing was read).

    Args:
        reconstruction: the decoder's images (:attr:`~capsnets.models.output.ModelOutput.reconstruction`).
        images: the images the model read, in ``[0, 1]``.

    Shape:
        - reconstruction, images: ``(N, C, H, W)``; output: ``(N, 2)`` float64, the per-pixel and relative
          errors.

    Examples::

        >>> images = torch.tensor([[0.0, 1.0], [0.0, 0.0]]).view(2, 1, 1, 2)
        >>> reconstruction_errors(torch.tensor([[0.0, 0.5], [0.5, 0.0]]).view(2, 1, 1, 2), images)
        tensor([[0.1250, 0.2000],
                [0.1250, 1.0000]], dtype=torch.float64)
    """
    if reconstruction.shape != images.shape:
        raise ArgumentError(
            f"reconstruction {tuple(reconstruction.shape)} and images {tuple(images.shape)} differ in shape"
        )
    # float64: the squares of float32 pixels neither underflow nor round a faint difference away to 0
    r, x = reconstruction.detach().double().flatten(1), images.detach().double().flatten(1)
    squared = (r - x).pow(2).sum(1)
    energy = r.pow(2).sum(1) + x.pow(2).sum(1)
    relative = torch.where(energy > 0, squared / energy.clamp_min(torch.finfo(torch.float64).tiny), 1.0)
    return torch.stack([squared / r.shape[1], relative], dim=1)


@torch.no_grad()
def calibrate_reconstruction(
    model: nn.Module, images: Tensor, *, quantile: float = RECONSTRUCTION_QUANTILE, batch_size: int = 64
) -> dict[str, float] | None:
    """The limits of a good reconstruction for ``model``: the ``quantile`` of :func:`reconstruction_errors` over
    ``images`` (its training images), which :func:`predict` holds every answer to.

    A capsule network's decoder redraws the image from the winning class capsule alone (Sabour et al. 2017,
    section 4.1). On images like its training data it redraws them closely; on what it never learnt (another data
    set, noise, a blank page) the redrawing is poor, however long the winning capsule.

    Args:
        model: a classification model; its output's ``reconstruction`` is used (eval mode, restored after).
        images: ``(N, C, H, W)``, float in ``[0, 1]`` or uint8, prepared as for training (no augmentation).
        quantile: the fraction of ``images`` inside the limits, in ``(0, 1]``.
        batch_size: images per forward pass.

    Returns:
        ``{"pixel": ..., "relative": ..., "quantile": ..., "images": N}`` (the two limits, then how they were
        chosen), the entry ``reconstruction_limits`` of a checkpoint's metadata; None when ``model`` has no
        decoder.

    Examples::

        >>> model = capsnets.create_model("capsnet_digits")  # 8x8 digits, with a decoder
        >>> limits = calibrate_reconstruction(model, torch.rand(8, 1, 8, 8))
        >>> sorted(limits), limits["images"]
        (['images', 'pixel', 'quantile', 'relative'], 8)
    """
    quantile = number("quantile", quantile, 0, 1, low_open=True)
    batch_size = positive_int("batch_size", batch_size)
    if images.dim() != 4 or len(images) == 0:
        raise ArgumentError(f"images must be a non-empty batch (N, C, H, W), got shape {tuple(images.shape)}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    errors = []
    try:
        for start in range(0, len(images), batch_size):
            batch = to_float_images(images[start : start + batch_size]).to(device)
            reconstruction = getattr(model(batch), "reconstruction", None)
            if reconstruction is None:
                return None
            errors.append(reconstruction_errors(reconstruction, batch).cpu())
    finally:
        model.train(was_training)
    limits = torch.cat(errors).double().quantile(quantile, dim=0)
    return {
        "pixel": round(float(limits[0]), 6),
        "relative": round(float(limits[1]), 6),
        "quantile": quantile,
        "images": len(images),
    }


def collect_image_files(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """The image files named by ``inputs``: files as given, folders searched as the training folders are
    (:func:`~capsnets.images.image_files`: recursively, sorted, files with an
    :data:`~capsnets.images.IMAGE_SUFFIXES` suffix, hidden files and folders left out).

    Raises:
        FileNotFoundError: an input does not exist.
        ArgumentError: a folder holds no image, or nothing was named.
    """
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = image_files(path)
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
    inputs, input_size: Sequence[int], dataset: str | None = None, *, invert: str = "auto"
) -> tuple[Tensor, list[list[str]]]:
    """Prepare images as :func:`predict` does, all at once.

    Args:
        inputs: what :func:`predict` takes: paths, folders, Pillow images, arrays, tensors, or a list of them.
        input_size, dataset, invert: as :class:`~capsnets.images.ImageTransform`.

    Returns:
        ``(images, notes)``: ``(N, C, H, W)`` float32 and, per image, what was adapted.

    Raises:
        ValueError: a file is not an image Pillow can read, or is larger than
            :func:`~capsnets.images.max_image_pixels` (checked before decoding); the message names it.
    """
    prepared = list(_prepared(inputs, ImageTransform(input_size, dataset, invert=invert)))
    return torch.stack([image for image, _, _ in prepared]), [notes for _, _, notes in prepared]


@torch.no_grad()
def predict(
    model: nn.Module,
    inputs,
    *,
    classes: Sequence[str] | None = None,
    dataset: str | None = None,
    batch_size: int = 64,
    min_score: float = MIN_SCORE,
    min_margin: float = MIN_MARGIN,
    invert: str = "auto",
    thresholds: Sequence[float] | None = None,
) -> list[Prediction]:
    """Classify images with a classification model (in eval mode), flagging the uncertain answers.

    Each input is prepared as the model's training data was (:class:`~capsnets.images.ImageTransform` of the
    model's ``input_size`` and data set). An answer is uncertain when its top score is below ``min_score`` or
    the second score is within ``min_margin`` of it (:func:`uncertainty`), or, for a model with a decoder whose
    checkpoint records the limits of its reconstructions (``reconstruction_limits``, from
    :func:`calibrate_reconstruction` on its training images), when the winning capsule's reconstruction of the
    image is outside them (:func:`reconstruction_errors`). docs/training.md gives the fractions of right, wrong
    and out-of-distribution answers flagged.

    Args:
        model: a classification model (its ``forward`` returns :class:`~capsnets.models.output.ModelOutput`), or
            an exported ONNX file's :class:`~capsnets.export.OnnxModel`.
        inputs: one input or a list of them: image file paths, folders (searched as
            :func:`collect_image_files`), ``PIL.Image.Image``, NumPy arrays ``(H, W)`` or ``(H, W, C)``, tensors
            ``(H, W)`` or ``(C, H, W)``, and tensors ``(N, C, H, W)``: batches already prepared, taken as they are.
        classes: the class names (default: the model's ``class_names``, else ``"0"``, ``"1"``...).
        dataset: the data set the model was trained on, which decides how images are prepared (default: the one
            its checkpoint records, else none: resize and scale only).
        batch_size: images per forward pass.
        min_score: the least top score of a certain answer, in ``[0, 1]``.
        min_margin: the least gap to the second score of a certain answer, in ``[0, 1]``.
        invert: ``"auto"``, ``"yes"`` or ``"no"``: invert light-background images for a data set of light
            strokes on black (:func:`~capsnets.images.prepare_image`).
        thresholds: each class's threshold in ``[0, 1]``, for a multi-label answer (:attr:`Prediction.labels`;
            ``min_score`` and ``min_margin`` are then unused). Default: the thresholds the model's checkpoint
            records if it was trained on multi-label data (0.5 for each class if it records none), else a
            single-label answer.

    Returns:
        One :class:`Prediction` per image, in the order given (a folder's files sorted).

    Raises:
        ArgumentError: a segmentation or other non-classification model (use :func:`segment` for masks), an
            input that is not an image, a prepared batch of another size, ``classes`` of another length.
        FileNotFoundError: a path that is neither a file nor a folder.
        ValueError: a file that is not an image Pillow can read, or that is larger than
            :func:`~capsnets.images.max_image_pixels` (checked before decoding); the message names it.

    Shape:
        - a prepared batch: ``(N, C, H, W)`` of the model's ``input_size``; the result has ``N`` predictions.

    Examples::

        >>> model = capsnets.create_model("capsnet_small", pretrained="mnist")   # doctest: +SKIP
        >>> [(p.label, p.uncertain) for p in capsnets.predict(model, ["seven.png", "noise.png"])]  # doctest: +SKIP
        [('7', False), ('2', True)]
    """
    batch_size = positive_int("batch_size", batch_size)
    min_score, min_margin = number("min_score", min_score, 0, 1), number("min_margin", min_margin, 0, 1)
    _require_task(model, "classification")
    thresholds = _thresholds(model, thresholds)
    limits = (getattr(model, "checkpoint_meta", None) or {}).get("reconstruction_limits")
    transform = ImageTransform(model.input_size, _dataset_of(model, dataset), invert=invert)
    names = list(classes) if classes is not None else getattr(model, "class_names", None)
    device = _device(model)
    was_training = model.training
    model.eval()
    results: list[Prediction] = []
    try:
        for batch in _batches(_prepared(inputs, transform), batch_size):
            images = torch.stack([image for image, _, _ in batch]).to(device)
            output = model(images)
            if not isinstance(output, ModelOutput):
                what = f"returns {type(output).__name__}, not ModelOutput"
                raise ArgumentError(_not_a_classifier(model, what, hasattr(output, "probabilities")))
            names = _class_names(names, output.scores.shape[-1])
            if thresholds is not None:
                results += _multilabel_predictions(output, names, batch, thresholds)
                continue
            errors = None
            if limits is not None and output.reconstruction is not None:
                errors = reconstruction_errors(output.reconstruction, images).cpu()
            results += _predictions(output, names, batch, min_score, min_margin, errors, limits)
    finally:
        model.train(was_training)
    return results


@torch.no_grad()
def segment(
    model: nn.Module,
    inputs,
    out: str | os.PathLike,
    *,
    dataset: str | None = None,
    threshold: float = 0.5,
    invert: str = "auto",
    mask_format: dict | None = None,
    classes: Sequence[str] | None = None,
    overwrite: bool = False,
) -> list[Prediction]:
    """Segment images with a segmentation model; write each mask as ``out/<file stem>_mask.png`` and its overlay on
    the image as ``out/<file stem>_overlay.png`` (an image given in memory is named ``image<k>``).

    A mask is written as the training masks were (``mask_format``; by default the one the model's checkpoint
    records): the class values of a grey mask (binary: 0 and 255), the palette of a palette mask, the colours of a
    colour mask. Without one, a binary model writes 0/255 and a model of K classes its class indices ``0..K-1``.
    The overlay lays each class's colour (:func:`~capsnets.images.class_colours`) at half opacity on the image,
    the background left clear. Both have the model's input size.

    Args:
        model: a segmentation model (its output has ``probabilities`` ``(B, K, H, W)``), or an exported ONNX
            file's :class:`~capsnets.export.OnnxModel`.
        inputs, dataset, invert: as :func:`predict`.
        out: the folder for the masks (created).
        threshold: binary models: the probability above which a pixel is foreground.
        mask_format: how to write the masks (``SegmentationData.mask_format``).
        classes: the class names (default: the checkpoint's, else ``0``, ``1``, ...).
        overwrite: replace existing files in ``out`` whatever they hold; without it, only masks and overlays that
            capsnets wrote are replaced (:func:`~capsnets.outputs.check_output`).

    Returns:
        One :class:`Prediction` per image with its ``mask`` and ``overlay`` files, the ``foreground`` fraction and
        each class's ``areas``.
    """
    transform = ImageTransform(model.input_size, _dataset_of(model, dataset), invert=invert)
    device = _device(model)
    meta = getattr(model, "checkpoint_meta", None) or {}
    count = max(int(getattr(model, "num_classes", 1)), 2)  # a binary model's one map is 2 classes
    mask_format = mask_format if mask_format is not None else meta.get("mask_format")
    names = [str(name) for name in classes] if classes is not None else []
    names = names if len(names) == count else checkpoint_class_names(meta, count)
    writer = _MaskWriter(count, mask_format)
    was_training = model.training
    model.eval()
    results = []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for k, (image, path, notes) in enumerate(_prepared(inputs, transform)):
            output = model(image.unsqueeze(0).to(device))
            predicted = output.predicted_classes(threshold)[0, 0].cpu().numpy()  # (H, W)
            target = check_output(mask_path(path, out, k), "mask", overwrite=overwrite)
            overlay = check_output(overlay_path(path, out, k), "overlay", overwrite=overwrite)
            atomic_write(
                target, lambda tmp, p=predicted: writer.mask(p).save(tmp, format="PNG", pnginfo=_marked("mask"))
            )
            atomic_write(
                overlay,
                lambda tmp, p=predicted, i=image: writer.overlay(i, p).save(
                    tmp, format="PNG", pnginfo=_marked("overlay")
                ),
            )
            areas = np.bincount(predicted.ravel(), minlength=count) / predicted.size
            results.append(
                Prediction(
                    path=path,
                    adapted=notes,
                    mask=str(target),
                    foreground=float(1.0 - areas[0]),
                    overlay=str(overlay),
                    areas={name: float(area) for name, area in zip(names, areas)},
                )
            )
    finally:
        model.train(was_training)
    return results


class _MaskWriter:
    """Class-index masks ``(H, W)`` as PNG images written like the training masks, and their overlays."""

    def __init__(self, count: int, mask_format: dict | None) -> None:
        mode = (mask_format or {}).get("mode")
        values = list((mask_format or {}).get("values") or [])
        self.mode = mode if mode in ("L", "P", "RGB") and len(values) == count else "L"
        if self.mode == "L" and len(values) != count:
            values = [0, 255] if count == 2 else list(range(count))
        self.values = np.asarray(values, dtype=np.uint8)  # (K,) or (K, 3)
        self.palette = (mask_format or {}).get("palette") if self.mode == "P" else None
        self.colours = class_colours(count, mask_format if self.mode != "L" else None)

    def mask(self, classes: np.ndarray) -> Image.Image:
        image = Image.fromarray(self.values[classes], mode="RGB" if self.mode == "RGB" else "L")
        if self.mode == "P":
            image.putpalette(self.palette)  # the grey image of class values becomes a palette image
        return image

    def overlay(self, image: Tensor, classes: np.ndarray) -> Image.Image:
        pixels = image.clamp(0, 1).expand(3, -1, -1).permute(1, 2, 0).numpy() * 255.0  # (H, W, 3)
        tint = self.colours[classes].astype(np.float32)
        blended = np.where((classes > 0)[..., None], 0.5 * pixels + 0.5 * tint, pixels)
        return Image.fromarray(blended.round().astype(np.uint8), mode="RGB")


def _marked(purpose: str) -> PngImagePlugin.PngInfo:
    """The text chunks of a PNG written for ``purpose`` (:func:`~capsnets.outputs.png_text`), for Pillow."""
    info = PngImagePlugin.PngInfo()
    for key, value in png_text(purpose).items():
        info.add_text(key, value)
    return info


def overlay_path(path: str | os.PathLike | None, out: str | os.PathLike, index: int) -> Path:
    """Where :func:`segment` writes the overlay of its ``index``-th image: ``out/<file stem>_overlay.png``."""
    return Path(out) / f"{Path(path).stem if path is not None else f'image{index}'}_overlay.png"


def mask_path(path: str | os.PathLike | None, out: str | os.PathLike, index: int) -> Path:
    """Where :func:`segment` writes the mask of its ``index``-th image: ``out/<file stem>_mask.png``, or
    ``out/image<index>_mask.png`` for an image given in memory (``path`` None)."""
    return Path(out) / f"{Path(path).stem if path is not None else f'image{index}'}_mask.png"


def _prepared(inputs, transform: ImageTransform) -> Iterator[tuple[Tensor, str | None, list[str]]]:
    """Each image of ``inputs`` as ``(tensor (C, H, W), its file or None, what was adapted)``, in order."""
    items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if not items:
        raise ArgumentError("no image given: pass image files, folders, PIL images, arrays or tensors", "inputs")
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            for path in collect_image_files([item]):
                image, notes = transform.prepare(path)
                yield image, str(path), notes
        elif isinstance(item, Tensor) and item.dim() == 4:
            yield from ((image, None, []) for image in _prepared_batch(item, transform.input_size))
        elif isinstance(item, (Tensor, np.ndarray, Image.Image)):
            image, notes = transform.prepare(item)
            yield image, None, notes
        else:
            raise ArgumentError(
                f"cannot read an image from {type(item).__name__}: give file paths, folders, PIL images, "
                "NumPy arrays or tensors (or a list of them)",
                "inputs",
            )


def _prepared_batch(images: Tensor, input_size: tuple[int, int, int]) -> Tensor:
    """A batch ``(N, C, H, W)`` given as prepared: checked against the model's size, as float32 on the CPU."""
    if tuple(images.shape[1:]) != input_size or not (images.is_floating_point() or images.dtype == torch.uint8):
        raise ArgumentError(
            f"a 4-dimensional tensor is taken as a prepared batch (N, {', '.join(map(str, input_size))}) of "
            f"float or uint8 images; got shape {tuple(images.shape)} of {images.dtype}. Give images of another "
            "size one by one, (C, H, W), to have them prepared",
            "inputs",
        )
    return images.detach().cpu().float().div(255.0) if images.dtype == torch.uint8 else images.detach().cpu().float()


def _batches(items: Iterable, size: int) -> Iterator[list]:
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _predictions(
    output: ModelOutput,
    names: list[str],
    batch: list,
    min_score: float,
    min_margin: float,
    errors: Tensor | None = None,
    limits: dict | None = None,
) -> list[Prediction]:
    """The predictions of one batch: scores as probabilities (softmax of logits, capsule scores clamped), with the
    capsule models' raw scores as ``lengths``; ``errors`` ``(B, 2)`` the reconstructions' errors
    (:func:`reconstruction_errors`) held to ``limits`` (:func:`calibrate_reconstruction`), or None."""
    raw = output.scores.float().cpu()
    logits = output.score_kind == "logits"
    probs = raw.softmax(-1) if logits else raw.clamp(0.0, 1.0)
    results = []
    for k, (p, row, (_, path, notes)) in enumerate(zip(probs, raw, batch)):
        index = int(p.argmax())
        measured = {} if errors is None else {"pixel": float(errors[k, 0]), "relative": float(errors[k, 1])}
        found = doubts(p, names, min_score=min_score, min_margin=min_margin, errors=measured or None, limits=limits)
        results.append(
            Prediction(
                path=path,
                index=index,
                label=names[index],
                score=float(p[index]),
                scores=dict(zip(names, p.tolist())),
                lengths=dict(zip(names, row.tolist())) if not logits else {},
                adapted=notes,
                uncertain=bool(found),
                doubt="; ".join(found) or None,
                unsure_rule="score" if errors is None else "score and reconstruction",
                reconstruction_error=measured,
            )
        )
    return results


def doubts(
    scores: Tensor,
    names: Sequence[str],
    *,
    min_score: float = MIN_SCORE,
    min_margin: float = MIN_MARGIN,
    errors: dict[str, float] | None = None,
    limits: dict | None = None,
) -> list[str]:
    """Why one answer is uncertain, in words; empty when it is not: the score rule (:func:`uncertainty`), then
    the winning capsule's reconstruction errors held to the limits of a good one.

    Args:
        scores: ``(K,)`` class scores in ``[0, 1]``; the answer is the highest.
        names: the ``K`` class names.
        min_score, min_margin: as :func:`uncertainty`.
        errors: the reconstruction's ``{"pixel": ..., "relative": ...}`` (:func:`reconstruction_errors`), or None.
        limits: the checkpoint's ``reconstruction_limits`` (:func:`calibrate_reconstruction`); with ``errors``.

    Examples::

        >>> doubts(torch.tensor([0.9, 0.1]), ["a", "b"]), doubts(torch.tensor([0.9, 0.8]), ["a", "b"])
        ([], ['b close behind at 0.800'])
        >>> limits = {"pixel": 0.07, "relative": 0.4, "quantile": 0.995}
        >>> doubts(torch.tensor([0.9, 0.1]), ["a", "b"], errors={"pixel": 0.01, "relative": 1.0}, limits=limits)
        ['reconstruction unlike the image: relative error 1.00, where 99.5% of the training images stay below 0.40']
    """
    found = []
    if bool(uncertainty(scores[None], min_score=min_score, min_margin=min_margin)):
        found.append(_doubt(scores, int(scores.argmax()), min_score, min_margin, list(names)))
    if errors is None or limits is None:
        return found
    below = f"where {100 * float(limits['quantile']):g}% of the training images stay below"
    if errors["pixel"] > limits["pixel"]:
        found.append(f"reconstruction error {errors['pixel']:.3f} per pixel, {below} {limits['pixel']:.3f}")
    if errors["relative"] > limits["relative"]:
        found.append(
            f"reconstruction unlike the image: relative error {errors['relative']:.2f}, {below} "
            f"{limits['relative']:.2f}"
        )
    return found


def _multilabel_predictions(output: ModelOutput, names: list[str], batch: list, thresholds: Tensor) -> list[Prediction]:
    """The multi-label predictions of one batch: each class's independent probability against its threshold."""
    probs = independent_probabilities(output).cpu()
    if thresholds.shape != probs.shape[1:]:
        raise ArgumentError(f"thresholds has {len(thresholds)} values, but the model has {probs.shape[1]} classes")
    results = []
    for p, (_, path, notes) in zip(probs, batch):
        present = sorted((k for k in range(len(names)) if p[k] >= thresholds[k]), key=lambda k: -float(p[k]))
        results.append(
            Prediction(
                path=path,
                scores=dict(zip(names, p.tolist())),
                labels={names[k]: float(p[k]) for k in present},
                adapted=notes,
            )
        )
    return results


def _thresholds(model: nn.Module, thresholds: Sequence[float] | None) -> Tensor | None:
    """The multi-label thresholds to use: as given, else the model's checkpoint's; None for a single-label answer."""
    meta = getattr(model, "checkpoint_meta", None) or {}
    if thresholds is None and meta.get("multilabel"):
        recorded = meta.get("thresholds")
        thresholds = recorded if recorded is not None else [0.5] * int(model.num_classes)
    if thresholds is None:
        return None
    values = [number("thresholds", value, 0, 1) for value in thresholds]
    return torch.tensor(values, dtype=torch.float32)


def _doubt(probs: Tensor, index: int, min_score: float, min_margin: float, names: list[str]) -> str:
    """Why an answer is uncertain, in words."""
    score = float(probs[index])
    if score < min_score:
        return f"below {min_score:g}"
    others = probs.clone()
    others[index] = -1.0
    second = int(others.argmax())
    return f"{names[second]} close behind at {float(probs[second]):.3f}"


def checkpoint_class_names(meta: dict, count: int) -> list[str]:
    """The names of a model's ``count`` classes: those its checkpoint's metadata ``meta`` records, else those of
    the data set it names (``meta["dataset"]``), else ``"0"``, ``"1"``...

    Examples::

        >>> checkpoint_class_names({"classes": ["cat", "dog"]}, 2), checkpoint_class_names({}, 3)
        (['cat', 'dog'], ['0', '1', '2'])
    """
    recorded = meta.get("classes")
    if isinstance(recorded, list) and len(recorded) == count:
        return [str(name) for name in recorded]
    try:
        names = list(dataset_info(meta.get("dataset") or "").classes)
    except (ValueError, KeyError, OSError):
        names = []
    return [str(name) for name in names] if len(names) == count else [str(k) for k in range(count)]


def _class_names(names: Sequence[str] | None, count: int) -> list[str]:
    if names is None:
        return [str(k) for k in range(count)]
    names = [str(name) for name in names]
    if len(names) != count:
        raise ArgumentError(f"classes has {len(names)} names, but the model has {count} classes", "classes")
    return names


def _device(model: nn.Module) -> torch.device:
    """Where ``model``'s inputs go: the device of its parameters; the CPU for a model without parameters (an
    :class:`~capsnets.export.OnnxModel`, which onnxruntime runs on the CPU)."""
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _dataset_of(model: nn.Module, dataset: str | None) -> str | None:
    """``dataset``, else the data set the model's checkpoint records, in canonical form (``fashion_mnist``)."""
    if dataset is None:
        dataset = (getattr(model, "checkpoint_meta", None) or {}).get("dataset")
    return dataset.lower().replace("-", "_") if isinstance(dataset, str) else None


def _require_task(model: nn.Module, task: str) -> None:
    name = getattr(model, "model_name", None)
    try:
        registered = model_task(name) if isinstance(name, str) else None
    except (ValueError, KeyError):  # not a registered name: judged by its output
        registered = None
    if registered is not None and registered != task:
        raise ArgumentError(_not_a_classifier(model, f"is for {registered}", registered == "segmentation"))


def _not_a_classifier(model: nn.Module, what: str, segmentation: bool) -> str:
    name = getattr(model, "model_name", type(model).__name__)
    hint = "; capsnets.inference.segment(model, inputs, out) writes its masks" if segmentation else ""
    return f"model {name!r} {what}; capsnets.predict classifies images{hint}"
