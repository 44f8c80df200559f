"""Training configuration as one dataclass (in the style of nanoGPT's ``GPTConfig``).

A :class:`TrainConfig` is built from defaults, then the model's training recipe
(:func:`~capsnets.models.training_recipe`), then a YAML/JSON file, then command-line flags (later sources override
earlier ones). The resolved config is saved as ``config.yaml`` in every run directory
(timm's ``args.yaml``) so that a run can be reproduced and a checkpoint can rebuild its model.

Defaults (:data:`DEFAULTS`, for a model whose recipe leaves a field out) follow Sabour et al. 2017, §4 (Adam,
exponentially decaying learning rate, batch 128, shifts of up to 2 px): ``lr=1e-3`` and a per-epoch decay
``lr_decay=0.96`` (the paper gives no number; 0.96 per epoch is the value used by the authors' public code,
``decay_rate=0.96``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from capsnets.data.image_folder import FOLDER_PREFIX
from capsnets.data.seg_folder import SEGFOLDER_PREFIX
from capsnets.data.transforms import AUGMENTATIONS
from capsnets.engine.fit import LR_SCHEDULES
from capsnets.engine.runtime import AMP_MODES, MAX_THREADS
from capsnets.files import atomic_write_text
from capsnets.models import list_models, training_recipe
from capsnets.outputs import yaml_mark
from capsnets.parsing import read_document
from capsnets.validation import ArgumentError, expect, reject_unknown

#: Images at most this many pixels high get ``max_shift=0`` when ``max_shift`` is None (8x8 digits
#: would lose a quarter of the digit to a 2 px shift); larger images get the paper's 2 px.
SMALL_IMAGE_PX = 16


#: The values of the recipe's fields for a model whose recipe leaves them out (Sabour et al. 2017; see above).
DEFAULTS: dict[str, Any] = {"lr": 1e-3, "lr_schedule": "exponential", "lr_decay": 0.96, "weight_decay": 0.0}


def default_run_dir(model: str) -> str:
    """The run directory of a training that names none: ``runs/<model>``."""
    return f"runs/{model}"


@dataclass
class TrainConfig:
    """Everything a training run needs, and nothing about how the model works inside.

    Attributes:
        model: registered model name (see ``capsnets.list_models()``).
        model_args: keyword overrides for the model builder, e.g. ``{"routing": {"iterations": 1}}`` (routing
            settings alone update the model's default routing).
        dataset: data set name (see ``capsnets.data.list_datasets()``), or ``"folder:PATH"`` for a folder of
            your own images with one subfolder per class, or ``"segfolder:PATH"`` for your own images with
            segmentation masks (a relative PATH is made absolute, so that the run's checkpoints find the folder
            from any directory).
        data_dir: where the data set files live (None: the data package's default; a relative folder is made
            absolute).
        image_size: folder data sets (``folder:PATH``, ``segfolder:PATH``) only: the side ``H`` (or ``[H, W]``)
            every image is resized to; None: the first training image's size. The model's ``input_size`` follows
            the data.
        download: fetch missing data set files.
        epochs: number of passes over the training split.
        batch_size: GLOBAL batch size; with ``world_size`` processes each takes ``batch_size / world_size``.
        lr: Adam learning rate. None: the model's recipe's, else ``DEFAULTS["lr"]`` (1e-3).
        lr_schedule: how the learning rate falls (:func:`~capsnets.engine.adam_with_decay`): ``"exponential"``,
            by ``lr_decay`` once per epoch, or ``"cosine"``, after every step along a half cosine to 0 at the last
            planned step (``epochs`` epochs), so that a run of any length ends annealed. None: ``"exponential"``
            when ``lr_decay`` is given, else the model's recipe's, else ``"exponential"``.
        lr_decay: the exponential schedule's per-epoch factor ``gamma`` (lr after epoch e is ``lr * gamma**e``);
            the cosine schedule does not use it. None: the model's recipe's, else 0.96.
        weight_decay: Adam weight decay. None: the model's recipe's, else 0.
        loss: loss name for ``capsnets.losses.create_loss`` (None: the recipe's, else the model's ``default_loss``).
        loss_args: keyword arguments for the loss, over the recipe's when the loss is the recipe's.
        max_shift: random translation in pixels (zero padding). None: the recipe's, else 2 px, or 0 for images of
            at most ``SMALL_IMAGE_PX`` pixels (the 8x8 digits) and for data sets with their own training
            augmentation (smallNORB and the viewpoint set: random crops and brightness/contrast).
        augment: a training augmentation by name, applied after the shifts (``capsnets.data.AUGMENTATIONS``):
            ``"digits"``, the random rotation, squeeze and erased patch of Efficient-CapsNet's code
            (:class:`~capsnets.data.DigitAugment`). None: shifts only. Not for data sets with their own.
        seed: seed for initialisation, shuffling and augmentation.
        device: ``"auto"`` (CUDA if available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        threads: the threads torch computes with during the training (None: as torch does). The ``capsnets``
            command records the count it used, so that a resumed run computes as the run it continues.
        amp: ``"auto"`` (bf16 autocast on CUDA, off on CPU), ``"bf16"`` or ``"off"``.
        compile: wrap the model in ``torch.compile``.
        out: run directory (config, metrics, checkpoints, figures); None: ``runs/<model>``.
        limit_train: use only the first N training images (quick runs); None: all.
        limit_test: use only the first N test images; None: all.
        val_fraction: the share of the training examples held out, drawn from ``seed``, as the validation split
            that chooses the ``best`` checkpoint (the one of the highest validation score) when no validation data
            is given (:meth:`~capsnets.engine.Trainer.fit`'s ``val_data``). 0: no validation split; then no
            ``best`` checkpoint is chosen, and the last epoch is the run's result. The test split never chooses.
        test_each_epoch: evaluate the test split at every evaluation point too (for the learning curves and
            ``time_to_accuracy``); False: only at the end of the training. Either way the ``best`` checkpoint's
            test score is reported once, at the end.
        eval_every: evaluate on the validation split (and, with ``test_each_epoch``, the test split) every N
            epochs, and after the last.
        checkpoint_every: save the ``last`` checkpoint every N epochs (and after the last).
        progress: show a progress bar (only on a TTY, only on rank 0).
        figures: draw the run's figures (training curves, and the task's: confusion matrix, reconstructions,
            masks) when the training ends. False: none, for trainings whose figures no one looks at (an
            experiment's, whose report draws its own).
        pretrained: the weight the model starts from (fine-tuning): a shipped weight's name or tag, a checkpoint
            file or a run directory (:func:`capsnets.models.create_model`'s ``pretrained``). Every tensor that fits
            the model the run builds (its class count from the data) is loaded; the others start afresh. None:
            an untrained model. A resumed run continues from its own checkpoint.
        classifier_only_epochs: train only the classifier (the model's ``get_classifier()``, and its decoder,
            which reads the class capsules) for the first N epochs, every other weight frozen: the usual start
            of a fine-tuning. 0: everything trains from the start.
        time_limit_minutes: stop after the first epoch whose training ends past this many minutes of
            wall-clock time in this call (set-up not counted). That epoch is evaluated and checkpointed
            whatever ``eval_every`` and ``checkpoint_every`` say, the summary and figures are written as
            usual (``summary.json["time_limited"]``), and ``--resume`` continues the run. None: no limit.
    """

    model: str = "capsnet_digits"
    model_args: dict[str, Any] = field(default_factory=dict)
    dataset: str = "digits"
    data_dir: str | None = None
    image_size: int | list[int] | None = None
    download: bool = False
    epochs: int = 10
    batch_size: int = 128
    lr: float | None = None
    lr_schedule: str | None = None
    lr_decay: float | None = None
    weight_decay: float | None = None
    loss: str | None = None
    loss_args: dict[str, Any] = field(default_factory=dict)
    max_shift: int | None = None
    augment: str | None = None
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    amp: str = "auto"
    compile: bool = False
    out: str | None = None
    limit_train: int | None = None
    limit_test: int | None = None
    val_fraction: float = 0.1
    test_each_epoch: bool = True
    eval_every: int = 1
    checkpoint_every: int = 1
    progress: bool = True
    figures: bool = True
    time_limit_minutes: float | None = None
    pretrained: str | None = None
    classifier_only_epochs: int = 0

    def __post_init__(self) -> None:
        if self.out is None:
            self.out = default_run_dir(self.model)
        self._apply_recipe()
        self.validate()
        self.dataset, self.data_dir = absolute_folder(self.dataset), _absolute(self.data_dir)

    def _apply_recipe(self) -> None:
        """Fill the fields left None from the model's recipe, then from :data:`DEFAULTS`."""
        known = isinstance(self.model, str) and self.model in list_models()
        recipe = training_recipe(self.model) if known else {}
        if self.lr_schedule is None and self.lr_decay is not None:  # a decay given alone: the per-epoch schedule
            self.lr_schedule = "exponential"
        recipe_loss_args = recipe.pop("loss_args", None)
        for key, value in recipe.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        if recipe_loss_args is not None and self.loss == recipe.get("loss") and isinstance(self.loss_args, dict):
            self.loss_args = _merged(recipe_loss_args, self.loss_args)
        for key, value in DEFAULTS.items():
            if getattr(self, key) is None:
                setattr(self, key, value)

    def validate(self) -> None:
        """Raise an :class:`~capsnets.validation.ArgumentError` (a ``ValueError``) naming the first field whose value
        is out of range."""
        for name in ("epochs", "batch_size", "eval_every", "checkpoint_every"):
            value = getattr(self, name)
            expect(_integer(value) and value >= 1, name, value, "a positive integer")
        for name, low in (("limit_train", 1), ("limit_test", 1), ("max_shift", 0)):
            value = getattr(self, name)
            expect(value is None or (_integer(value) and value >= low), name, value, f"None or an integer >= {low}")
        expect(
            self.threads is None or (_integer(self.threads) and 1 <= self.threads <= MAX_THREADS),
            "threads",
            self.threads,
            f"None or an integer from 1 to {MAX_THREADS}",
        )
        expect(
            _number(self.val_fraction) and 0 <= self.val_fraction < 1,
            "val_fraction",
            self.val_fraction,
            "a number in [0, 1) (0: no validation split)",
        )
        expect(
            _integer(self.classifier_only_epochs) and self.classifier_only_epochs >= 0,
            "classifier_only_epochs",
            self.classifier_only_epochs,
            "a non-negative integer (0: everything trains from the start)",
        )
        expect(
            self.pretrained is None or (isinstance(self.pretrained, str) and self.pretrained.strip()),
            "pretrained",
            self.pretrained,
            "None or a weight: a shipped weight's name, a checkpoint file or a run directory",
        )
        for name in ("download", "compile", "progress", "figures", "test_each_epoch"):
            expect(isinstance(getattr(self, name), bool), name, getattr(self, name), "true or false")
        expect(
            _integer(self.seed) and 0 <= self.seed < 2**64,
            "seed",
            self.seed,
            "a non-negative integer below 2**64 (torch's generators take 64-bit seeds)",
        )
        expect(
            self.data_dir is None or (isinstance(self.data_dir, str) and self.data_dir),
            "data_dir",
            self.data_dir,
            "None or a folder",
        )
        size = self.image_size
        expect(
            size is None
            or (_integer(size) and size >= 1)
            or (isinstance(size, (list, tuple)) and len(size) == 2 and all(_integer(s) and s >= 1 for s in size)),
            "image_size",
            size,
            "None, a positive integer or [height, width]",
        )
        expect(
            self.augment is None or self.augment in AUGMENTATIONS,
            "augment",
            self.augment,
            f"None or one of {sorted(AUGMENTATIONS)}",
        )
        expect(
            self.loss is None or (isinstance(self.loss, str) and self.loss), "loss", self.loss, "None or a loss name"
        )
        expect(
            _number(self.lr) and 0 < self.lr <= FLOAT32_MAX,
            "lr",
            self.lr,
            f"a positive number up to {FLOAT32_MAX:.4g} (the optimiser steps in float32)",
        )
        expect(self.lr_schedule in LR_SCHEDULES, "lr_schedule", self.lr_schedule, f"one of {LR_SCHEDULES}")
        expect(_number(self.lr_decay) and 0 < self.lr_decay <= 1, "lr_decay", self.lr_decay, "in (0, 1]")
        expect(
            _number(self.weight_decay) and 0 <= self.weight_decay <= FLOAT32_MAX,
            "weight_decay",
            self.weight_decay,
            f"a non-negative number up to {FLOAT32_MAX:.4g} (the optimiser steps in float32)",
        )
        limit = self.time_limit_minutes
        expect(
            limit is None
            or (isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit > 0 and math.isfinite(limit)),
            "time_limit_minutes",
            limit,
            "None or a positive number",
        )
        expect(self.amp in AMP_MODES, "amp", self.amp, f"one of {AMP_MODES}")
        for name in ("model_args", "loss_args"):
            expect(isinstance(getattr(self, name), dict), name, getattr(self, name), "a mapping")
        for name in ("model", "dataset", "out", "device"):
            expect(
                isinstance(getattr(self, name), str) and getattr(self, name),
                name,
                getattr(self, name),
                "a non-empty string",
            )

    def resolved_max_shift(self, image_height: int, dataset_augment=None) -> int:
        """``max_shift``, or the default when it is None: 0 for small images and for data sets with their
        own training augmentation (smallNORB's random crops), else the paper's 2 px."""
        if self.max_shift is not None:
            return self.max_shift
        return 0 if image_height <= SMALL_IMAGE_PX or dataset_augment is not None else 2

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python (YAML/JSON-safe) copy of the config; tuples become lists."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build a config from a mapping; unknown keys raise an
        :class:`~capsnets.validation.ArgumentError` (a ``ValueError``) naming the keys it takes."""
        reject_unknown("the training config", values, field_names())
        return cls(**values)

    def replace(self, **overrides: Any) -> TrainConfig:
        """A copy with ``overrides`` applied (validated like :meth:`from_dict`)."""
        return TrainConfig.from_dict({**self.to_dict(), **overrides})

    def save(self, path: str | Path) -> None:
        """Write the config as YAML to ``path`` (atomically), its first line the mark of a run's config
        (:func:`~capsnets.outputs.yaml_mark`)."""
        text = f"{yaml_mark('config')}\n" + yaml.safe_dump(self.to_dict(), sort_keys=False)
        atomic_write_text(path, text)


#: The largest float32: a learning rate or weight decay above it overflows in the optimiser's step.
FLOAT32_MAX = 3.4028234663852886e38


def absolute_folder(dataset: str) -> str:
    """``"folder:PATH"`` (or ``"segfolder:PATH"``) with PATH absolute (``~`` expanded, resolved against the current
    directory); any other data set name unchanged.

    Examples:
        >>> absolute_folder("mnist")
        'mnist'
    """
    for prefix in (FOLDER_PREFIX, SEGFOLDER_PREFIX):
        if dataset.startswith(prefix):
            return prefix + str(Path(dataset[len(prefix) :]).expanduser().resolve())
    return dataset


def _absolute(folder: str | None) -> str | None:
    return None if folder is None else str(Path(folder).expanduser().resolve())


def field_names() -> list[str]:
    """The names of every :class:`TrainConfig` field, in declaration order."""
    return [f.name for f in dataclasses.fields(TrainConfig)]


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON config file into a dict (keys are checked by :meth:`TrainConfig.from_dict`), within the
    limits of :mod:`capsnets.parsing` (size, nesting, values and aliases); an
    :class:`~capsnets.validation.ArgumentError` (a ``ValueError``) says what is wrong with the file."""
    values = read_document(path, "config file")
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ArgumentError(
            f"config file {str(path)!r} must hold a mapping of keys to values, got {type(values).__name__}"
        )
    return values


def build_config(config_file: str | Path | dict[str, Any] | None = None, **overrides: Any) -> TrainConfig:
    """Defaults, then ``config_file`` (if any), then ``overrides`` whose value is not None.

    ``config_file`` is a YAML/JSON file, or the values of one already read (e.g. the config a checkpoint records).
    Dict fields (``model_args``, ``loss_args``) are merged key by key, the overrides winning (a mapping
    within them, such as ``model_args.routing``, key by key too).
    """
    if isinstance(config_file, dict):
        values, where = copy.deepcopy(config_file), "the recorded config"
    else:
        values = read_config_file(config_file) if config_file is not None else {}
        where = f"config file {str(config_file)!r}"
    if values:
        try:
            TrainConfig.from_dict(dict(values))
        except (ValueError, TypeError) as err:
            raise ArgumentError(f"{where}: {err}; correct it there", getattr(err, "argument", None)) from err
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            value = _merged(values[key], value)
        values[key] = value
    return TrainConfig.from_dict(values)


def _merged(base: dict, update: dict) -> dict:
    """``base`` updated by ``update``, mappings in both merged key by key (``model_args.routing``)."""
    merged = dict(base)
    for key, value in update.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = _merged(base[key], value) if both else value
    return merged


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    """A real number (not a bool); NaN fails every comparison the callers make."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
