"""Training, evaluation, training checkpoints and distributed set-up; nothing here knows about capsules.

- :class:`TrainConfig`, :func:`build_config`: the run's configuration (file + overrides)
- :class:`Trainer`: ``Trainer(**settings).fit(model, train_data, val_data, test_data=...)`` trains your own
  ``nn.Module`` on a ``Dataset``, ``DataLoader`` or :class:`~capsnets.data.TensorData`
  (:mod:`~capsnets.engine.inputs`), writing a run directory, with the ``best`` checkpoint chosen on validation;
  :func:`train` (``Trainer.from_config``) builds the registered model and the data set a config names and fits them
- :func:`fit`, :class:`TrainState`, :func:`training_step`: the one training loop that the trainer and every
  experiment use (a step function, evaluation points, exact continuation)
- :mod:`~capsnets.engine.callbacks`: what a training does at its evaluation points (:class:`TimeLimit`,
  :class:`Target`, :class:`ModelCheckpoint`, :class:`Hook`), checkpoint names and resuming
- :func:`evaluate`: accuracy, per-class accuracy and confusion matrix of a model on a data set; for multi-label
  data :func:`multilabel_metrics` (mAP, micro / macro F1, exact-set accuracy) at the thresholds of
  :func:`f1_thresholds`; for segmentation data :func:`evaluate_segmentation` (per-class Dice and IoU of the pixels,
  :func:`segmentation_metrics`)
- :mod:`~capsnets.engine.tasks`: what the trainer does for each task (classification, multi-label, segmentation)
- :func:`save_checkpoint`, :func:`restore_training`: a model with its optimizer, scheduler and RNG state (the
  file format is :mod:`capsnets.checkpoints`'s; a model alone: :func:`capsnets.models.load_model`)
- :func:`publish_checkpoint`: a trained checkpoint as a pretrained weight with its model card;
  :func:`recalibrate_weight`: a weight's reconstruction limits set again on its whole training split
"""

from .callbacks import (
    Callback,
    Hook,
    ModelCheckpoint,
    Target,
    TimeLimit,
    checkpoint_name,
    checkpoint_path,
    resume_state,
)
from .checkpoint import restore_training, save_checkpoint
from .config import TrainConfig, build_config, read_config_file
from .distributed import DistContext
from .evaluate import (
    accuracy,
    average_precision,
    dice_score,
    evaluate,
    evaluate_segmentation,
    f1_thresholds,
    multilabel_metrics,
    segmentation_metrics,
)
from .fit import NonFiniteLossError, TrainingInterrupted, TrainState, adam_with_decay, fit, save_state, training_step
from .publish import publish_checkpoint, recalibrate_weight
from .trainer import Trainer, train

__all__ = [
    "restore_training",
    "save_checkpoint",
    "TrainConfig",
    "build_config",
    "read_config_file",
    "Callback",
    "Hook",
    "ModelCheckpoint",
    "Target",
    "TimeLimit",
    "checkpoint_name",
    "checkpoint_path",
    "resume_state",
    "DistContext",
    "accuracy",
    "dice_score",
    "evaluate",
    "average_precision",
    "f1_thresholds",
    "multilabel_metrics",
    "evaluate_segmentation",
    "segmentation_metrics",
    "NonFiniteLossError",
    "TrainingInterrupted",
    "TrainState",
    "adam_with_decay",
    "fit",
    "save_state",
    "training_step",
    "publish_checkpoint",
    "recalibrate_weight",
    "Trainer",
    "train",
]
