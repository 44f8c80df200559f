"""The training loop around a registered model: data, optimiser, schedule, evaluation, checkpoints.

Sabour et al. 2017 train CapsNet with Adam and an exponentially decaying learning rate; here the decay
is applied once per epoch (``ExponentialLR``). The trainer only uses a model's ``ModelOutput.scores``,
``reconstruction`` and ``default_loss``: it knows nothing of capsules.

The training is :func:`~capsnets.engine.fit` with callbacks (:mod:`capsnets.engine.callbacks`): a time limit,
the test evaluation, the ``last`` and ``best`` checkpoints and the metrics log.

What differs between tasks (one class per image, several, a class per pixel) is a
:class:`~capsnets.engine.tasks.Task` chosen from the data (:func:`~capsnets.engine.tasks.task_for`): the model's
default arguments, the losses that fit, the training batch's scores, the test evaluation, the metric that chooses
the ``best`` checkpoint, and what checkpoints, ``summary.json`` and the figures add.

Run directory (``config.out``): ``config.yaml``, ``metrics.jsonl`` (one line per epoch),
``last``/``best`` checkpoints (``.safetensors`` + ``.json``), ``summary.json`` and figures. A fresh run never
replaces another run's directory unless asked to (``overwrite``), and a resumed run refuses changes that would
make it another run (:mod:`capsnets.engine.run_dir`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import capsnets
from capsnets.checkpoints import Checkpoint, CheckpointError, load_checkpoint
from capsnets.data import AUGMENTATIONS, DeviceLoader, load_dataset
from capsnets.engine import distributed, reporting
from capsnets.engine.callbacks import Hook, ModelCheckpoint, TimeLimit, checkpoint_path, resume_state
from capsnets.engine.config import TrainConfig
from capsnets.engine.fit import NonFiniteLossError, TrainState, adam_with_decay, fit, training_step
from capsnets.engine.run_dir import RunDirectory, RunDirectoryError, check_best, repair_best, resume_changes
from capsnets.engine.runtime import deterministic_on_cpu, resolve_amp, seed_everything, stop_on_signals, torch_threads
from capsnets.engine.tasks import best_index, task_for
from capsnets.losses import create_loss
from capsnets.models import model_arguments, model_task
from capsnets.models.hub import build_model, restore_model

logger = logging.getLogger(__name__)

#: Fewer optimiser steps per epoch than this get a warning (a small data set at a large batch).
FEW_STEPS = 10


@dataclass
class _Session:
    """Everything one call of :meth:`Trainer.fit` works with."""

    context: distributed.DistContext
    device: torch.device
    model: torch.nn.Module  # the bare model: checkpoints
    fast_model: torch.nn.Module  # compiled or bare: evaluation
    criterion: Any
    loader: Any
    test_data: Any
    state: TrainState
    examples: int  # training examples per epoch (all ranks)


class Trainer:
    """Train ``config.model`` on ``config.dataset``; see :class:`~capsnets.engine.config.TrainConfig`.

    Args:
        config: the run's configuration.
        resume: continue from ``<out>/last.safetensors`` (weights, optimizer, scheduler, RNG, epoch). The config
            may change what can be applied from the resumed epoch on (more epochs, learning rate and its decay,
            weight decay, device, threads, evaluation and checkpoint intervals, time limit; logged and recorded);
            a change of the model, its arguments, the data, batch size, seed or loss is refused.
        overwrite: a fresh run may replace the run in ``config.out``: the old run is moved aside and deleted once
            the new run has saved its first checkpoint (put back if the new run fails before). Without it, a
            fresh run into a directory holding another run is refused.

    In a single process in the main thread, the first Ctrl-C or SIGTERM during the training stops it at the next
    step with a resumable ``last`` checkpoint of that step, and raises
    :class:`~capsnets.engine.fit.TrainingInterrupted`; ``resume`` continues it bit for bit. A second signal stops
    it at once, keeping the checkpoints saved before.

    Examples:
        >>> summary = Trainer(TrainConfig(epochs=1, out="runs/quick")).fit()  # doctest: +SKIP
    """

    def __init__(self, config: TrainConfig, *, resume: bool = False, overwrite: bool = False) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        if resume and overwrite:
            raise RunDirectoryError("resume continues the run and overwrite replaces it: pass one of them")
        self.config, self.resume, self.overwrite = config, resume, overwrite
        self.run_dir = Path(config.out)
        self.model: torch.nn.Module | None = None  # the trained (bare) model once fit() has run
        self._claim: RunDirectory | None = None
        self._changes: dict[str, tuple[Any, Any]] = {}

    def fit(self) -> dict[str, Any]:
        """Run the training; returns the summary (also written to ``summary.json`` by rank 0)."""
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

        step = training_step(compute, optimizer, device=device, amp_dtype=resolve_amp(cfg.amp, device), model=s.model)
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
        summary = self._summary(s.state, s.model, device, context)
        summary.update(planned_epochs=cfg.epochs, time_limited=not s.state.finished)
        if context.is_main:
            self._finish(summary, s, trained=s.state.epoch > trained_before)
        return summary

    def _set_up(self, context: distributed.DistContext, device: torch.device) -> _Session:
        """Seed, load data, build model, loss, optimizer and schedule; restore them when resuming."""
        cfg = self.config
        checkpoint = self._resume_checkpoint() if self.resume else None
        seed_everything(cfg.seed)
        train_data, test_data = self._load_data(device)
        self._classes = [str(name) for name in train_data.classes] or None  # recorded for `capsnets predict`
        self._task = task_for(cfg.model, model_task(cfg.model), train_data, cfg.dataset)
        model = self.model = self._build_model(train_data).to(device)
        criterion = self._build_loss(model)  # before anything is written: a bad --loss-arg leaves no trace
        optimizer, scheduler = adam_with_decay(
            model.parameters(), lr=cfg.lr, lr_decay=cfg.lr_decay, weight_decay=cfg.weight_decay
        )
        state = self._restore(model, checkpoint) if checkpoint is not None else TrainState()
        state.attach(optimizer, scheduler)
        if checkpoint is not None:
            self._apply_changes(state, optimizer, scheduler)
        if context.is_main:
            self._prepare_run_dir(state)
        loader = self._loader(train_data, context)
        examples = len(loader) * cfg.batch_size if loader.drop_last else loader.num_examples
        return _Session(
            context=context,
            device=device,
            model=model,
            fast_model=torch.compile(model) if cfg.compile else model,
            criterion=criterion,
            loader=loader,
            test_data=test_data,
            state=state,
            examples=examples,
        )

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
        """Complete the epoch's record: its time, throughput and, if due, the test evaluation; choose the best."""
        cfg, state = self.config, s.state
        record.update(epoch_time_s=record.pop("time_s"), train_time_s=state.train_time_s)
        record["images_per_s"] = s.examples / max(record["epoch_time_s"], 1e-9)
        if state.epoch % cfg.eval_every == 0 or final:
            record.update(
                self._task.evaluate(
                    s.fast_model, s.test_data, cfg.batch_size, s.device, cfg.amp, s.criterion, context=s.context
                )
            )
        state.best = best_index(state.history, self._task.best_metric)

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

    def _build_model(self, data) -> torch.nn.Module:
        """Build the model; ``num_classes`` and ``input_size`` default to the data set's (saved in the config)."""
        accepted = model_arguments(self.config.model)
        for key, value in self._task.model_defaults(data).items():
            if key in accepted and key not in self.config.model_args:
                self.config.model_args[key] = value
        model = build_model(self.config.model, self.config.model_args)
        recorded = getattr(model, "model_args", {})  # e.g. an argument whose default changed: named from now on
        self.config.model_args.update({k: v for k, v in recorded.items() if k not in self.config.model_args})
        self._task.check_model(model, data, (self.config.model, self.config.dataset))
        return model

    def _build_loss(self, model: torch.nn.Module) -> torch.nn.Module:
        name = self._task.loss_name(
            self.config.loss or model.default_loss, model.default_loss, self.config.loss is not None
        )
        criterion = create_loss(name, **self.config.loss_args)
        weight = getattr(criterion, "reconstruction_weight", 0)
        if "reconstruction_weight" in self.config.loss_args and weight > 0 and getattr(model, "decoder", 0) is None:
            raise ValueError(
                f"reconstruction_weight={weight} would have no effect: model {self.config.model!r} "
                f"was built without a decoder (reconstruction=false); drop one of the two"
            )
        return criterion

    def _loader(self, data, context: distributed.DistContext):
        cfg = self.config
        augment = None
        if not self._task.image_augmentation and (cfg.augment is not None or cfg.max_shift):
            flag = "--augment" if cfg.augment is not None else "--max-shift"
            raise ValueError(
                f"{flag}: a {self._task.name} run does not shift or augment its images, as their targets would not "
                f"follow; drop {flag}"
            )
        if cfg.augment is not None:
            if data.augment is not None:
                raise ValueError(
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
            raise ValueError(
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

    def _resume_checkpoint(self) -> Checkpoint:
        """``<out>/last``, after checking that the config resumes the run it holds (:func:`resume_changes`); the
        config's model arguments become the run's."""
        path = checkpoint_path(self.run_dir, "last")
        if not path.is_file():
            raise CheckpointError(f"cannot resume: no checkpoint '{path}'; train without --resume first")
        checkpoint = load_checkpoint(path)
        saved = checkpoint.meta.get("config")
        if saved is not None:
            cfg = self.config
            self._changes = resume_changes(
                saved, cfg.to_dict(), model_arguments(saved.get("model", cfg.model)), str(self.run_dir)
            )
            cfg.model_args = {**saved.get("model_args", {}), **cfg.model_args}
        return checkpoint

    def _restore(self, model, checkpoint: Checkpoint) -> TrainState:
        """The state of the checkpoint, with the model's weights loaded and the checkpoint kept in it for
        :meth:`TrainState.attach` (optimizer, scheduler and RNG)."""
        state = resume_state(checkpoint, model)
        if self.config.epochs < state.epoch:
            raise RunDirectoryError(
                f"the run in '{self.run_dir}' has trained {state.epoch} epochs; --epochs "
                f"{self.config.epochs} is fewer: resume with --epochs {state.epoch} or more"
            )
        check_best(self.run_dir, state)
        logger.info("resuming from %s after epoch %d", checkpoint.path, state.epoch)
        return state

    def _apply_changes(self, state: TrainState, optimizer, scheduler) -> None:
        """Apply and record what the resumed run changes (:data:`~capsnets.engine.run_dir.CHANGEABLE`). A new
        learning rate, decay or weight decay takes effect as if the run had been configured with it: epoch ``e``
        trains at ``lr * lr_decay**e``."""
        if not self._changes:
            return
        cfg = self.config
        for name, (old, new) in self._changes.items():
            logger.warning("resuming with %s %s (was %s)", name, new, old)
        if {"lr", "lr_decay", "weight_decay"} & set(self._changes):
            scheduler.base_lrs = [cfg.lr] * len(optimizer.param_groups)
            scheduler.gamma = cfg.lr_decay
            for group in optimizer.param_groups:
                group.update(
                    initial_lr=cfg.lr, lr=cfg.lr * cfg.lr_decay**scheduler.last_epoch, weight_decay=cfg.weight_decay
                )
            scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
            logger.warning("epoch %d trains at learning rate %.4g", state.epoch + 1, optimizer.param_groups[0]["lr"])
        state.extra.setdefault("resumed_with", []).append(
            {"epoch": state.epoch, **{name: new for name, (_, new) in self._changes.items()}}
        )

    def _prepare_run_dir(self, state: TrainState) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config.save(self.run_dir / "config.yaml")
        if self.resume:  # the checkpoint's records are the run's: a torn or longer metrics.jsonl is rewritten
            try:
                on_disk = reporting.read_metrics(self.run_dir, state.epoch)
            except ValueError as err:
                if not state.history:
                    raise
                logger.warning("%s; rewriting it from the checkpoint", err)
                on_disk = None
            reporting.write_metrics(self.run_dir, state.history or on_disk)
            repair_best(self.run_dir, state, self.model, self._meta)
        else:
            (self.run_dir / reporting.METRICS_FILE).unlink(missing_ok=True)

    # -- per epoch / end of run -----------------------------------------------------------------------------
    def _meta(self, state: TrainState, record: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        return {
            "model": cfg.model,
            "model_args": cfg.to_dict()["model_args"],
            "dataset": cfg.dataset,
            "classes": getattr(self, "_classes", None),
            "config": cfg.to_dict(),
            "epoch": state.epoch,
            "metrics": record,
            **self._task.meta(state.history, record),
        }

    def _summary(self, state: TrainState, model, device, context) -> dict[str, Any]:
        cfg = self.config
        best = state.history[state.best] if state.best is not None else {}
        return {
            "model": cfg.model,
            "dataset": cfg.dataset,
            "task": self._task.name,
            "epochs": state.epoch,
            **self._task.summary(state.history, best),
            "best_epoch": best.get("epoch"),
            "train_time_s": state.train_time_s,
            "parameters": sum(p.numel() for p in model.parameters()),
            "device": str(device),
            "device_name": _device_name(device),
            "world_size": context.world_size,
            "batch_size": cfg.batch_size,
            "amp": cfg.amp,
            "compile": cfg.compile,
            "torch": torch.__version__,
            "capsnets": capsnets.__version__,
            "run_dir": str(self.run_dir),
        }

    def _finish(self, summary: dict[str, Any], s: _Session, trained: bool) -> None:
        """Write the summary and, if this call trained or a figure the summary lists is missing (a run killed while
        drawing them), the figures of the best checkpoint."""
        drawn = None if trained else reporting.drawn_figures(self.run_dir)
        summary.update(drawn or {})
        reporting.write_summary(self.run_dir, summary)
        best = checkpoint_path(self.run_dir, "best")
        if drawn is not None or not best.is_file():
            return
        model = copy.deepcopy(s.model)
        restore_model(model, load_checkpoint(best))
        figures, shown = self._task.figures(
            self.run_dir,
            model,
            s.test_data,
            batch_size=self.config.batch_size,
            device=s.device,
            amp=self.config.amp,
            checkpoint=f"{best.name} (epoch {summary['best_epoch']}",
        )
        summary.update(figures=[str(p) for p in figures], figures_checkpoint=shown)
        reporting.write_summary(self.run_dir, summary)
        logger.info("figures of %s in %s", shown, self.run_dir)


def train(config: TrainConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train as described by ``config`` and return the summary; see :class:`Trainer`."""
    return Trainer(config, resume=resume, overwrite=overwrite).fit()


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
