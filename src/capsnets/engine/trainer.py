"""The training loop around a registered model: data, optimiser, schedule, evaluation, checkpoints.

Sabour et al. 2017 train CapsNet with Adam and an exponentially decaying learning rate; here the decay
is applied once per epoch (``ExponentialLR``). The trainer only uses a model's ``ModelOutput.scores``,
``reconstruction`` and ``default_loss``: it knows nothing of capsules.

Run directory (``config.out``): ``config.yaml``, ``metrics.jsonl`` (one line per epoch),
``last``/``best`` checkpoints (``.safetensors`` + ``.json``), ``summary.json`` and figures.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import capsnets
from capsnets.engine import checkpoint as ckpt
from capsnets.engine import distributed, reporting
from capsnets.engine.config import TrainConfig
from capsnets.engine.evaluate import evaluate
from capsnets.engine.loop import train_one_epoch
from capsnets.engine.runtime import deterministic_on_cpu, resolve_amp, restore_rng_state, seed_everything

logger = logging.getLogger(__name__)

#: Test accuracies whose first crossing time is reported in ``summary.json["time_to_accuracy"]``.
ACCURACY_TARGETS = (0.99, 0.995, 0.996)


@dataclass
class RunState:
    """Progress that a resumed run must carry on from (stored in the checkpoint sidecar)."""

    epoch: int = 0
    train_time_s: float = 0.0
    test_accuracy: float | None = None
    best_test_accuracy: float | None = None
    best_epoch: int | None = None
    time_to_accuracy: dict[str, float | None] = field(
        default_factory=lambda: {str(t): None for t in ACCURACY_TARGETS})

    def record_test(self, accuracy: float, epoch: int) -> bool:
        """Note a test accuracy; return True if it is a new best."""
        self.test_accuracy = accuracy
        for target, reached in self.time_to_accuracy.items():
            if reached is None and accuracy >= float(target):
                self.time_to_accuracy[target] = self.train_time_s
        if self.best_test_accuracy is None or accuracy > self.best_test_accuracy:
            self.best_test_accuracy, self.best_epoch = accuracy, epoch
            return True
        return False


@dataclass
class _Session:
    """Everything one call of :meth:`Trainer.fit` works with."""

    context: distributed.DistContext
    device: torch.device
    amp_dtype: torch.dtype | None
    model: torch.nn.Module  # the bare model: checkpoints
    fast_model: torch.nn.Module  # compiled or bare: evaluation
    train_model: torch.nn.Module  # DDP-wrapped or fast_model: training steps
    criterion: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loader: Any
    test_data: Any
    state: RunState


class Trainer:
    """Train ``config.model`` on ``config.dataset``; see :class:`~capsnets.engine.config.TrainConfig`.

    Args:
        config: the run's configuration.
        resume: continue from ``<out>/last.safetensors`` (weights, optimizer, scheduler, RNG, epoch).

    Examples:
        >>> summary = Trainer(TrainConfig(epochs=1, out="runs/quick")).fit()  # doctest: +SKIP
    """

    def __init__(self, config: TrainConfig, *, resume: bool = False) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        self.config, self.resume = config, resume
        self.run_dir = Path(config.out)
        self.model: torch.nn.Module | None = None  # the trained (bare) model once fit() has run

    def fit(self) -> dict[str, Any]:
        """Run the training; returns the summary (also written to ``summary.json`` by rank 0)."""
        context, device = distributed.setup(self.config.device)
        try:
            with deterministic_on_cpu(device):
                return self._fit(context, device)
        finally:
            distributed.teardown(context)

    def _fit(self, context: distributed.DistContext, device: torch.device) -> dict[str, Any]:
        session = self._set_up(context, device)
        evaluation, time_limited, began = None, False, time.perf_counter()
        for epoch in range(session.state.epoch + 1, self.config.epochs + 1):
            result, time_limited = self._run_epoch(session, epoch, began)
            evaluation = result or evaluation
            if time_limited:
                logger.info("time limit of %g minutes reached after epoch %d of %d; continue with --resume",
                            self.config.time_limit_minutes, epoch, self.config.epochs)
                break
        summary = self._summary(session.state, session.model, device, context)
        summary.update(planned_epochs=self.config.epochs, time_limited=time_limited)
        if context.is_main:
            self._finish(summary, session.fast_model, session.test_data, device, evaluation)
        return summary

    def _set_up(self, context: distributed.DistContext, device: torch.device) -> "_Session":
        """Seed, load data, build model, loss, optimizer and schedule; restore them when resuming."""
        cfg = self.config
        seed_everything(cfg.seed)
        train_data, test_data = self._load_data(device)
        model = self.model = self._build_model(train_data).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=cfg.lr_decay)
        state = self._restore(model, optimizer, scheduler) if self.resume else RunState()
        if context.is_main:
            self._prepare_run_dir(state)
        fast_model = torch.compile(model) if cfg.compile else model
        return _Session(context=context, device=device, amp_dtype=resolve_amp(cfg.amp, device), model=model,
                        fast_model=fast_model, train_model=distributed.wrap_model(fast_model, context, device),
                        criterion=self._build_loss(model), optimizer=optimizer, scheduler=scheduler,
                        loader=self._loader(train_data, context), test_data=test_data, state=state)

    def _out_of_time(self, began: float, context: distributed.DistContext, device: torch.device) -> bool:
        """Whether this call has run ``time_limit_minutes`` since set-up; all processes follow rank 0."""
        limit = self.config.time_limit_minutes
        if limit is None:
            return False
        flag = torch.tensor(float(time.perf_counter() - began >= 60.0 * limit), device=device)
        if context.enabled:
            torch.distributed.broadcast(flag, src=0)
        return bool(flag.item())

    def _run_epoch(self, s: "_Session", epoch: int, began: float) -> tuple[dict[str, Any] | None, bool]:
        """Train one epoch, step the schedule, evaluate if due, save.

        Returns the evaluation (None if none was due) and whether the time limit stops the run after this
        epoch; such an epoch is evaluated and checkpointed whatever ``eval_every`` / ``checkpoint_every`` say."""
        cfg, state = self.config, s.state
        s.loader.set_epoch(epoch - 1)
        lr = s.optimizer.param_groups[0]["lr"]
        result = train_one_epoch(s.train_model, s.loader, s.criterion, s.optimizer, epoch=epoch, device=s.device,
                                 amp_dtype=s.amp_dtype, context=s.context, progress=cfg.progress,
                                 before_step=self._loss_schedule(s, epoch))
        stop = epoch < cfg.epochs and self._out_of_time(began, s.context, s.device)
        s.scheduler.step()
        state.epoch, state.train_time_s = epoch, state.train_time_s + result.time_s
        record = {"epoch": epoch, "train_loss": result.loss, "train_accuracy": result.accuracy, "lr": lr,
                  "epoch_time_s": result.time_s, "images_per_s": result.images_per_s,
                  "train_time_s": state.train_time_s}
        evaluation, is_best = None, False
        if epoch % cfg.eval_every == 0 or epoch == cfg.epochs or stop:
            evaluation = evaluate(s.fast_model, s.test_data, cfg.batch_size, s.device, cfg.amp, s.criterion,
                                  context=s.context)
            record.update(test_loss=evaluation["loss"], test_accuracy=evaluation["accuracy"])
            is_best = state.record_test(evaluation["accuracy"], epoch)
        if s.context.is_main:
            self._save_epoch(record, state, s.model, s.optimizer, s.scheduler, is_best, last=stop)
        return evaluation, stop

    def _loss_schedule(self, s: "_Session", epoch: int):
        """If the loss has a schedule (``set_progress``), tell it the fraction of training done per step."""
        if not hasattr(s.criterion, "set_progress"):
            return None
        steps, epochs = len(s.loader), self.config.epochs
        return lambda step: s.criterion.set_progress((epoch - 1 + (step - 1) / steps) / epochs)

    # -- set-up ---------------------------------------------------------------------------------------------
    def _load_data(self, device: torch.device):
        from capsnets.data import load_dataset

        cfg = self.config
        splits = []
        for train, limit in ((True, cfg.limit_train), (False, cfg.limit_test)):
            data = load_dataset(cfg.dataset, root=cfg.data_dir, train=train, download=cfg.download)
            splits.append((data.subset(min(limit, len(data))) if limit is not None else data).to(device))
        return splits

    def _build_model(self, data) -> torch.nn.Module:
        """Build the model; ``num_classes`` and ``input_size`` default to the data set's (saved in the config)."""
        from capsnets.models import model_arguments, model_task

        task = model_task(self.config.model)
        if task != "classification":
            where = {"segmentation": "`capsnets experiment segmentation` trains segmentation models",
                     "synthesis": "`capsnets experiment synthesis` trains synthesis generators (train_pix2pix)",
                     "autoencoder": "see the README for training the transforming auto-encoder"}[task]
            raise ValueError(f"model {self.config.model!r} is a {task} model; the trainer trains classifiers; {where}")
        accepted = model_arguments(self.config.model)
        for key, value in (("num_classes", data.num_classes), ("input_size", list(data.input_shape))):
            if key in accepted and key not in self.config.model_args:
                self.config.model_args[key] = value
        model = ckpt.build_model(self.config.model, self.config.model_args, recorded=self.resume)
        recorded = getattr(model, "model_args", {})  # e.g. an argument whose default changed: named from now on
        self.config.model_args.update({k: v for k, v in recorded.items() if k not in self.config.model_args})
        expected_shape = tuple(data.input_shape)  # after the data set's own augmentation (e.g. crops)
        if int(model.num_classes) != data.num_classes or tuple(model.input_size) != expected_shape:
            raise ValueError(
                f"model {self.config.model!r} expects {model.num_classes} classes of {tuple(model.input_size)} "
                f"images but dataset {self.config.dataset!r} has {data.num_classes} classes of {expected_shape}; "
                f"pick another model or pass --model-arg num_classes=... --model-arg input_size=...")
        return model

    def _build_loss(self, model: torch.nn.Module) -> torch.nn.Module:
        from capsnets.losses import create_loss

        return create_loss(self.config.loss or model.default_loss, **self.config.loss_args)

    def _loader(self, data, context: distributed.DistContext):
        from capsnets.data import DeviceLoader

        cfg = self.config
        loader = DeviceLoader(data, cfg.batch_size, shuffle=True, drop_last=context.enabled,
                              max_shift=cfg.resolved_max_shift(data.images.shape[-2], data.augment), seed=cfg.seed,
                              rank=context.rank, world_size=context.world_size)
        if len(loader) == 0:
            raise ValueError(f"batch_size={cfg.batch_size} is larger than the {len(data)} training examples "
                             f"shared by {context.world_size} processes; lower --batch-size")
        return loader

    def _restore(self, model, optimizer, scheduler) -> RunState:
        path = self.run_dir / f"last{ckpt.SUFFIX}"
        if not path.is_file():
            raise ckpt.CheckpointError(f"cannot resume: no checkpoint '{path}'; train without --resume first")
        checkpoint = ckpt.load_checkpoint(path)
        ckpt.restore_model(model, checkpoint)
        ckpt.restore_training(checkpoint, optimizer, scheduler)
        restore_rng_state(checkpoint.tensors)
        logger.info("resuming from %s after epoch %d", path, checkpoint.meta["progress"]["epoch"])
        return RunState(**checkpoint.meta["progress"])

    def _prepare_run_dir(self, state: RunState) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config.save(self.run_dir / "config.yaml")
        if self.resume:
            reporting.truncate_metrics(self.run_dir, state.epoch)
        else:
            (self.run_dir / reporting.METRICS_FILE).unlink(missing_ok=True)

    # -- per epoch / end of run -----------------------------------------------------------------------------
    def _save_epoch(self, record, state: RunState, model, optimizer, scheduler, is_best: bool,
                    last: bool = False) -> None:
        cfg = self.config
        reporting.append_metrics(self.run_dir, record)
        meta = {"model": cfg.model, "model_args": cfg.to_dict()["model_args"], "dataset": cfg.dataset,
                "config": cfg.to_dict(), "epoch": state.epoch, "metrics": record, "progress": asdict(state)}
        if state.epoch % cfg.checkpoint_every == 0 or state.epoch == cfg.epochs or last:
            ckpt.save_checkpoint(self.run_dir / f"last{ckpt.SUFFIX}", model=model, meta=meta,
                                 optimizer=optimizer, scheduler=scheduler)
        if is_best:
            ckpt.save_checkpoint(self.run_dir / f"best{ckpt.SUFFIX}", model=model, meta=meta)
        logger.info("epoch %d/%d: %s", state.epoch, cfg.epochs,
                    ", ".join(f"{k} {v:.4g}" for k, v in record.items() if k != "epoch"))

    def _summary(self, state: RunState, model, device, context) -> dict[str, Any]:
        cfg = self.config
        return {"model": cfg.model, "dataset": cfg.dataset, "epochs": state.epoch,
                "test_accuracy": state.test_accuracy, "best_test_accuracy": state.best_test_accuracy,
                "best_epoch": state.best_epoch, "train_time_s": state.train_time_s,
                "time_to_accuracy": state.time_to_accuracy,
                "parameters": sum(p.numel() for p in model.parameters()),
                "device": str(device), "device_name": _device_name(device), "world_size": context.world_size,
                "batch_size": cfg.batch_size, "amp": cfg.amp, "compile": cfg.compile,
                "torch": torch.__version__, "capsnets": capsnets.__version__, "run_dir": str(self.run_dir)}

    def _finish(self, summary, model, test_data, device, evaluation) -> None:
        reporting.write_summary(self.run_dir, summary)
        if evaluation is None:  # nothing was trained in this call (resumed a finished run)
            return
        samples = _reconstruction_samples(model, test_data, device)
        figures = reporting.save_figures(self.run_dir, confusion=evaluation["confusion_matrix"],
                                         class_names=list(test_data.classes), samples=samples)
        summary["figures"] = [str(p) for p in figures]
        reporting.write_summary(self.run_dir, summary)


def train(config: TrainConfig, *, resume: bool = False) -> dict[str, Any]:
    """Train as described by ``config`` and return the summary; see :class:`Trainer`."""
    return Trainer(config, resume=resume).fit()


@torch.no_grad()
def _reconstruction_samples(model, data, device, count: int = 16) -> dict[str, torch.Tensor] | None:
    """Inputs, reconstructions, labels and predictions of the first ``count`` examples, or None."""
    was_training = model.training
    model.eval()
    images = data.images[:count].to(device)
    output = model(images)
    model.train(was_training)
    if output.reconstruction is None:
        return None
    return {"images": images.cpu(), "reconstructions": output.reconstruction.float().cpu(),
            "labels": data.labels[:count].cpu(), "predictions": output.scores.argmax(-1).cpu()}


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
