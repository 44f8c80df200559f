"""Training, evaluation, checkpoints and distributed set-up; nothing here knows about capsules.

- :class:`TrainConfig`, :func:`build_config`: the run's configuration (file + overrides)
- :func:`train` / :class:`Trainer`: the training loop, writing a run directory
- :func:`evaluate`: accuracy, per-class accuracy and confusion matrix of a model on a data set
- :func:`save_checkpoint`, :func:`load_checkpoint`, :func:`load_model`: safetensors + JSON checkpoints
"""
from .checkpoint import (Checkpoint, CheckpointError, build_model, load_checkpoint, load_model,
                         resolve_checkpoint_path, restore_model, restore_training, save_checkpoint)
from .config import TrainConfig, build_config, read_config_file
from .distributed import DistContext
from .evaluate import dice_score, evaluate
from .loop import NonFiniteLossError
from .trainer import Trainer, train

__all__ = [
    "Checkpoint", "CheckpointError", "build_model", "load_checkpoint", "load_model", "resolve_checkpoint_path",
    "restore_model", "restore_training", "save_checkpoint", "TrainConfig", "build_config", "read_config_file",
    "DistContext", "dice_score", "evaluate", "NonFiniteLossError", "Trainer", "train",
]
