"""What a training does with its run directory before it trains: a resumed run reads its ``last`` checkpoint and
checks that the configuration continues it (:func:`read_last`), takes its state back (:func:`restore`), applies
what it may change (:func:`apply_changes`); every run writes its ``config.yaml``, and a resumed one makes the
directory's records the checkpoint's (:func:`prepare_run_dir`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from capsnets.checkpoints import Checkpoint, CheckpointError, load_checkpoint
from capsnets.engine import reporting
from capsnets.engine.callbacks import checkpoint_path, resume_state
from capsnets.engine.config import TrainConfig
from capsnets.engine.fit import TrainState
from capsnets.engine.run_dir import RunDirectoryError, check_best, repair_best, resume_changes
from capsnets.models import list_models, model_arguments
from capsnets.validation import ArgumentError

__all__ = ["apply_changes", "prepare_run_dir", "read_last", "restore"]

logger = logging.getLogger(__name__)

#: The value of each field added to :class:`~capsnets.engine.config.TrainConfig` since 0.2 that reproduces a run
#: saved without it: such a run held out no validation split.
TRAINED_BEFORE_FIELD = {"val_fraction": 0.0}


def read_last(run_dir: Path, config: TrainConfig) -> tuple[Checkpoint, dict[str, tuple[Any, Any]]]:
    """``run_dir/last`` and the changes ``config`` makes to the run's (:func:`resume_changes`), after checking that
    it resumes the run; ``config``'s model arguments become the run's.

    Raises:
        CheckpointError: no ``last`` checkpoint, or one that cannot be read.
        RunDirectoryError: ``config`` changes what would make it another run.
    """
    path = checkpoint_path(run_dir, "last")
    if not path.is_file():
        raise CheckpointError(f"cannot resume: no checkpoint '{path}'; train without --resume first")
    checkpoint = load_checkpoint(path)
    saved, changes = checkpoint.meta.get("config"), {}
    if saved is not None:
        for name, value in TRAINED_BEFORE_FIELD.items():  # a run saved before the field existed trained so
            if name not in saved:
                saved[name] = value
                setattr(config, name, value)
        name = saved.get("model", config.model)
        defaults = model_arguments(name) if name in list_models() else {}
        changes = resume_changes(saved, config.to_dict(), defaults, str(run_dir))
        config.model_args = {**saved.get("model_args", {}), **config.model_args}
    return checkpoint, changes


def restore(run_dir: Path, model: nn.Module, checkpoint: Checkpoint, epochs: int) -> TrainState:
    """The state of ``checkpoint``, with ``model``'s weights loaded and the checkpoint kept in it for
    :meth:`~capsnets.engine.TrainState.attach` (optimizer, scheduler and RNG); a run that has trained more than
    ``epochs`` epochs is refused."""
    state = resume_state(checkpoint, model)
    if epochs < state.epoch:
        raise RunDirectoryError(
            f"the run in '{run_dir}' has trained {state.epoch} epochs; --epochs {epochs} is fewer: resume with "
            f"--epochs {state.epoch} or more"
        )
    check_best(run_dir, state)
    logger.info("resuming from %s after epoch %d", checkpoint.path, state.epoch)
    return state


def apply_changes(changes: dict[str, tuple[Any, Any]], config: TrainConfig, state: TrainState, optimizer, scheduler):
    """Apply and record what the resumed run changes (:data:`~capsnets.engine.run_dir.CHANGEABLE`). A new
    learning rate, decay, weight decay or (with the cosine schedule) length takes effect as if the run had been
    configured with it: epoch ``e`` trains at ``lr * lr_decay**e``, step ``t`` of the cosine at
    ``lr * (1 + cos(pi * t / steps)) / 2``."""
    if not changes:
        return
    cosine = config.lr_schedule == "cosine"
    if cosine and "lr_decay" in changes:
        raise ArgumentError(
            f"lr_decay {changes['lr_decay'][1]}: this run anneals its learning rate with a cosine over its "
            "epochs, which no per-epoch decay changes; resume without --lr-decay (--epochs or --lr change the "
            "cosine)",
            "lr_decay",
        )
    for name, (old, new) in changes.items():
        logger.warning("resuming with %s %s (was %s)", name, new, old)
    if {"lr", "lr_decay", "weight_decay"} & set(changes) or (cosine and "epochs" in changes):
        scheduler.base_lrs = [config.lr] * len(optimizer.param_groups)
        if cosine:  # the scheduler was built for the run's (new) length
            lr = config.lr * scheduler.lr_lambdas[0](scheduler.last_epoch)
        else:
            scheduler.gamma = config.lr_decay
            lr = config.lr * config.lr_decay**scheduler.last_epoch
        for group in optimizer.param_groups:
            group.update(initial_lr=config.lr, lr=lr, weight_decay=config.weight_decay)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
        logger.warning("epoch %d trains at learning rate %.4g", state.epoch + 1, optimizer.param_groups[0]["lr"])
    state.extra.setdefault("resumed_with", []).append(
        {"epoch": state.epoch, **{name: new for name, (_, new) in changes.items()}}
    )


def prepare_run_dir(
    run_dir: Path,
    config: TrainConfig,
    state: TrainState,
    *,
    resume: bool,
    model: nn.Module,
    meta: Callable[[TrainState, dict], dict],
) -> None:
    """Write ``config.yaml``; a fresh run removes the ``metrics.jsonl`` it replaces, a resumed run rewrites it from
    the checkpoint's records (a torn or longer one) and saves ``best`` again where a crash left it behind
    (:func:`~capsnets.engine.run_dir.repair_best`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config.save(run_dir / "config.yaml")
    if not resume:
        (run_dir / reporting.METRICS_FILE).unlink(missing_ok=True)
        return
    try:
        on_disk = reporting.read_metrics(run_dir, state.epoch)
    except ValueError as err:
        if not state.history:
            raise
        logger.warning("%s; rewriting it from the checkpoint", err)
        on_disk = None
    reporting.write_metrics(run_dir, state.history or on_disk)
    repair_best(run_dir, state, model, meta)
