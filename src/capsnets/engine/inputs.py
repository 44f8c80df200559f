"""What :meth:`~capsnets.engine.Trainer.fit` takes, made into what the training loop runs.

As in Lightning's ``Trainer.fit(model, train_dataloaders, val_dataloaders)``, the trainer takes your own objects:

- data: a :class:`~capsnets.data.TensorData` or :class:`~capsnets.data.SegmentationData` as it is; a
  ``torch.utils.data.Dataset`` of ``(image, target)`` pairs is read once into tensors (:func:`read_data`); a
  ``DataLoader`` gives its data set (read likewise, in stored order) and its batch size, or, over an
  ``IterableDataset``, its ``(images, targets)`` batches. The whole data set then lives on the training device and
  the trainer batches and shuffles it from the seed (:class:`~capsnets.data.DeviceLoader`), which is what makes a
  resumed run continue bit for bit. Random transforms of a dataset's items are therefore drawn once; the trainer's
  own ``max_shift`` and ``augment`` are drawn afresh for every batch.
- a model returning a :class:`~capsnets.models.ModelOutput`, or plain ``(B, K)`` scores taken as logits
  (:class:`ScoresModel`); it gets the batch's targets as a second argument when its ``forward`` takes one (a
  CapsNet decoder reconstructs from the true class in training).
- a loss: a capsnets criterion ``(output, images, targets) -> (loss, parts)``, or any callable of the scores and the
  targets, such as ``nn.CrossEntropyLoss()`` (:func:`criterion_for`).

:func:`run_config` names the run after the objects (a registered model's name and arguments, else its class's
name), :func:`check_splits` and :func:`score_width` refuse data and models that do not fit each other before
anything is written, :func:`hold_out` draws the validation split, and :func:`check_same_model` refuses to resume a
run with a model whose parameters have other names or shapes.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from capsnets.checkpoints import Checkpoint
from capsnets.data import SegmentationData, TensorData
from capsnets.data.base import seeded_split
from capsnets.engine.config import default_run_dir
from capsnets.engine.run_dir import RunDirectoryError
from capsnets.losses import create_loss
from capsnets.models import list_models
from capsnets.models.output import ModelOutput
from capsnets.validation import ArgumentError

#: The most examples read from an ``IterableDataset`` (which may never end) before it is refused; a module
#: attribute read at each call, so a program with more may raise it.
MAX_STREAMED_EXAMPLES = 10_000_000

__all__ = [
    "ReadData",
    "ScoresModel",
    "check_same_model",
    "check_splits",
    "criterion_for",
    "data_kind",
    "hold_out",
    "object_loss",
    "read_data",
    "run_config",
    "score_width",
    "select",
]

#: The data objects the trainer batches itself.
LIBRARY_DATA = (TensorData, SegmentationData)


@dataclass
class ReadData:
    """A data set read into tensors, before its number of classes is known.

    Shape:
        - images: ``(N, C, H, W)`` floating point
        - targets: ``(N,)`` int64 class indices, or ``(N, K)`` float multi-hot targets
    """

    images: Tensor
    targets: Tensor
    classes: list[str]
    name: str

    def labelled(self, num_classes: int, what: str) -> TensorData:
        """The :class:`~capsnets.data.TensorData` of a model that scores ``num_classes`` classes."""
        if self.targets.dim() == 1 and len(self.targets):
            low, high = int(self.targets.min()), int(self.targets.max())
            if low < 0 or high >= num_classes:
                raise ArgumentError(
                    f"{what} holds class {low if low < 0 else high}, and the model scores {num_classes} classes "
                    f"(0 to {num_classes - 1}); build the model for the data's classes, or relabel the data",
                    what,
                )
        classes = self.classes if len(self.classes) == num_classes else [str(k) for k in range(num_classes)]
        return TensorData(self.images, self.targets, num_classes, classes=classes, name=self.name)


def read_data(data: Any, what: str) -> TensorData | SegmentationData | ReadData:
    """``data`` as tensors: the library's data objects as they are, a ``DataLoader``'s batches or a ``Dataset``'s
    items concatenated (:class:`ReadData`).

    Args:
        data: a :class:`~capsnets.data.TensorData`, :class:`~capsnets.data.SegmentationData`, ``Dataset`` of
            ``(image (C, H, W), target)`` pairs, or a ``DataLoader`` of one (its sampler and workers are not used)
            or of an ``IterableDataset`` of ``(images (B, C, H, W), targets)`` batches. A
            target is a class index (an int or an integer tensor of one element) or a float multi-hot ``(K,)``
            tensor (several classes per image).
        what: the argument's name, for the messages (``"train_data"``).

    Raises:
        ArgumentError: anything else, or items of other types or shapes; the message says what was found.
    """
    if isinstance(data, LIBRARY_DATA):
        return data
    if isinstance(data, DataLoader) and isinstance(data.dataset, IterableDataset):
        pairs, count = [], 0
        for batch in data:  # an iterable may never end: read at most MAX_STREAMED_EXAMPLES
            pairs.append(_pair(batch, f"a batch of {what}", batched=True))
            count += len(pairs[-1][0])
            if count > MAX_STREAMED_EXAMPLES:
                raise ArgumentError(
                    f"{what} streams more than {MAX_STREAMED_EXAMPLES:,} examples (limit "
                    "capsnets.engine.inputs.MAX_STREAMED_EXAMPLES): the trainer holds its data in memory, so an "
                    "IterableDataset must end; pass a finite one, or a Dataset",
                    what,
                )
    elif isinstance(data, DataLoader):  # its data set, in stored order: the trainer shuffles from the seed
        return read_data(data.dataset, what)
    elif isinstance(data, TensorDataset) and len(data.tensors) == 2:
        pairs = [_pair(tuple(data.tensors), what, batched=True)]
    elif isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        pairs = [_pair(data[i], f"{what}[{i}]", batched=False) for i in range(len(data))]
    else:
        raise ArgumentError(
            f"{what} must be a torch Dataset of (image, target) pairs, a DataLoader of (images, targets) batches or "
            f"a capsnets TensorData, got {type(data).__name__}",
            what,
        )
    if not pairs or not sum(len(images) for images, _ in pairs):
        raise ArgumentError(f"{what} holds no examples; pass a data set with at least one", what)
    images, targets = (torch.cat(parts) for parts in zip(*pairs))
    classes = getattr(getattr(data, "dataset", data), "classes", None)
    classes = [str(c) for c in classes] if isinstance(classes, (list, tuple)) else []
    shape = "x".join(map(str, images.shape[1:]))
    return ReadData(images, targets, classes, f"{type(data).__name__}({len(images)} images {shape})")


def _pair(item: Any, where: str, *, batched: bool) -> tuple[Tensor, Tensor]:
    """One item (or batch) as ``(images (B, C, H, W), targets)``, checked."""
    expected = "(images (B, C, H, W), targets (B,))" if batched else "(image (C, H, W), target)"
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        found = f"{type(item).__name__} of {len(item)}" if isinstance(item, (tuple, list)) else type(item).__name__
        raise ArgumentError(f"{where} is a {found}; it must be a pair {expected}", where)
    image, target = item
    if not isinstance(image, Tensor) or image.dim() != (4 if batched else 3):
        found = f"a tensor of shape {tuple(image.shape)}" if isinstance(image, Tensor) else type(image).__name__
        raise ArgumentError(
            f"{where}'s image is {found}; it must be a tensor {expected.split(',')[0].strip('(')} (e.g. "
            "torchvision's transforms.ToTensor() makes one from a PIL image)",
            where,
        )
    if not image.is_floating_point():
        raise ArgumentError(
            f"{where}'s image is a {image.dtype} tensor; it must hold floating-point pixel values (e.g. "
            "images.float() / 255)",
            where,
        )
    if isinstance(target, int) and not isinstance(target, bool):
        target = torch.tensor(target)
    if not isinstance(target, Tensor):
        raise ArgumentError(
            f"{where}'s target is {type(target).__name__}; it must be a class index (an int or integer tensor) "
            "or a float multi-hot tensor",
            where,
        )
    images = image if batched else image[None]
    if batched:
        targets = target
    elif target.dim() == 1 and target.is_floating_point():
        targets = target[None]  # one multi-hot vector
    else:
        targets = target.reshape(1) if target.numel() == 1 else target[None]  # a shape refused below
    return images.detach().cpu(), _targets(targets, len(images), where)


def _targets(targets: Tensor, count: int, where: str) -> Tensor:
    """Class indices as int64 ``(B,)``; multi-hot targets as float32 ``(B, K)``."""
    if targets.dim() == 1 and not targets.is_floating_point() and targets.dtype != torch.bool:
        result = targets.long()
    elif targets.dim() == 2 and (targets.is_floating_point() or targets.dtype == torch.bool):
        result = targets.float()
    else:
        raise ArgumentError(
            f"{where}'s targets are a {targets.dtype} tensor of shape {tuple(targets.shape)}; they must be "
            "integer class indices (B,) or float multi-hot targets (B, K)",
            where,
        )
    if len(result) != count:
        raise ArgumentError(f"{where} has {count} images but {len(result)} targets; give one target per image", where)
    return result.detach().cpu()


def data_kind(data: Any) -> str:
    """The task of ``data``: its ``task`` attribute, else ``"multilabel"`` or ``"classification"``."""
    labels = getattr(data, "labels", getattr(data, "targets", None))
    multilabel = getattr(data, "multilabel", labels is not None and labels.dim() == 2)
    return getattr(data, "task", None) or ("multilabel" if multilabel else "classification")


def select(data: TensorData | SegmentationData, index: Tensor) -> TensorData | SegmentationData:
    """The examples of ``data`` at ``index`` (a 1-D integer tensor), in that order."""
    if isinstance(data, SegmentationData):
        index = index.to(data.images.device)
        return dataclasses.replace(data, images=data.images[index], masks=data.masks[index])
    return data.select(index)


class ScoresModel(nn.Module):
    """``model`` as the trainer calls it: ``(images, targets) -> ModelOutput``.

    A model's plain score tensor becomes ``ModelOutput(scores, "logits")``; the targets are passed on only to a
    ``forward`` that takes a second argument (e.g. CapsNet's, whose decoder reconstructs the true class).

    Args:
        model: the model (possibly compiled); its parameters are this module's.
        takes_targets: whether to pass the targets (None: read from ``model.forward``'s signature).

    Shape:
        - images: ``(B, C, H, W)``; targets: ``(B,)`` or ``(B, K)``
        - output: ``ModelOutput`` with scores ``(B, K)`` (a segmentation model's output as it is)

    Examples:
        >>> model = ScoresModel(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
        >>> model(torch.rand(2, 1, 8, 8)).scores.shape
        torch.Size([2, 10])
    """

    def __init__(self, model: nn.Module, takes_targets: bool | None = None) -> None:
        super().__init__()
        self.model = model
        self.takes_targets = _takes_two(model) if takes_targets is None else takes_targets

    def forward(self, images: Tensor, targets: Tensor | None = None) -> ModelOutput:
        output = self.model(images, targets) if self.takes_targets and targets is not None else self.model(images)
        if isinstance(output, Tensor):
            return ModelOutput(output, "logits")
        if isinstance(output, ModelOutput) or hasattr(output, "scores") or hasattr(output, "probabilities"):
            return output  # a segmentation model's output has per-pixel probabilities
        raise ArgumentError(
            f"the model returned {type(output).__name__}; it must return a capsnets.models.ModelOutput or a "
            "(B, num_classes) tensor of scores",
            "model",
        )


def _takes_two(model: nn.Module) -> bool:
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


@torch.no_grad()
def score_width(model: ScoresModel, images: Tensor) -> tuple[int | None, str | None]:
    """Run ``model`` in eval mode on ``images`` (a couple of training images) and return its number of scores and
    their kind (None for a segmentation model's per-pixel output), so that a model that does not fit the data is
    refused before the training starts."""
    was_training = model.training
    model.eval()
    try:
        output = model(images)
    except Exception as err:  # a layer's own ArgumentError too: it does not say which images it was given
        kind = "" if isinstance(err, ArgumentError) else f"{type(err).__name__}: "
        raise ArgumentError(
            f"the model failed on a batch of training images of shape {tuple(images.shape)}: "
            f"{kind}{str(err).splitlines()[0] if str(err) else ''}; build it for images of "
            f"{tuple(images.shape[1:])}",
            "model",
        ) from err
    finally:
        model.train(was_training)
    scores = getattr(output, "scores", None)
    return (None, None) if scores is None else (int(scores.shape[-1]), output.score_kind)


#: The loss of a model without a ``default_loss``, by the kind of its scores.
DEFAULT_LOSSES = {"length": "margin", "activation": "spread", "logits": "cross_entropy"}


class _ScoreLoss(nn.Module):
    """A loss of the scores and targets (``nn.CrossEntropyLoss()``) as a capsnets criterion."""

    def __init__(self, loss: Callable) -> None:
        super().__init__()
        self.loss = loss

    def forward(self, output: ModelOutput, images: Tensor, targets: Tensor):
        value = self.loss(output.scores, targets)
        return value if isinstance(value, tuple) else (value, {})


class _CapsnetsStyle(nn.Module):
    """A callable ``(output, images, targets)`` returning a loss, or a ``(loss, parts)`` pair, as a criterion."""

    def __init__(self, loss: Callable) -> None:
        super().__init__()
        self.loss = loss

    def forward(self, output: ModelOutput, images: Tensor, targets: Tensor):
        value = self.loss(output, images, targets)
        return value if isinstance(value, tuple) else (value, {})


def criterion_for(loss: Callable) -> Callable:
    """``loss`` as the trainer calls it: ``criterion(output, images, targets) -> (loss, parts)``.

    A capsnets criterion (:mod:`capsnets.losses`) is returned as it is; a callable of three arguments is called as
    one (returning a loss or a ``(loss, parts)`` pair); any other callable gets the scores and the targets.
    """
    if not callable(loss):
        raise ArgumentError(
            f"loss must be an nn.Module or callable (e.g. nn.CrossEntropyLoss()), or None, got {type(loss).__name__}",
            "loss",
        )
    if type(loss).__module__ == "capsnets.losses":
        return loss
    target = loss.forward if isinstance(loss, nn.Module) else loss
    try:
        parameters = [
            p
            for p in inspect.signature(target).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        parameters = []
    return _CapsnetsStyle(loss) if len(parameters) == 3 else _ScoreLoss(loss)


def run_config(config: Any, settings: dict[str, Any] | None, model: Any, train_data: Any, loss: Any) -> Any:
    """The :class:`~capsnets.engine.config.TrainConfig` of a run of ``model``: the model's registered name and
    arguments (an unregistered model: its class's name, no arguments), the name of the ``loss`` given, and, unless
    ``settings`` (the trainer's, None when it was given a config) name them, ``runs/<model>`` and a
    ``DataLoader``'s batch size. A registered model's training recipe applies to the settings left out."""
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model must be an nn.Module, got {type(model).__name__}", "model")
    if train_data is None:
        raise ArgumentError("train_data is missing: pass the data to train the model on", "train_data")
    name = getattr(model, "model_name", None)
    registered = isinstance(name, str) and name in list_models()
    label = name if registered else type(model).__name__
    changes: dict[str, Any] = {
        "model": label,
        "model_args": dict(getattr(model, "model_args", None) or {}) if registered else {},
    }
    if loss is not None:
        changes["loss"] = getattr(loss, "__name__", None) or type(loss).__name__
    batch = train_data.batch_size if isinstance(train_data, DataLoader) else None
    if settings is None:
        config = config.replace(**changes)
    else:
        changes.setdefault("out", settings.get("out") or default_run_dir(label))
        if batch is not None:
            changes["batch_size"] = settings.get("batch_size", batch)
        config = type(config).from_dict({**settings, **changes})
    if batch is not None and batch != config.batch_size:
        raise ArgumentError(
            f"train_data is a DataLoader of batches of {batch} and batch_size is {config.batch_size}; leave "
            "batch_size out, or set it to the loader's",
            "batch_size",
        )
    return config


def check_splits(train: Any, val: Any, test: Any, width: int | None) -> None:
    """Refuse splits whose images or task differ from the training data's, or a model whose number of scores
    (``width``) is not the training data's number of classes."""
    kind = data_kind(train)
    for name, data in (("val_data", val), ("test_data", test)):
        if data is not None and (_seen(data) != _seen(train) or data_kind(data) != kind):
            raise ArgumentError(
                f"{name} holds {data_kind(data)} data of {_seen(data)} images and train_data "
                f"{kind} data of {_seen(train)} images; pass splits of one data set",
                name,
            )
    if kind != "segmentation" and width != train.num_classes:
        raise ArgumentError(
            f"the model scores {width} classes and train_data has {train.num_classes}; build the model for the "
            "data's classes",
            "model",
        )


def _seen(data: Any) -> tuple[int, ...]:
    """The ``(C, H, W)`` of the images a model sees of ``data``: after its training augmentation's crop, if any."""
    shape = getattr(data, "input_shape", None)
    return tuple(shape) if shape is not None else tuple(data.images.shape[1:])


def hold_out(data: Any, fraction: float, seed: int) -> tuple[Any, Any]:
    """``(train, validation)``: a share ``fraction`` of ``data``'s examples (drawn by
    :func:`~capsnets.data.base.seeded_split` from ``seed``) held out, each part in stored order; ``(data, None)``
    for ``fraction=0``."""
    if not fraction:
        return data, None
    if len(data) < 2:
        raise ArgumentError(
            f"val_fraction={fraction} needs at least 2 training examples, and there are {len(data)}; pass "
            "val_fraction=0 or more data",
            "val_fraction",
        )
    kept, held = seeded_split(list(range(len(data))), fraction, torch.Generator().manual_seed(seed))
    return select(data, torch.tensor(kept)), as_evaluated(select(data, torch.tensor(held)))


def as_evaluated(data: Any) -> Any:
    """``data`` as a model sees it when scored: where its training augmentation crops (smallNORB's random crops,
    :class:`~capsnets.data.transforms.NorbAugment`), its images' centre window of :attr:`input_shape`, with no
    augmentation (the view its test split is stored in)."""
    if getattr(data, "augment", None) is None or data.input_shape == data.image_shape:
        return data
    height, width = data.input_shape[1:]
    top, left = (data.images.shape[-2] - height) // 2, (data.images.shape[-1] - width) // 2
    window = data.images[..., top : top + height, left : left + width].contiguous()
    return dataclasses.replace(data, images=window, augment=None)


def object_loss(given: Any, model: nn.Module, kind: str | None, config: Any, task: Any) -> Callable:
    """The criterion of a run: the loss given (:func:`criterion_for`), else the config's ``loss`` by name, else the
    model's ``default_loss``, else the one that fits the kind of its scores (:data:`DEFAULT_LOSSES`)."""
    if given is not None:
        return criterion_for(given)
    default = getattr(model, "default_loss", None) or DEFAULT_LOSSES.get(kind)
    name = config.loss or default
    if name is None:
        raise ArgumentError(f"the model has no default_loss and its scores are {kind!r}; pass loss=...", "loss")
    return create_loss(task.loss_name(name, default, config.loss is not None), **config.loss_args)


def check_same_model(model: nn.Module, checkpoint: Checkpoint, run_dir: Any) -> None:
    """Refuse to resume the run in ``run_dir`` with a model whose parameters and buffers have other names or shapes
    than ``checkpoint``'s."""
    saved = {k: tuple(v.shape) for k, v in checkpoint.model_state().items()}
    given = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if saved == given:
        return
    missing, unexpected = sorted(set(saved) - set(given)), sorted(set(given) - set(saved))
    wrong = [f"{k} {saved[k]} -> {given[k]}" for k in sorted(set(saved) & set(given)) if saved[k] != given[k]]
    found = "; ".join(
        f"{what}: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}"
        for what, names in (("not in the model", missing), ("new", unexpected), ("other shapes", wrong))
        if names
    )
    raise RunDirectoryError(
        f"cannot resume the run in '{run_dir}' with this model: it is not the model the run trained "
        f"({checkpoint.meta.get('model_class') or checkpoint.meta.get('model')}; tensors {found}); pass the same "
        "model as before, or start a new run (another out, or overwrite=True)"
    )
