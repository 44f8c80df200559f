"""Evaluation on a labelled data set: accuracy, per-class accuracy, confusion matrix, mean loss.

Only ``ModelOutput.scores`` is used (``argmax`` = prediction), so any registered model works. Batches are
taken in stored order; counting is done with tensor ops on the device (one ``bincount`` per batch).
In a data-parallel run each process evaluates one contiguous shard and the counts are summed over the
group, so every process gets the whole data set's figures for 1/world_size of the work.
:func:`dice_score` scores segmentation models (per-image Dice of thresholded probabilities).

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

from capsnets.data import dataset_info
from capsnets.data.image_folder import FOLDER_PREFIX
from capsnets.engine.distributed import DistContext, all_reduce_sum
from capsnets.engine.runtime import autocast, resolve_amp, resolve_device
from capsnets.io import load_checkpoint
from capsnets.models.hub import model_from_checkpoint
from capsnets.models.output import ModelOutput


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Any,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    amp: str = "off",
    criterion: nn.Module | None = None,
    context: DistContext | None = None,
    *,
    correct: Callable[[Any, Any], Tensor] | None = None,
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
            x = images[start : min(start + batch_size, last)].to(device, non_blocking=True)
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
    batch_size: int = 256,
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
            raise ValueError("an ensemble needs at least one model")
        for name in ("num_classes", "input_size"):
            values = [
                tuple(v) if isinstance(v, (list, tuple)) else v for v in (getattr(m, name, None) for m in members)
            ]
            if any(value != values[0] for value in values):
                raise ValueError(f"the models of an ensemble must agree on {name}; got {values}")
        self.members = nn.ModuleList(members)
        self.num_classes, self.input_size = members[0].num_classes, tuple(members[0].input_size)
        self.class_names = getattr(members[0], "class_names", None)  # load_ensemble checks that they agree

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        outputs = [member(images) for member in self.members]
        kinds = sorted({output.score_kind for output in outputs})
        if len(kinds) > 1:
            raise ValueError(
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
        raise ValueError("an ensemble needs at least one checkpoint")
    seen: dict[Path, str] = {}
    for (_, checkpoint), given in zip(loaded, paths):
        where = checkpoint.path.resolve()
        if where in seen:
            raise ValueError(
                f"checkpoint '{checkpoint.path}' is given twice ({seen[where]!r} and {str(given)!r}); "
                f"an ensemble counts each model once"
            )
        seen[where] = str(given)
    first_model, first = loaded[0]
    for model, checkpoint in loaded:
        if checkpoint.meta.get("dataset") is None:
            raise ValueError(
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
                raise ValueError(
                    f"the models of an ensemble must be trained on the same data: '{first.path}' has "
                    f"{what} {theirs!r} and '{checkpoint.path}' has {mine!r}"
                )
    return Ensemble(model for model, _ in loaded).eval(), [checkpoint for _, checkpoint in loaded]


def _dataset_name(name: str) -> str:
    """A recorded data set's canonical name (``"CIFAR-10"`` and ``"cifar10"`` are one data set); a folder's as given."""
    return name if name.startswith(FOLDER_PREFIX) else dataset_info(name).name
