"""Evaluation on a labelled data set: accuracy, per-class accuracy, confusion matrix, mean loss.

Only ``ModelOutput.scores`` is used (``argmax`` = prediction), so any registered model works. Batches are
taken in stored order; counting is done with tensor ops on the device (one ``bincount`` per batch).
In a data-parallel run each process evaluates one contiguous shard and the counts are summed over the
group, so every process gets the whole data set's figures for 1/world_size of the work.

Multi-label data (``(N, K)`` multi-hot targets) is scored with each class's independent probability
(:func:`~capsnets.models.output.independent_probabilities`) by :func:`multilabel_metrics`: mean average precision
(macro over the classes with a positive example; the area under the precision-recall steps, tied scores taken
together, as scikit-learn's ``average_precision_score``), micro and macro F1 and exact-set accuracy at per-class
thresholds, which :func:`f1_thresholds` chooses to maximise each class's F1 on other data (the training split).
:func:`dice_score` scores segmentation models (per-image Dice of thresholded probabilities);
:func:`evaluate_segmentation` counts a data set's pixels into a confusion matrix and :func:`segmentation_metrics`
gives each class's Dice and IoU from it.

:class:`Ensemble` makes several trained models one, scoring each image with the mean of their scores (class
capsule lengths): Sabour, Frosst & Hinton (2017), Sec. 7, report CIFAR-10 for an ensemble of 7 models, which the
authors' released code evaluates by summing their lengths (Sarasra/models, ``research/capsules/experiment.py``,
``evaluate_ensemble``: the same predictions as the mean). :func:`load_ensemble` builds one from checkpoints,
after checking that they were trained on the same data set and classes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from capsnets.checkpoints import load_checkpoint
from capsnets.data import dataset_info
from capsnets.data.image_folder import FOLDER_PREFIX
from capsnets.engine.distributed import DistContext, all_reduce_sum
from capsnets.engine.runtime import autocast, resolve_amp, resolve_device
from capsnets.models.hub import model_from_checkpoint
from capsnets.models.output import ModelOutput, independent_probabilities
from capsnets.validation import ArgumentError

#: The threshold of a class that :func:`f1_thresholds` has no positive example to choose it from.
DEFAULT_THRESHOLD = 0.5
#: Examples per forward pass when none is given: on a CPU, the fastest or near it for every registered model
#: (a batch of 256 outgrows the caches and is slower); on a GPU, pass a larger one.
EVAL_BATCH_SIZE = 64


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Any,
    batch_size: int = EVAL_BATCH_SIZE,
    device: str | torch.device | None = None,
    amp: str = "off",
    criterion: nn.Module | None = None,
    context: DistContext | None = None,
    *,
    correct: Callable[[Any, Any], Tensor] | None = None,
    thresholds: Tensor | Sequence[float] | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` on every example of ``data`` in eval mode (the model's mode is restored).

    Args:
        model: a model returning ``ModelOutput`` from ``model(images)``.
        data: a ``TensorData`` (or anything with ``images`` and ``labels``), or an ``(images, targets)`` pair
            whose targets are a tensor or a tuple of tensors batched with the images.
        batch_size: examples per forward pass.
        device: where to run (None: where the model's parameters are); the data is moved there batch by batch.
        amp: ``"auto"``, ``"bf16"`` or ``"off"`` (see :func:`~capsnets.engine.runtime.resolve_amp`).
        criterion: optional loss ``criterion(output, images, labels) -> (loss, parts)``; adds ``"loss"``.
        context: the data-parallel group (see :mod:`capsnets.engine.distributed`): each process evaluates
            its shard and the counts are summed; every process must call this. None: evaluate alone.
        correct: ``correct(output, targets) -> (B,) bool`` for targets that are not class labels (e.g. two
            labels per image); then only ``accuracy``, ``count`` (and ``loss``) are returned.
        thresholds: multi-label data: each class's threshold (``(K,)``; None: 0.5 for every class).

    Returns:
        ``accuracy`` (float), ``per_class_accuracy`` ``(K,)`` float tensor (NaN for a class without
        examples), ``confusion_matrix`` ``(K, K)`` int64 tensor (rows: true class, columns: prediction),
        ``count`` (int), and ``loss`` (mean over examples) when ``criterion`` is given. Tensors are on the CPU.
        For multi-hot targets ``(N, K)``: :func:`multilabel_metrics` of the probabilities (``accuracy`` is the
        exact-set accuracy), and ``loss``.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"batch_size must be a positive integer, got {batch_size!r}")
    images, targets = (data.images, data.labels) if hasattr(data, "images") else data
    device = _model_device(model) if device is None else resolve_device(device)
    dtype = resolve_amp(amp, device)
    num_classes = int(getattr(data, "num_classes", 0)) if correct is None else 0
    multilabel = correct is None and isinstance(targets, Tensor) and targets.dim() == 2
    if multilabel:  # every example's probabilities, this process's shard filled in and summed over the group
        probabilities = torch.zeros(targets.shape, dtype=torch.float32, device=device)
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.long, device=device)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss * n, examples right (with ``correct``)
    was_training = model.training
    model.eval()
    context = context or DistContext()
    shard = -(-len(images) // context.world_size)  # ceil: the last process may get fewer (or none)
    first, last = min(context.rank * shard, len(images)), min((context.rank + 1) * shard, len(images))
    try:
        for start in range(first, last, batch_size):
            x = images[start : min(start + batch_size, last)].to(device, non_blocking=True)
            y = _take(targets, slice(start, min(start + batch_size, last)), device)
            with autocast(device, dtype):
                output = model(x)
                if criterion is not None:
                    sums[0] += criterion(output, x, y)[0].double() * len(x)
            if multilabel:
                probabilities[start : start + len(x)] = independent_probabilities(output)
                continue
            if correct is not None:
                sums[1] += correct(output, y).sum()
                continue
            if not num_classes:  # a pair without num_classes: the model's
                num_classes = output.scores.shape[-1]
                confusion = torch.zeros(num_classes * num_classes, dtype=torch.long, device=device)
            confusion += torch.bincount(y * num_classes + output.scores.argmax(dim=-1), minlength=num_classes**2)
    finally:
        model.train(was_training)
    all_reduce_sum(confusion, context)
    all_reduce_sum(sums, context)
    if multilabel:
        all_reduce_sum(probabilities, context)
        results = multilabel_metrics(probabilities.cpu(), targets.cpu(), thresholds)
        return results | ({"loss": sums[0].item() / len(images)} if criterion is not None else {})
    if correct is None:
        return _summarise(confusion.view(num_classes, num_classes).cpu(), sums[0].item(), criterion is not None)
    count = len(images)
    return {
        "accuracy": sums[1].item() / max(count, 1),
        "count": count,
        **({"loss": sums[0].item() / max(count, 1)} if criterion is not None else {}),
    }


def accuracy(
    model: nn.Module,
    images: Tensor,
    targets: Any,
    *,
    batch_size: int = EVAL_BATCH_SIZE,
    correct: Callable[[Any, Any], Tensor] | None = None,
) -> float:
    """The fraction of ``(images, targets)`` that ``model`` gets right (:func:`evaluate`'s ``accuracy``)."""
    return evaluate(model, (images, targets), batch_size, correct=correct)["accuracy"]


def _take(targets: Any, index: slice, device: torch.device) -> Any:
    if isinstance(targets, tuple):
        return tuple(t[index].to(device, non_blocking=True) for t in targets)
    return targets[index].to(device, non_blocking=True)


def _model_device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _summarise(confusion: Tensor, loss_sum: float, with_loss: bool) -> dict[str, Any]:
    """Accuracy figures from a ``(K, K)`` confusion matrix."""
    count = int(confusion.sum())
    if count == 0:
        raise ArgumentError("cannot evaluate on an empty data set (0 examples)")
    per_class_total = confusion.sum(dim=1).double()
    results = {
        "accuracy": confusion.diag().sum().item() / count,
        "per_class_accuracy": confusion.diag().double() / per_class_total,  # NaN where a class is absent
        "confusion_matrix": confusion,
        "count": count,
    }
    if with_loss:
        results["loss"] = loss_sum / count
    return results


def average_precision(probabilities: Tensor, targets: Tensor) -> Tensor:
    """Each class's average precision: ``sum_n (R_n - R_{n-1}) P_n`` over the distinct scores taken as thresholds
    from the highest down, with ``P_n`` and ``R_n`` the precision and recall of predicting the examples scored at
    least the ``n``-th (examples of tied scores enter together). NaN for a class without a positive example.

    Shape:
        probabilities ``(N, K)``, targets ``(N, K)`` multi-hot -> ``(K,)`` float64.

    Examples::

        >>> average_precision(torch.tensor([[0.9], [0.8], [0.8], [0.1]]), torch.tensor([[1.0], [0.0], [1.0], [1.0]]))
        tensor([0.8056], dtype=torch.float64)
    """
    _check_multilabel(probabilities, targets)
    scores, order = probabilities.double().sort(dim=0, descending=True, stable=True)  # (N, K)
    hits = (targets > 0.5).double().gather(0, order)  # (N, K) positives in score order
    found = hits.cumsum(dim=0)  # true positives at each cut
    ends = torch.ones_like(hits, dtype=torch.bool)  # the last example of each group of tied scores
    ends[:-1] = scores[1:] != scores[:-1]
    found_at_ends = torch.where(ends, found, torch.zeros_like(found))
    before = torch.cat([torch.zeros_like(found[:1]), found_at_ends.cummax(dim=0).values[:-1]])  # at the last cut
    ranks = torch.arange(1, len(hits) + 1, dtype=torch.float64).unsqueeze(1)  # examples predicted at each cut
    precision_steps = torch.where(ends, (found - before) * found / ranks, torch.zeros_like(found))
    positives = hits.sum(dim=0)
    return torch.where(positives > 0, precision_steps.sum(dim=0) / positives.clamp(min=1), torch.nan)


def f1_thresholds(probabilities: Tensor, targets: Tensor) -> Tensor:
    """Each class's threshold that maximises its F1 score on these examples (predicted present: probability at
    least the threshold).

    Among the cuts between distinct scores, the one of highest F1 (the highest such cut among equals) is taken,
    and the threshold is put halfway between the lowest score kept and the next lower score (the lowest score
    itself if every example is kept), so that nearby scores of other data fall on the side of their neighbours.
    A class without a positive example gets ``DEFAULT_THRESHOLD`` (0.5).

    Shape:
        probabilities ``(N, K)``, targets ``(N, K)`` multi-hot -> ``(K,)`` float32.

    Examples::

        >>> f1_thresholds(torch.tensor([[0.9], [0.8], [0.3], [0.1]]), torch.tensor([[1.0], [1.0], [0.0], [0.0]]))
        tensor([0.5500])
    """
    _check_multilabel(probabilities, targets)
    scores, order = probabilities.double().sort(dim=0, descending=True, stable=True)  # (N, K)
    hits = (targets > 0.5).double().gather(0, order)
    found, positives = hits.cumsum(dim=0), hits.sum(dim=0)
    ranks = torch.arange(1, len(hits) + 1, dtype=torch.float64).unsqueeze(1)
    ends = torch.ones_like(hits, dtype=torch.bool)
    ends[:-1] = scores[1:] != scores[:-1]
    f1 = torch.where(ends, 2 * found / (positives + ranks), torch.full_like(found, -1.0))  # only whole groups
    cut = f1.argmax(dim=0)  # (K,) the first (highest) of the best cuts
    kept = scores.gather(0, cut.unsqueeze(0))[0]
    below = scores.gather(0, (cut + 1).clamp(max=len(scores) - 1).unsqueeze(0))[0]
    threshold = torch.where(cut + 1 < len(scores), (kept + below) / 2, kept)
    return torch.where(positives > 0, threshold, torch.full_like(threshold, DEFAULT_THRESHOLD)).float()


def multilabel_metrics(
    probabilities: Tensor, targets: Tensor, thresholds: Tensor | Sequence[float] | None = None
) -> dict[str, Any]:
    """Multi-label scores of per-class probabilities against multi-hot targets.

    Args:
        probabilities: each class's probability of being present.
        targets: 1 where the class is present.
        thresholds: each class's threshold (present: probability at least it); None: 0.5 for every class.

    Returns:
        ``mAP`` (mean of ``average_precision`` over the classes with a positive example; NaN if none has),
        ``average_precision`` ``(K,)`` (:func:`average_precision`), ``micro_f1`` (F1 of all decisions pooled),
        ``macro_f1`` (mean of ``per_class_f1`` over the classes with a positive example or a positive
        prediction), ``per_class_f1`` ``(K,)`` (NaN where a class has neither), ``exact_match`` (the fraction of
        examples whose predicted set of classes is exactly the true set), ``accuracy`` (the same),
        ``thresholds`` ``(K,)`` (as used), ``f1_thresholds`` ``(K,)`` (:func:`f1_thresholds` of these examples,
        to apply to other data) and ``count``.

    Shape:
        probabilities ``(N, K)``, targets ``(N, K)``, thresholds ``(K,)``.
    """
    _check_multilabel(probabilities, targets)
    count, classes = probabilities.shape
    if count == 0:
        raise ArgumentError("cannot evaluate on an empty data set (0 examples)")
    thresholds = torch.full((classes,), 0.5) if thresholds is None else torch.as_tensor(thresholds).float().cpu()
    if thresholds.shape != (classes,) or not bool(((thresholds >= 0) & (thresholds <= 1)).all()):
        raise ArgumentError(f"thresholds must be {classes} numbers in [0, 1], got {thresholds.tolist()}")
    truth, predicted = targets.cpu() > 0.5, probabilities.cpu() >= thresholds
    tp = (truth & predicted).sum(dim=0).double()
    fp, fn = (~truth & predicted).sum(dim=0).double(), (truth & ~predicted).sum(dim=0).double()
    per_class = torch.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn).clamp(min=1), torch.nan)
    pooled = 2 * tp.sum() + fp.sum() + fn.sum()
    ap = average_precision(probabilities.cpu(), targets.cpu())
    exact = (truth == predicted).all(dim=1).double().mean().item()
    return {
        "mAP": ap.nanmean().item(),
        "average_precision": ap,
        "micro_f1": (2 * tp.sum() / pooled).item() if pooled > 0 else float("nan"),
        "macro_f1": per_class.nanmean().item(),
        "per_class_f1": per_class,
        "exact_match": exact,
        "accuracy": exact,
        "thresholds": thresholds,
        "f1_thresholds": f1_thresholds(probabilities.cpu(), targets.cpu()),
        "count": count,
    }


def _check_multilabel(probabilities: Tensor, targets: Tensor) -> None:
    if probabilities.dim() != 2 or probabilities.shape != targets.shape:
        raise ArgumentError(
            f"probabilities and targets must both be (N, K), got {tuple(probabilities.shape)} and "
            f"{tuple(targets.shape)}"
        )


def dice_score(probabilities: Tensor, masks: Tensor, *, threshold: float = 0.5) -> Tensor:
    """Dice coefficient ``2 |P & M| / (|P| + |M|)`` of each image's thresholded prediction ``P`` and mask ``M``
    (1 where both are empty), shape ``(B, ...) -> (B,)``."""
    if probabilities.shape != masks.shape:
        raise ArgumentError(
            f"probabilities {tuple(probabilities.shape)} and masks {tuple(masks.shape)} differ in shape"
        )
    predicted, truth = (probabilities > threshold).flatten(1), (masks > 0.5).flatten(1)
    overlap = (predicted & truth).sum(dim=1).double()
    total = (predicted.sum(dim=1) + truth.sum(dim=1)).double()
    return torch.where(total > 0, 2 * overlap / total.clamp(min=1), torch.ones_like(total))


@torch.no_grad()
def evaluate_segmentation(
    model: nn.Module,
    data: Any,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    amp: str = "off",
    criterion: nn.Module | None = None,
    context: DistContext | None = None,
) -> dict[str, Any]:
    """Score a segmentation model on every image of ``data`` in eval mode, pixel by pixel (the model's mode is
    restored): the classes of all pixels are counted into one confusion matrix, as :func:`evaluate` counts
    images (each process of a data-parallel group its shard, summed over the group).

    Args:
        model: returns a :class:`~capsnets.models.segcaps.SegmentationOutput` from ``model(images)``; a pixel's
            class is :meth:`~capsnets.models.segcaps.SegmentationOutput.predicted_classes`.
        data: a :class:`~capsnets.data.segmentation.SegmentationData` (``images``, ``masks`` of class indices,
            ``num_classes``).
        batch_size, device, amp, criterion, context: as for :func:`evaluate` (``criterion`` takes the masks).

    Returns:
        :func:`segmentation_metrics` of the pixels, ``count`` (images) and ``loss`` (mean over images) when
        ``criterion`` is given.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"batch_size must be a positive integer, got {batch_size!r}")
    device = _model_device(model) if device is None else resolve_device(device)
    dtype, classes = resolve_amp(amp, device), int(data.num_classes)
    confusion = torch.zeros(classes * classes, dtype=torch.long, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    context, count = context or DistContext(), len(data.images)
    shard = -(-count // context.world_size)
    first, last = min(context.rank * shard, count), min((context.rank + 1) * shard, count)
    was_training = model.training
    model.eval()
    try:
        for start in range(first, last, batch_size):
            x = data.images[start : min(start + batch_size, last)].to(device, non_blocking=True)
            y = data.masks[start : min(start + batch_size, last)].to(device, non_blocking=True).long()  # (B, 1, H, W)
            with autocast(device, dtype):
                output = model(x)
                if criterion is not None:
                    loss_sum += criterion(output, x, y)[0].double() * len(x)
            predicted = output.predicted_classes()  # (B, 1, H, W)
            confusion += torch.bincount((y * classes + predicted).flatten(), minlength=classes * classes)
    finally:
        model.train(was_training)
    all_reduce_sum(confusion, context)
    all_reduce_sum(loss_sum, context)
    if count == 0:
        raise ArgumentError("cannot evaluate on an empty data set (0 examples)")
    results = segmentation_metrics(confusion.view(classes, classes).cpu())
    results["count"] = count
    if criterion is not None:
        results["loss"] = loss_sum.item() / count
    return results


def segmentation_metrics(confusion: Tensor) -> dict[str, Any]:
    """Per-class Dice and IoU (Jaccard) from a pixel confusion matrix, and their means.

    For class ``k`` with ``TP`` its pixels predicted as ``k``, ``FP`` other pixels predicted as ``k`` and ``FN`` its
    pixels predicted as another class: Dice ``2 TP / (2 TP + FP + FN)``, IoU ``TP / (TP + FP + FN)``; NaN for a
    class neither present nor predicted. Class 0 is the background: the means are over the other classes (NaN
    left out), so that a large background does not make a poor segmentation look good.

    Args:
        confusion: ``(K, K)`` pixel counts, rows the true class, columns the predicted one (``K >= 2``).

    Returns:
        ``dice`` and ``iou`` ``(K,)`` float64, ``mean_dice`` and ``mean_iou`` (floats), ``pixel_accuracy``, and
        ``confusion_matrix`` (the input, int64).

    Examples::

        >>> metrics = segmentation_metrics(torch.tensor([[6, 1], [1, 2]]))
        >>> metrics["dice"].tolist(), metrics["mean_iou"]
        ([0.8571428571428571, 0.6666666666666666], 0.5)
    """
    if confusion.dim() != 2 or confusion.shape[0] != confusion.shape[1] or confusion.shape[0] < 2:
        raise ArgumentError(f"confusion must be a (K, K) matrix with K >= 2, got {tuple(confusion.shape)}")
    confusion = confusion.long()
    hits = confusion.diag().double()
    union = confusion.sum(dim=0).double() + confusion.sum(dim=1).double() - hits  # TP + FP + FN
    dice = torch.where(union > 0, 2 * hits / (union + hits).clamp(min=1), torch.nan)
    iou = torch.where(union > 0, hits / union.clamp(min=1), torch.nan)
    return {
        "dice": dice,
        "iou": iou,
        "mean_dice": dice[1:].nanmean().item(),
        "mean_iou": iou[1:].nanmean().item(),
        "pixel_accuracy": hits.sum().item() / max(int(confusion.sum()), 1),
        "confusion_matrix": confusion,
    }


class Ensemble(nn.Module):
    """Several trained classifiers as one model whose scores are the mean of theirs.

    Args:
        members: models with the same ``num_classes`` and ``input_size``, returning :class:`ModelOutput` of one
            ``score_kind`` (lengths are averaged with lengths, never with logits). The ensemble's ``class_names``
            are the first member's.

    Shape:
        - images: ``(B, C, H, W)``
        - output: :class:`ModelOutput` with ``scores`` ``(B, num_classes)`` (float32, the members' mean) and
          their ``score_kind``; no capsules, no reconstruction.

    Examples::

        >>> import capsnets
        >>> ensemble = Ensemble([capsnets.create_model("capsnet_digits") for _ in range(2)]).eval()
        >>> ensemble(torch.rand(4, 1, 8, 8)).scores.shape
        torch.Size([4, 10])
    """

    def __init__(self, members: Iterable[nn.Module]) -> None:
        super().__init__()
        members = list(members)
        if not members:
            raise ArgumentError("an ensemble needs at least one model")
        for name in ("num_classes", "input_size"):
            values = [
                tuple(v) if isinstance(v, (list, tuple)) else v for v in (getattr(m, name, None) for m in members)
            ]
            if any(value != values[0] for value in values):
                raise ArgumentError(f"the models of an ensemble must agree on {name}; got {values}")
        self.members = nn.ModuleList(members)
        self.num_classes, self.input_size = members[0].num_classes, tuple(members[0].input_size)
        self.class_names = getattr(members[0], "class_names", None)  # load_ensemble checks that they agree

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        outputs = [member(images) for member in self.members]
        kinds = sorted({output.score_kind for output in outputs})
        if len(kinds) > 1:
            raise ArgumentError(
                f"the models of an ensemble score in different units ({', '.join(kinds)}); their mean "
                f"would mean nothing: ensemble models of one kind"
            )
        scores = torch.stack([output.scores.float() for output in outputs]).mean(dim=0)  # (M, B, K) -> (B, K)
        return ModelOutput(scores, kinds[0])


def load_ensemble(paths: Sequence[str | Path], device: str | torch.device = "cpu"):
    """The models of several checkpoints as an :class:`Ensemble` (in eval mode), and their checkpoints.

    Args:
        paths: run directories (their best checkpoints) or ``.safetensors`` files, at least one; no checkpoint twice.
        device: where the models go.

    Raises:
        ValueError: a checkpoint given twice, one that does not record its data set, or checkpoints trained on
            different data sets, classes or image sizes (the message names the two that differ).
    """
    checkpoints = [load_checkpoint(path) for path in paths]
    loaded = [(model_from_checkpoint(checkpoint, device), checkpoint) for checkpoint in checkpoints]
    if not loaded:
        raise ArgumentError("an ensemble needs at least one checkpoint")
    seen: dict[Path, str] = {}
    for (_, checkpoint), given in zip(loaded, paths):
        where = checkpoint.path.resolve()
        if where in seen:
            raise ArgumentError(
                f"checkpoint '{checkpoint.path}' is given twice ({seen[where]!r} and {str(given)!r}); "
                f"an ensemble counts each model once"
            )
        seen[where] = str(given)
    first_model, first = loaded[0]
    for model, checkpoint in loaded:
        if checkpoint.meta.get("dataset") is None:
            raise ArgumentError(
                f"checkpoint '{checkpoint.path}' does not record the data set it was trained on, so it "
                f"cannot be checked against the other models of the ensemble"
            )
        checks = [
            ("data set", _dataset_name(first.meta["dataset"]), _dataset_name(checkpoint.meta["dataset"])),
            ("number of classes", int(first_model.num_classes), int(model.num_classes)),
            ("input size", tuple(first_model.input_size), tuple(model.input_size)),
        ]
        names = first.meta.get("classes"), checkpoint.meta.get("classes")
        if all(isinstance(recorded, list) for recorded in names):  # where both runs recorded their class names
            checks.append(("classes", *names))
        for what, theirs, mine in checks:
            if mine != theirs:
                raise ArgumentError(
                    f"the models of an ensemble must be trained on the same data: '{first.path}' has "
                    f"{what} {theirs!r} and '{checkpoint.path}' has {mine!r}"
                )
    return Ensemble(model for model, _ in loaded).eval(), [checkpoint for _, checkpoint in loaded]


def _dataset_name(name: str) -> str:
    """A recorded data set's canonical name (``"CIFAR-10"`` and ``"cifar10"`` are one data set); a folder's as given."""
    return name if name.startswith(FOLDER_PREFIX) else dataset_info(name).name
