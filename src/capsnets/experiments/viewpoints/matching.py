"""One split of the ``viewpoints`` experiment: the CNN and the capsule model trained to a matched familiar-view error
(Hinton, Sabour & Frosst 2018, Sec. 5.2), and the CNN stopped at the capsule model's error when that falls short.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from capsnets.data import TensorData
from capsnets.engine.callbacks import checkpoint_name
from capsnets.engine.runtime import seed_everything
from capsnets.experiments.report.viewpoints import STOPPED
from capsnets.experiments.views import fit_matched, viewpoint_split
from capsnets.losses import create_loss
from capsnets.models import count_parameters, create_model, training_recipe

__all__ = ["CAPSULE_RECIPE_FIELDS", "MATCHED_LR", "build_model", "capsule_training", "cnn_training", "compare"]

NUM_CLASSES, INPUT_SIZE = 5, (1, 32, 32)
#: What ``capsule_recipe`` may set: the fields of a model's training recipe that the training takes.
CAPSULE_RECIPE_FIELDS = ("lr", "lr_decay", "weight_decay", "loss", "loss_args")
#: A training to a matched error has no planned length for a cosine to anneal over: a capsule model whose recipe
#: anneals by one (the matrix networks') decays per epoch instead (its recipe's ``lr_decay``) from this learning
#: rate, yl-1993/Matrix-Capsules-EM-PyTorch's.
MATCHED_LR = 3e-3


# --------------------------------------------------------------------------------------------------------
# Splits


def _prefix(data: TensorData, size: int | None) -> TensorData:
    return data if size is None or size >= len(data) else data.subset(size)


# --------------------------------------------------------------------------------------------------------
# Models


def build_model(name: str, device: str, args: dict | None = None) -> nn.Module:
    """A registered model for 5 classes of 32x32 images (e.g. ``cnn_smallnorb``, ``cnn_smallnorb_narrow``,
    ``matrix_capsnet``)."""
    return create_model(name, num_classes=NUM_CLASSES, input_size=INPUT_SIZE, device=device, **(args or {}))


# --------------------------------------------------------------------------------------------------------
# Training to a matched familiar-view error (:func:`~capsnets.experiments.views.fit_matched`)


def _fit(model, key: str, views, target, s: Any, seed: int, runs, batch_size: int, training: dict) -> dict:
    """:func:`~capsnets.experiments.views.fit_matched` with ``training`` (its ``lr``, ``lr_decay``,
    ``weight_decay``, ``loss``, ``loss_args``)."""
    name, args = training["loss"] or model.default_loss, training["loss_args"]
    return fit_matched(
        runs,
        key,
        model,
        views,
        target=target,
        novel_each_epoch=s.novel_each_epoch,
        epochs=s.epochs,
        batch_size=batch_size,
        lr=training["lr"],
        lr_decay=training["lr_decay"],
        weight_decay=training["weight_decay"],
        loss=create_loss(name, **args),
        seed=seed,
        compile=s.compile,
        train_minutes=s.train_minutes,
        recipe={**s.subset("train_size", "render_instances", "render_lightings"), "loss": name, "loss_args": args},
    )


# --------------------------------------------------------------------------------------------------------
# The experiment


def cnn_training(s: Any) -> dict:
    """The CNN's training: ``lr`` and ``lr_decay``, no weight decay, its own loss."""
    return {"lr": s.lr, "lr_decay": s.lr_decay, "weight_decay": 0.0, "loss": None, "loss_args": {}}


def capsule_training(s: Any) -> dict:
    """The capsule model's training: ``capsule_recipe`` over the model's recipe over the CNN's ``lr`` and
    ``lr_decay``. The recipe's loss arguments stay under the user's while the loss is the recipe's."""
    recipe = {k: v for k, v in training_recipe(s.capsule_model).items() if k in CAPSULE_RECIPE_FIELDS}
    training = {"lr": s.lr, "lr_decay": s.lr_decay, "weight_decay": 0.0, "loss": None, "loss_args": {}}
    training.update(recipe)
    if training_recipe(s.capsule_model).get("lr_schedule") == "cosine":
        training["lr"] = MATCHED_LR
    training.update(s.capsule_recipe)
    if "loss" in s.capsule_recipe and s.capsule_recipe["loss"] != recipe.get("loss"):
        training["loss_args"] = dict(s.capsule_recipe.get("loss_args") or {})
    else:
        training["loss_args"] = {**recipe.get("loss_args", {}), **(s.capsule_recipe.get("loss_args") or {})}
    return training


def compare(split: str, train: TensorData, test: TensorData, s: Any, *, tag: str, device: str, seed: int, runs) -> dict:
    """Train (or load) the CNN, then the capsule model matched to its familiar-view error, on one split; if
    the capsule model never gets there, also the CNN stopped at the capsule model's error (role "CNN, stopped")."""
    views = viewpoint_split(train, test, split)
    views = {k: _prefix(v, s.train_size if k == "train" else s.test_size) for k, v in views.items()}
    cnn = build_model(s.cnn_model, device)
    caps = build_model(s.capsule_model, device, s.capsule_args)
    cnn_key = f"{tag}_{split}_{s.cnn_model}"
    cnn_rec = _fit(cnn, cnn_key, views, s.target_error, s, seed, runs, s.cnn_batch_size, cnn_training(s))
    target = s.target_error if s.target_error is not None else cnn_rec["familiar_error"]
    caps_key = checkpoint_name(f"{tag}_{split}_{s.capsule_model}", s.capsule_args)
    caps_rec = _fit(caps, caps_key, views, target, s, seed + 1, runs, s.capsule_batch_size, capsule_training(s))
    records = {"CNN": cnn_rec, "capsules": caps_rec}
    if s.rematch_cnn and s.target_error is None and not caps_rec["reached"]:
        # The CNN learned faster than the capsule model could follow: train it again (same recipe and data
        # order, its own initialisation) and stop it where its familiar-view error first reaches the capsule
        # model's, scoring it several times per epoch. The models are then matched the other way round.
        seed_everything(seed + 2)
        stopped = build_model(s.cnn_model, device)
        records[STOPPED] = _fit(
            stopped,
            f"{cnn_key}_stopped_at_{caps_rec['familiar_error']:.4f}",
            views,
            caps_rec["familiar_error"],
            s,
            seed,
            runs,
            s.cnn_batch_size,
            cnn_training(s),
        )
    return {
        "records": records,
        "target": target,
        "sizes": {k: len(v) for k, v in views.items()},
        "params": {"CNN": count_parameters(cnn), "capsules": count_parameters(caps)},
    }
