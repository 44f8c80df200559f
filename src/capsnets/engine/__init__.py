"""Training, evaluation, checkpoints and distributed set-up; nothing here knows about capsules.

- :class:`TrainConfig`, :func:`build_config`: the run's configuration (file + overrides)
- :func:`train` / :class:`Trainer`: train a registered model on a data set, writing a run directory
- :func:`fit`, :class:`TrainState`, :func:`training_step`: the one training loop that the trainer and every
  experiment use (a step function, evaluation points, exact continuation)
- :mod:`~capsnets.engine.callbacks`: what a training does at its evaluation points (:class:`TimeLimit`,
  :class:`Target`, :class:`ModelCheckpoint`, :class:`Hook`), checkpoint names and resuming
- :func:`evaluate`: accuracy, per-class accuracy and confusion matrix of a model on a data set
- :func:`save_checkpoint`, :func:`load_checkpoint`, :func:`load_model`: safetensors + JSON checkpoints
"""
from .checkpoint import (Checkpoint, CheckpointError, build_model, load_checkpoint, load_model,
                         resolve_checkpoint_path, restore_model, restore_training, save_checkpoint)
from .config import TrainConfig, build_config, read_config_file
from .callbacks import (Callback, Hook, ModelCheckpoint, Target, TimeLimit, checkpoint_name, checkpoint_path,
                        resume_state)
from .distributed import DistContext
from .evaluate import accuracy, dice_score, evaluate
from .fit import NonFiniteLossError, TrainState, adam_with_decay, fit, save_state, training_step
from .trainer import Trainer, train

__all__ = [
    "Checkpoint", "CheckpointError", "build_model", "load_checkpoint", "load_model", "resolve_checkpoint_path",
    "restore_model", "restore_training", "save_checkpoint", "TrainConfig", "build_config", "read_config_file",
    "Callback", "Hook", "ModelCheckpoint", "Target", "TimeLimit", "checkpoint_name", "checkpoint_path", "resume_state",
    "DistContext", "accuracy", "dice_score", "evaluate", "NonFiniteLossError", "TrainState", "adam_with_decay", "fit",
    "save_state", "training_step", "Trainer", "train",
]
