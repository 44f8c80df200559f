"""The training loop around a model and its data: optimiser, schedule, evaluation, checkpoints, a run directory.

:meth:`Trainer.fit` trains any ``nn.Module`` on your own data, in the manner of Lightning's
``Trainer.fit(model, train_dataloaders, val_dataloaders)`` (:mod:`capsnets.engine.inputs` says what it takes);
:func:`train` (and ``capsnets train``) builds the registered model and the data set that a
:class:`~capsnets.engine.config.TrainConfig` names and trains them the same way.

Sabour et al. 2017 train CapsNet with Adam and an exponentially decaying learning rate; here the decay
is applied once per epoch (``ExponentialLR``). The trainer only uses a model's ``ModelOutput.scores``,
``reconstruction`` and ``default_loss``: it knows nothing of capsules.

The training is :func:`~capsnets.engine.fit` with callbacks (:mod:`capsnets.engine.callbacks`): a time limit,
the evaluations, the ``last`` and ``best`` checkpoints and the metrics log. The ``best`` checkpoint is the
evaluation of the highest validation score (the ``val_data`` given, else a share of the training data held out,
``val_fraction``); the test split never chooses it, and scores it once at the end.

What differs between tasks (one class per image, several, a class per pixel) is a
:class:`~capsnets.engine.tasks.Task` chosen from the data (:func:`~capsnets.engine.tasks.task_for`): the model's
default arguments, the losses that fit, the training batch's scores, the evaluation, the metric that chooses
the ``best`` checkpoint, and what checkpoints, ``summary.json`` and the figures add.

Run directory (``config.out``): ``config.yaml``, ``metrics.jsonl`` (one line per epoch),
``last``/``best`` checkpoints (``.safetensors`` + ``.json``), ``summary.json`` and figures. A fresh run never
replaces another run's directory unless asked to (``overwrite``), and a resumed run refuses changes that would
make it another run (:mod:`capsnets.engine.run_dir`, :mod:`capsnets.engine.resume`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import capsnets
from capsnets.checkpoints import CheckpointError, load_checkpoint
from capsnets.data import AUGMENTATIONS, DeviceLoader, load_dataset
from capsnets.engine import distributed, reporting
from capsnets.engine.callbacks import Hook, ModelCheckpoint, TimeLimit, checkpoint_path
from capsnets.engine.config import TrainConfig
from capsnets.engine.fit import NonFiniteLossError, TrainState, adam_with_decay, fit, training_step
from capsnets.engine.inputs import (
    ReadData,
    ScoresModel,
    check_same_model,
    check_splits,
    data_kind,
    hold_out,
    object_loss,
    read_data,
    run_config,
    score_width,
)
from capsnets.engine.resume import apply_changes, prepare_run_dir, read_last, restore
from capsnets.engine.run_dir import RunDirectory, RunDirectoryError
from capsnets.engine.runtime import (
    compile_em_kernel,
    deterministic_on_cpu,
    resolve_amp,
    seed_everything,
    stop_on_signals,
    torch_threads,
)
from capsnets.engine.tasks import TASKS, best_index, task_for
from capsnets.losses import create_loss
from capsnets.models import list_models, model_arguments, model_task
from capsnets.models.hub import build_model, restore_model
from capsnets.validation import ArgumentError

logger = logging.getLogger(__name__)

#: Fewer optimiser steps per epoch than this get a warning (a small data set at a large batch).
FEW_STEPS = 10
#: Where the ``best`` checkpoint is chosen: the validation split (``summary.json["best_chosen_on"]``).
VALIDATION = "validation"


@dataclass
class _Objects:
    """What :meth:`Trainer.fit` was given (None: the objects the config names)."""

    model: nn.Module
    train: Any
    val: Any
    test: Any
    loss: Any


@dataclass
class _Session:
    """Everything one call of :meth:`Trainer.fit` works with."""

    context: distributed.DistContext
    device: torch.device
    model: nn.Module  # the bare model: checkpoints
    fast_model: nn.Module  # compiled or bare, returning ModelOutput: training and evaluation
    criterion: Any
    loader: Any
    val_data: Any
    test_data: Any
    state: TrainState
    examples: int  # training examples per epoch (all ranks)


class Trainer:
    """Train a model on data, writing a run directory; see :class:`~capsnets.engine.config.TrainConfig`.

    Args:
        config: the run's configuration (None: the defaults); its ``model`` and ``dataset`` are used by :meth:`fit`
            without a model (:meth:`from_config`), and replaced by names of the objects given to :meth:`fit`.
        resume: continue from ``<out>/last.safetensors`` (weights, optimizer, scheduler, RNG, epoch). The config
            may change what can be applied from the resumed epoch on (more epochs, learning rate and its decay,
            weight decay, device, threads, evaluation and checkpoint intervals, time limit; logged and recorded);
            a change of the model, its arguments, the data, batch size, seed, validation split or loss is refused.
            A run of your own objects is resumed by passing the same objects to :meth:`fit` again (as Lightning's
            ``ckpt_path``): a model of another class or with other parameter names or shapes is refused.
        overwrite: a fresh run may replace the run in ``config.out``: the old run is moved aside and deleted once
            the new run has saved its first checkpoint (put back if the new run fails before). Without it, a
            fresh run into a directory holding another run is refused.
        **settings: :class:`~capsnets.engine.config.TrainConfig` fields, over ``config``'s (e.g. ``out``,
            ``epochs``, ``batch_size``, ``lr``, ``val_fraction``, ``device``).

    In a single process in the main thread, the first Ctrl-C or SIGTERM during the training stops it at the next
    step with a resumable ``last`` checkpoint of that step, and raises
    :class:`~capsnets.engine.fit.TrainingInterrupted`; ``resume`` continues it bit for bit. A second signal stops
    it at once, keeping the checkpoints saved before.

    Examples:
        >>> trainer = Trainer(out="runs/mine", epochs=3, batch_size=32)  # doctest: +SKIP
        >>> summary = trainer.fit(model, train_set, test_data=test_set)  # doctest: +SKIP
        >>> summary = Trainer.from_config(TrainConfig(epochs=1, out="runs/quick")).fit()  # doctest: +SKIP
    """

    def __init__(
        self, config: TrainConfig | None = None, *, resume: bool = False, overwrite: bool = False, **settings: Any
    ) -> None:
        if config is not None and not isinstance(config, TrainConfig):
            raise ArgumentError(f"config must be a TrainConfig or None, got {type(config).__name__}")
        if resume and overwrite:
            raise RunDirectoryError("resume continues the run and overwrite replaces it: pass one of them")
        self._settings = None if config is not None else dict(settings)  # rebuilt for the model fit() gets
        if config is None:
            config = TrainConfig.from_dict(settings)
        elif settings:
            config = config.replace(**settings)
        self.config, self.resume, self.overwrite = config, resume, overwrite
        self.run_dir = Path(config.out)
        self.model: nn.Module | None = None  # the trained (bare) model once fit() has run
        self._claim: RunDirectory | None = None
        self._changes: dict[str, tuple[Any, Any]] = {}
        self._objects: _Objects | None = None

    @classmethod
    def from_config(cls, config: TrainConfig, *, resume: bool = False, overwrite: bool = False) -> Trainer:
        """A trainer whose :meth:`fit`, called without a model, builds and trains the registered model and the data
        set that ``config`` names (``config.model``, ``config.dataset``), as ``capsnets train`` does."""
        return cls(config, resume=resume, overwrite=overwrite)

    def fit(
        self,
        model: nn.Module | None = None,
        train_data: Any = None,
        val_data: Any = None,
        *,
        test_data: Any = None,
        loss: Any = None,
    ) -> dict[str, Any]:
        """Train ``model`` on ``train_data``; returns the summary (also written to ``summary.json`` by rank 0).

        Args:
            model: the ``nn.Module`` to train, registered or not; it returns a
                :class:`~capsnets.models.ModelOutput` or ``(B, num_classes)`` scores (taken as logits). None: the
                registered model that the config names, on its data set (then no other argument is given).
            train_data: a ``torch.utils.data.Dataset`` of ``(image, target)`` pairs, a ``DataLoader`` of
                ``(images, targets)`` batches (its batch size is the run's unless ``batch_size`` is set), or a
                :class:`~capsnets.data.TensorData` / :class:`~capsnets.data.SegmentationData`. It is read once
                into tensors and batched by the trainer (:mod:`capsnets.engine.inputs`).
            val_data: the validation data, in the same forms, which chooses the ``best`` checkpoint. None: a share
                ``val_fraction`` of ``train_data``, drawn from the seed, is held out for it (0: no ``best``).
            test_data: the test data, in the same forms: scored at the end of the training, the ``best``
                checkpoint too (and at every evaluation with ``test_each_epoch``); it never chooses anything.
            loss: a capsnets criterion (:mod:`capsnets.losses`), or a callable of the scores and the targets
                (e.g. ``nn.CrossEntropyLoss()``). None: the model's ``default_loss``, else the loss that fits its
                scores (margin loss for capsule lengths, spread loss for activations, cross-entropy for logits).

        Returns:
            the summary: the last and the ``best`` evaluations, ``best_epoch``, ``best_chosen_on``
            (``"validation"``, or None without a validation split), times, sizes and versions.

        Raises:
            ArgumentError: an argument of a kind the trainer does not take, data of other types or shapes, or a
                model that does not fit the data.
            ValueError: a run directory that cannot be used as asked (a ``RunDirectoryError``); with ``resume``, a
                model or data other than the run's.
            TrainingInterrupted: a signal stopped the training (a resumable checkpoint is saved).
        """
        if model is None and train_data is None:
            if any(x is not None for x in (val_data, test_data, loss)):
                raise ArgumentError("val_data, test_data and loss go with a model and train_data: pass those too")
            self._objects, self._read = None, None
        else:  # read and checked before anything is written
            self._read = self._take_objects(model, train_data, val_data, test_data, loss)
        context, device = distributed.setup(self.config.device)
        try:
            claim = (
                RunDirectory(self.run_dir, resume=self.resume, overwrite=self.overwrite)
                if context.is_main
                else contextlib.nullcontext()
            )
            with claim, deterministic_on_cpu(device), torch_threads(self.config.threads):
                self._claim = claim if context.is_main else None
                return self._fit(context, device)
        except NonFiniteLossError as err:
            kept = checkpoint_path(self.run_dir, "last")
            where = (
                f"then --resume from the last checkpoint, {kept}, which is kept"
                if kept.is_file()
                else "then train again (no checkpoint was saved before it)"
            )
            raise NonFiniteLossError(f"{err} (--lr, --amp off); {where}") from err
        finally:
            self._claim = None
            distributed.teardown(context)

    def _take_objects(self, model, train_data, val_data, test_data, loss) -> dict[str, Any]:
        """Check what :meth:`fit` was given and make the config the run's: the model's name (its registered name,
        else its class's), its arguments, the loss's name, the run directory and a DataLoader's batch size. Returns
        the data read into tensors (:meth:`_read_objects`)."""
        self.config = run_config(self.config, self._settings, model, train_data, loss)
        self.run_dir = Path(self.config.out)
        self._objects = _Objects(model, train_data, val_data, test_data, loss)
        return self._read_objects()

    def _fit(self, context: distributed.DistContext, device: torch.device) -> dict[str, Any]:
        cfg, s = self.config, self._set_up(context, device)
        trained_before = s.state.epoch
        optimizer = s.state.optimizer
        schedule = hasattr(s.criterion, "set_progress")
        train_model = distributed.wrap_model(s.fast_model, context, device)

        def compute(batch):
            images, labels = batch
            if schedule:  # a loss schedule (spread loss's margin) follows the fraction of training done
                s.criterion.set_progress(s.state.fraction(len(s.loader), cfg.epochs), cfg.epochs)
            output = train_model(images, labels)
            return {"train_loss": s.criterion(output, images, labels)[0], **self._task.train_metrics(output, labels)}

        step = training_step(
            compute,
            optimizer,
            device=device,
            amp_dtype=resolve_amp(cfg.amp, device),
            model=s.model,
            frozen=self._frozen(s),
        )
        compile_s = compile_em_kernel(s.model, device)  # not the first epoch's time
        signals = contextlib.nullcontext() if context.enabled else stop_on_signals()
        with signals as request:
            fit(
                step,
                s.loader,
                epochs=cfg.epochs,
                state=s.state,
                schedulers=[s.state.scheduler],
                callbacks=self._callbacks(s),
                desc=cfg.model,
                progress=cfg.progress,
                context=context,
                interrupt=request,
            )
        if not s.state.finished:
            logger.info(
                "time limit of %g minutes reached after epoch %d of %d; continue with --resume",
                cfg.time_limit_minutes,
                s.state.epoch,
                cfg.epochs,
            )
        summary = self._summary(s)
        summary.update(planned_epochs=cfg.epochs, time_limited=not s.state.finished, kernel_compile_s=compile_s)
        if context.is_main:
            self._finish(summary, s, trained=s.state.epoch > trained_before)
        return summary

    def _frozen(self, s: _Session):
        """What :func:`training_step` leaves unchanged: for the first ``classifier_only_epochs`` epochs, every weight
        but the classifier's (``get_classifier()``) and the decoder's."""
        epochs = self.config.classifier_only_epochs
        if not epochs:
            return None
        head = getattr(s.model, "get_classifier", None)
        if head is None:
            raise ArgumentError(
                f"classifier_only_epochs={epochs}: {type(s.model).__name__} has no get_classifier(), so its "
                "classifier cannot be told apart; leave classifier_only_epochs at 0",
                "classifier_only_epochs",
            )
        trained = {
            id(p) for part in (head(), getattr(s.model, "decoder", None)) if part is not None for p in part.parameters()
        }
        body = [p for p in s.model.parameters() if id(p) not in trained]
        return lambda: body if s.state.epoch < epochs else ()

    def _set_up(self, context: distributed.DistContext, device: torch.device) -> _Session:
        """Seed, load data, build model, loss, optimizer and schedule; restore them when resuming."""
        cfg = self.config
        read = self._read
        checkpoint, self._changes = read_last(self.run_dir, cfg) if self.resume else (None, {})
        seed_everything(cfg.seed)
        if read is None:
            model, criterion, (train_data, val_data, test_data) = self._from_names(device)
        else:
            model, criterion, (train_data, val_data, test_data) = self._from_objects(read, device)
        loader = self._loader(train_data, context)
        optimizer, scheduler = adam_with_decay(
            model.parameters(),
            lr=cfg.lr,
            lr_decay=cfg.lr_decay,
            weight_decay=cfg.weight_decay,
            schedule=cfg.lr_schedule,
            total_steps=cfg.epochs * len(loader),
        )
        state = TrainState()
        if checkpoint is not None:
            if self._objects is not None:
                check_same_model(model, checkpoint, self.run_dir)
            state = restore(self.run_dir, model, checkpoint, cfg.epochs)
        state.attach(optimizer, scheduler)
        apply_changes(self._changes, cfg, state, optimizer, scheduler)
        if context.is_main:
            prepare_run_dir(self.run_dir, cfg, state, resume=self.resume, model=model, meta=self._meta)
        examples = len(loader) * cfg.batch_size if loader.drop_last else loader.num_examples
        fast = torch.compile(model) if cfg.compile else model
        return _Session(
            context=context,
            device=device,
            model=model,
            fast_model=ScoresModel(fast, getattr(self, "_takes_targets", None)),
            criterion=criterion,
            loader=loader,
            val_data=val_data,
            test_data=test_data,
            state=state,
            examples=examples,
        )

    def _from_names(self, device: torch.device):
        """The data set's splits, the registered model and the loss that the config names (on ``device``)."""
        cfg = self.config
        train_data, test_data = self._load_data(device)
        self._classes = [str(name) for name in train_data.classes] or None  # recorded for `capsnets predict`
        self._task = task_for(cfg.model, model_task(cfg.model), train_data, cfg.dataset)
        train_data, val_data = hold_out(train_data, cfg.val_fraction, cfg.seed)
        self._task = type(self._task)(train_data)
        model = self.model = self._build_model(train_data).to(device)
        self._takes_targets = True
        criterion = self._build_loss(model)  # before anything is written: a bad --loss-arg leaves no trace
        return model, criterion, (train_data, val_data, test_data)

    def _read_objects(self) -> dict[str, Any]:
        """The data given to :meth:`fit` read into tensors; the training data's name becomes the config's
        ``dataset`` (so that a resumed run with other data is refused)."""
        objects = self._objects
        read = {"train": read_data(objects.train, "train_data")}
        for key, data in (("val", objects.val), ("test", objects.test)):
            read[key] = None if data is None else read_data(data, f"{key}_data")
        train = read["train"]
        name = getattr(train, "name", "") or type(train).__name__
        self.config.dataset = name
        return read

    def _from_objects(self, read: dict[str, Any], device: torch.device):
        """The objects given to :meth:`fit`, checked against each other, on ``device``."""
        cfg, objects = self.config, self._objects
        model = self.model = objects.model.to(device)
        self._takes_targets = None  # from the model's forward
        train = read["train"]
        images = train.images[:2].to(device)
        if getattr(train, "augment", None) is not None:  # e.g. a crop: the model sees its output
            images = train.augment(images, torch.Generator().manual_seed(0))
        width, kind = score_width(ScoresModel(model), images)
        splits = []
        for key, data in read.items():
            if isinstance(data, ReadData):
                classes = data.targets.shape[1] if data.targets.dim() == 2 else width
                data = data.labelled(classes, f"{key}_data")
            if data is not None and cfg.limit_train is not None and key == "train":
                data = data.subset(min(cfg.limit_train, len(data)))
            if data is not None and cfg.limit_test is not None and key == "test":
                data = data.subset(min(cfg.limit_test, len(data)))
            splits.append(None if data is None else data.to(device))
        train_data, val_data, test_data = splits
        check_splits(train_data, val_data, test_data, width)
        self._classes = [str(c) for c in getattr(train_data, "classes", ())] or None
        registered = model_task(cfg.model) if cfg.model in list_models() else TASKS[data_kind(train_data)].model_task
        self._task = task_for(cfg.model, registered, train_data, cfg.dataset)
        if val_data is None:
            train_data, val_data = hold_out(train_data, cfg.val_fraction, cfg.seed)
            self._task = type(self._task)(train_data)
        self._task_check(model, train_data)
        criterion = object_loss(self._objects.loss, model, kind, cfg, self._task)
        return model, criterion, (train_data, val_data, test_data)

    def _task_check(self, model: nn.Module, data: Any) -> None:
        """The task's own check, for a model that says what it expects (``num_classes``, ``input_size``)."""
        if hasattr(model, "num_classes") and hasattr(model, "input_size"):
            self._task.check_model(model, data, (self.config.model, self.config.dataset))

    def _callbacks(self, s: _Session) -> list:
        """The time limit, the evaluation and, on rank 0, the ``last`` and ``best`` checkpoints and the metrics
        log (checkpoints first: a crash between them leaves a record missing from metrics.jsonl, which a
        resumed run rewrites from the checkpoint's history). An epoch that ends the run (its last, or the time
        limit) is evaluated and checkpointed whatever ``eval_every`` / ``checkpoint_every`` say."""
        cfg = self.config
        limit = None if cfg.time_limit_minutes is None else 60.0 * cfg.time_limit_minutes
        callbacks = [
            TimeLimit(limit, context=s.context, device=s.device),
            Hook(lambda record, final: self._evaluate(s, record, final)),
        ]
        if s.context.is_main:
            callbacks += [
                ModelCheckpoint(
                    checkpoint_path(self.run_dir, "last"),
                    s.model,
                    self._meta,
                    every=cfg.checkpoint_every,
                    on_save=lambda: self._claim is not None and self._claim.committed(),
                ),
                ModelCheckpoint(checkpoint_path(self.run_dir, "best"), s.model, self._meta, best_only=True),
                Hook(lambda record, final: reporting.append_metrics(self.run_dir, record)),
            ]
        return callbacks

    def _evaluate(self, s: _Session, record: dict[str, Any], final: bool) -> None:
        """Complete the epoch's record: its time, throughput and, if due, the validation (and test) evaluation;
        choose the best on the validation split."""
        cfg, state = self.config, s.state
        record.update(epoch_time_s=record.pop("time_s"), train_time_s=state.train_time_s)
        record["images_per_s"] = s.examples / max(record["epoch_time_s"], 1e-9)
        due = state.epoch % cfg.eval_every == 0 or final
        if due and s.val_data is not None:
            record.update(reporting.validation_entries(self._scores(s, s.fast_model, s.val_data)))
        if s.test_data is not None and (final or (due and cfg.test_each_epoch)):
            record.update(self._scores(s, s.fast_model, s.test_data))
        if s.val_data is not None:
            state.best = best_index(state.history, reporting.validation_key(self._task.best_metric))

    def _scores(self, s: _Session, model: nn.Module, data: Any) -> dict[str, Any]:
        """The task's evaluation of ``model`` on ``data`` (entries named ``test_*``)."""
        cfg = self.config
        return self._task.evaluate(model, data, cfg.batch_size, s.device, cfg.amp, s.criterion, context=s.context)

    # -- set-up ---------------------------------------------------------------------------------------------
    def _load_data(self, device: torch.device):
        cfg = self.config
        splits = []
        for train, limit in ((True, cfg.limit_train), (False, cfg.limit_test)):
            data = load_dataset(
                cfg.dataset, root=cfg.data_dir, train=train, download=cfg.download, image_size=cfg.image_size
            )
            splits.append((data.subset(min(limit, len(data))) if limit is not None else data).to(device))
        return splits

    def _build_model(self, data) -> nn.Module:
        """Build the model; ``num_classes`` and ``input_size`` default to the data set's (saved in the config)."""
        accepted = model_arguments(self.config.model)
        for key, value in self._task.model_defaults(data).items():
            if key in accepted and key not in self.config.model_args:
                self.config.model_args[key] = value
        pretrained = None if self.resume else self.config.pretrained  # a resumed run has its own weights
        model = build_model(self.config.model, self.config.model_args, pretrained=pretrained)
        recorded = getattr(model, "model_args", {})  # e.g. an argument whose default changed: named from now on
        self.config.model_args.update({k: v for k, v in recorded.items() if k not in self.config.model_args})
        self._task.check_model(model, data, (self.config.model, self.config.dataset))
        return model

    def _build_loss(self, model: nn.Module) -> nn.Module:
        name = self._task.loss_name(
            self.config.loss or model.default_loss, model.default_loss, self.config.loss is not None
        )
        criterion = create_loss(name, **self.config.loss_args)
        weight = getattr(criterion, "reconstruction_weight", 0)
        if "reconstruction_weight" in self.config.loss_args and weight > 0 and getattr(model, "decoder", 0) is None:
            raise ArgumentError(
                f"reconstruction_weight={weight} would have no effect: model {self.config.model!r} "
                f"was built without a decoder (reconstruction=false); drop one of the two"
            )
        return criterion

    def _loader(self, data, context: distributed.DistContext):
        cfg = self.config
        augment = None
        if not self._task.image_augmentation and (cfg.augment is not None or cfg.max_shift):
            flag = "--augment" if cfg.augment is not None else "--max-shift"
            raise ArgumentError(
                f"{flag}: a {self._task.name} run does not shift or augment its images, as their targets would not "
                f"follow; drop {flag}"
            )
        if cfg.augment is not None:
            if data.augment is not None:
                raise ArgumentError(
                    f"--augment {cfg.augment}: the {cfg.dataset} data set has its own training "
                    "augmentation; drop --augment"
                )
            augment = AUGMENTATIONS[cfg.augment]()
        loader = DeviceLoader(
            self._task.loader_data(data),
            cfg.batch_size,
            shuffle=True,
            drop_last=context.enabled,
            max_shift=cfg.resolved_max_shift(data.images.shape[-2], data.augment)
            if self._task.image_augmentation
            else 0,
            seed=cfg.seed,
            rank=context.rank,
            world_size=context.world_size,
            augment=augment,
        )
        if len(loader) == 0:
            raise ArgumentError(
                f"batch_size={cfg.batch_size} is larger than the {len(data)} training examples "
                f"shared by {context.world_size} processes; lower --batch-size"
            )
        if len(loader) < FEW_STEPS and context.is_main:
            logger.warning(
                "%d step%s per epoch at batch %d (%d training images): few optimiser steps per epoch learn "
                "little; use a smaller --batch-size (e.g. %d) or more --epochs",
                len(loader),
                "" if len(loader) == 1 else "s",
                cfg.batch_size,
                len(data),
                max(1, len(data) // FEW_STEPS),
            )
        return loader

    # -- per epoch / end of run -----------------------------------------------------------------------------
    def _meta(self, state: TrainState, record: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        return {
            "model": cfg.model,
            "model_args": cfg.to_dict()["model_args"],
            "model_class": f"{type(self.model).__module__}.{type(self.model).__qualname__}",
            "dataset": cfg.dataset,
            "classes": getattr(self, "_classes", None),
            "config": cfg.to_dict(),
            "epoch": state.epoch,
            "metrics": record,
            **self._task.meta(state.history, record),
        }

    def _summary(self, s: _Session) -> dict[str, Any]:
        """The run's figures: the last evaluation's, and the ``best`` checkpoint's (chosen on the validation split;
        its test scores are its epoch's where that epoch was scored on the test split, the same weights, else
        scored here, once)."""
        cfg, state = self.config, s.state
        best = dict(state.history[state.best]) if state.best is not None else {}
        if best and self._task.best_metric not in best:
            best.update(self._best_test_scores(s))
        return {
            "model": cfg.model,
            "dataset": cfg.dataset,
            "task": self._task.name,
            "epochs": state.epoch,
            **self._task.summary(state.history, best),
            "best_epoch": best.get("epoch"),
            **reporting.best_entries(best, self._task.best_metric, s.val_data),
            "train_time_s": state.train_time_s,
            "parameters": sum(p.numel() for p in s.model.parameters()),
            "device": str(s.device),
            "device_name": _device_name(s.device),
            "world_size": s.context.world_size,
            "batch_size": cfg.batch_size,
            "amp": cfg.amp,
            "compile": cfg.compile,
            "torch": torch.__version__,
            "capsnets": capsnets.__version__,
            "run_dir": str(self.run_dir),
        }

    def _best_test_scores(self, s: _Session) -> dict[str, Any]:
        """The test split's scores of the ``best`` checkpoint (every process takes part), or ``{}`` without test
        data or a readable ``best`` checkpoint."""
        if s.test_data is None:
            return {}
        if s.context.enabled:  # rank 0 has saved best before it gets here
            torch.distributed.barrier()
        path = checkpoint_path(self.run_dir, "best")
        try:
            checkpoint = load_checkpoint(path)
        except (CheckpointError, OSError) as err:
            logger.warning("the best checkpoint is not scored on the test split: %s", err)
            return {}
        model = copy.deepcopy(s.model)
        restore_model(model, checkpoint)
        return self._scores(s, ScoresModel(model, s.fast_model.takes_targets), s.test_data)

    def _finish(self, summary: dict[str, Any], s: _Session, trained: bool) -> None:
        """Write the summary and, if this call trained or a figure the summary lists is missing (a run killed while
        drawing them), the figures of the best checkpoint (of the last without a validation split), unless the
        config's ``figures`` is False."""
        drawn = None if trained else reporting.drawn_figures(self.run_dir)
        if not self.config.figures:
            drawn = {"figures": [], "figures_checkpoint": None}
        summary.update(drawn or {})
        reporting.write_summary(self.run_dir, summary)
        name = "best" if s.state.best is not None else "last"
        path = checkpoint_path(self.run_dir, name)
        if drawn is not None or not path.is_file():
            return
        checkpoint = load_checkpoint(path)
        label = f"{path.name} (epoch {checkpoint.meta.get('epoch')}"
        if s.test_data is None:  # nothing to score: the training curves alone
            figures = reporting.save_figures(
                self.run_dir, confusion=None, class_names=[], samples=None, checkpoint=label + ")"
            )
            summary.update(figures=[str(p) for p in figures], figures_checkpoint=label + ")")
            reporting.write_summary(self.run_dir, summary)
            return
        model = copy.deepcopy(s.model)
        restore_model(model, checkpoint)
        figures, shown = self._task.figures(
            self.run_dir,
            ScoresModel(model, s.fast_model.takes_targets),
            s.test_data,
            batch_size=self.config.batch_size,
            device=s.device,
            amp=self.config.amp,
            checkpoint=label,
        )
        summary.update(figures=[str(p) for p in figures], figures_checkpoint=shown)
        reporting.write_summary(self.run_dir, summary)
        logger.info("figures of %s in %s", shown, self.run_dir)


def train(config: TrainConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train the registered model on the data set that ``config`` names and return the summary (what
    ``capsnets train`` runs); see :meth:`Trainer.fit` and :meth:`Trainer.from_config`."""
    return Trainer.from_config(config, resume=resume, overwrite=overwrite).fit()


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
