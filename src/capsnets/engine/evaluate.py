"""Evaluation on a labelled data set: accuracy, per-class accuracy, confusion matrix, mean loss.

Only ``ModelOutput.scores`` is used (``argmax`` = prediction), so any registered model works. Batches are
taken in stored order; counting is done with tensor ops on the device (one ``bincount`` per batch).
In a data-parallel run each process evaluates one contiguous shard and the counts are summed over the
group, so every process gets the whole data set's figures for 1/world_size of the work.
:func:`dice_score` scores segmentation models (per-image Dice of thresholded probabilities).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from capsnets.engine.distributed import DistContext, all_reduce_sum
from capsnets.engine.runtime import autocast, resolve_amp, resolve_device


@torch.no_grad()
def evaluate(model: nn.Module, data: Any, batch_size: int = 256, device: str | torch.device | None = None,
             amp: str = "off", criterion: nn.Module | None = None, context: DistContext | None = None, *,
             correct: Callable[[Any, Any], Tensor] | None = None) -> dict[str, Any]:
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

    Returns:
        ``accuracy`` (float), ``per_class_accuracy`` ``(K,)`` float tensor (NaN for a class without
        examples), ``confusion_matrix`` ``(K, K)`` int64 tensor (rows: true class, columns: prediction),
        ``count`` (int), and ``loss`` (mean over examples) when ``criterion`` is given. Tensors are on the CPU.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    images, targets = (data.images, data.labels) if hasattr(data, "images") else data
    device = _model_device(model) if device is None else resolve_device(device)
    dtype = resolve_amp(amp, device)
    num_classes = int(getattr(data, "num_classes", 0)) if correct is None else 0
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.long, device=device)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss * n, examples right (with ``correct``)
    was_training = model.training
    model.eval()
    context = context or DistContext()
    shard = -(-len(images) // context.world_size)  # ceil: the last process may get fewer (or none)
    first, last = min(context.rank * shard, len(images)), min((context.rank + 1) * shard, len(images))
    try:
        for start in range(first, last, batch_size):
            x = images[start:min(start + batch_size, last)].to(device, non_blocking=True)
            y = _take(targets, slice(start, min(start + batch_size, last)), device)
            with autocast(device, dtype):
                output = model(x)
                if criterion is not None:
                    sums[0] += criterion(output, x, y)[0].double() * len(x)
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
    if correct is None:
        return _summarise(confusion.view(num_classes, num_classes).cpu(), sums[0].item(), criterion is not None)
    count = len(images)
    return {"accuracy": sums[1].item() / max(count, 1), "count": count,
            **({"loss": sums[0].item() / max(count, 1)} if criterion is not None else {})}


def accuracy(model: nn.Module, images: Tensor, targets: Any, *, batch_size: int = 256,
             correct: Callable[[Any, Any], Tensor] | None = None) -> float:
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
        raise ValueError("cannot evaluate on an empty data set (0 examples)")
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


def dice_score(probabilities: Tensor, masks: Tensor, *, threshold: float = 0.5) -> Tensor:
    """Dice coefficient ``2 |P & M| / (|P| + |M|)`` of each image's thresholded prediction ``P`` and mask ``M``
    (1 where both are empty), shape ``(B, ...) -> (B,)``."""
    if probabilities.shape != masks.shape:
        raise ValueError(f"probabilities {tuple(probabilities.shape)} and masks {tuple(masks.shape)} differ in shape")
    predicted, truth = (probabilities > threshold).flatten(1), (masks > 0.5).flatten(1)
    overlap = (predicted & truth).sum(dim=1).double()
    total = (predicted.sum(dim=1) + truth.sum(dim=1)).double()
    return torch.where(total > 0, 2 * overlap / total.clamp(min=1), torch.ones_like(total))
