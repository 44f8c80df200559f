"""Where an experiment keeps its trained models between runs: the ``--checkpoint-dir`` folder.

- :class:`Checkpoints`: the folder. :meth:`Checkpoints.load_or_train` loads a model from it or trains and saves
  it; with a :class:`~capsnets.engine.TrainState`, a training that its time limit cut short is continued by the
  next run (:func:`~capsnets.engine.callbacks.resume_state`), and the folder records its name in
  :attr:`Checkpoints.cut_short`. :meth:`Checkpoints.fit_or_load` is
  :func:`~capsnets.experiments.training.train_to_accuracy` kept there.
- :func:`load_or_train`: the same for a folder given as a path.

Checkpoints are named as the trainer names its own (:func:`~capsnets.engine.callbacks.checkpoint_path`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from capsnets.checkpoints import load_checkpoint, recover_directory
from capsnets.engine.callbacks import checkpoint_path, resume_state
from capsnets.engine.fit import TrainState, save_state
from capsnets.experiments.training import epochs_trained, evaluate_accuracy, train_to_accuracy

__all__ = ["Checkpoints", "load_or_train"]

_log = logging.getLogger(__name__)


class Checkpoints:
    """An experiment's checkpoint folder (``--checkpoint-dir``): models are kept there between runs as
    ``<directory>/<name>.safetensors`` (:func:`~capsnets.engine.callbacks.checkpoint_path`), and the names of
    the trainings that a time limit left unfinished are recorded in :attr:`cut_short`.

    Args:
        directory: the folder, or None to train every model and keep nothing.

    Attributes:
        cut_short: the names of the trainings that a time limit left unfinished.

    Examples:
        >>> Checkpoints(None).cut_short
        []
    """

    def __init__(self, directory: str | os.PathLike | None) -> None:
        self.directory = None if directory is None else Path(directory)
        self.cut_short: list[str] = []

    def load_or_train(self, model: nn.Module, name: str, train: Callable[[], Any], **kwargs) -> bool:
        """:func:`load_or_train` in this folder (``kwargs``: ``meta``, ``state``, ``recipe``); a training that
        ends unfinished is added to :attr:`cut_short`."""
        loaded = load_or_train(model, name, train, checkpoint_dir=self.directory, **kwargs)
        state = kwargs.get("state")
        if not loaded and state is not None and not state.finished:
            self.cut_short.append(name)
        return loaded

    def fit_or_load(
        self,
        model: nn.Module,
        key: str,
        images: Tensor,
        labels: Tensor,
        val_images: Tensor,
        val_labels: Tensor,
        **train_args,
    ) -> dict:
        """:func:`train_to_accuracy`, or ``<directory>/<key>.safetensors`` from an earlier run (its training
        record is kept in the checkpoint's sidecar and read back). A training cut short by ``time_limit_s`` is
        continued by the next run with the same folder.

        Returns:
            ``{"epochs" (for a report: "12", "7 of 50 (time limit)", "3 (loaded)"), "trained_epochs",
            "val_accuracy", "history"}``.
        """
        state = TrainState()
        augment = train_args.get("augment")
        recipe = {
            "train_images": len(images),
            "val_images": len(val_images),
            "augment": None if augment is None else type(augment).__name__,
            **{k: v for k, v in train_args.items() if k not in ("augment", "desc", "time_limit_s")},
        }

        def train():
            return train_to_accuracy(model, images, labels, val_images, val_labels, state=state, **train_args)

        loaded = self.load_or_train(model, key, train, state=state, recipe=recipe)
        history = state.history
        if loaded:
            return {
                "epochs": f"{len(history)} (loaded)" if history else "loaded",
                "trained_epochs": len(history) or None,
                "history": history,
                "val_accuracy": evaluate_accuracy(model, val_images, val_labels),
            }
        return {
            "epochs": epochs_trained(history, train_args["max_epochs"]),
            "trained_epochs": len(history),
            "history": history,
            "val_accuracy": history[-1]["val_accuracy"] if history else 0.0,
        }


def load_or_train(
    model: nn.Module,
    name: str,
    train: Callable[[], Any],
    *,
    checkpoint_dir: str | os.PathLike | None,
    meta: dict[str, Any] | None = None,
    state: TrainState | None = None,
    recipe: dict[str, Any] | None = None,
) -> bool:
    """Load ``checkpoint_dir/<name>.safetensors`` into ``model`` if it exists, else call ``train()``
    and save the model there (when ``checkpoint_dir`` is given). Returns True when it was loaded (and not
    trained further).

    ``meta``: extra entries for the checkpoint's sidecar, taken after ``train()`` (so ``train`` may fill
    them). When the model is loaded, every list in ``meta`` is filled in place from the sidecar's entry of
    the same key, and when it is loaded as finished (True is returned), ``meta`` also gets the sidecar's other
    entries (what ``train()`` recorded then), so the caller need not read the checkpoint again.

    ``state``: the :class:`~capsnets.engine.TrainState` that ``train()`` trains with (it is saved in the
    sidecar; a loaded model's state, its history included, is read back into it). With it, a training cut
    short by its time limit is saved with its optimizer, scheduler and RNG state, and a later run that finds
    that checkpoint continues it (``train()`` is called again) instead of taking the model as finished.

    ``recipe``: the settings that decide what ``train()`` does (epochs, learning rate, data sizes, seed...;
    not a time limit), kept in the sidecar. A checkpoint trained with another recipe is refused with an
    error naming the settings that differ, rather than loaded as if this run had trained it (checkpoints
    written without a recipe are loaded as they are)."""
    path = checkpoint_path(checkpoint_dir, name) if checkpoint_dir is not None else None
    if path is not None:
        recover_directory(path.parent)  # what a crash in an earlier save left
    if path is not None and path.is_file():
        checkpoint = load_checkpoint(path)
        saved = checkpoint.meta.get("model_args")
        wanted = _jsonable(getattr(model, "model_args", {}))
        if saved is not None and saved != wanted:
            raise ValueError(
                f"{path} holds a model built with {json.dumps(saved, sort_keys=True)}, but this run "
                f"builds it with {json.dumps(wanted, sort_keys=True)}; pass another --checkpoint-dir "
                f"(or delete that file) to train this one"
            )
        _check_recipe(path, checkpoint.meta.get("recipe"), recipe)
        try:
            found = resume_state(checkpoint, model)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err
        model.eval()
        for key, value in (meta or {}).items():
            if isinstance(value, list) and isinstance(checkpoint.meta.get(key), list):
                value[:] = checkpoint.meta[key]
        if state is None or found.finished:
            if state is not None:
                state.load(found)
            if meta is not None:
                meta.update(
                    {
                        k: v
                        for k, v in checkpoint.meta.items()
                        if k not in meta and k not in ("model", "model_args", "training", "recipe")
                    }
                )
            return True
        state.load(found)
        state.checkpoint = checkpoint
        _log.info("%s: continuing the training its time limit cut short after %d epochs (%s)", name, state.epoch, path)
    train()
    unfinished = state is not None and not state.finished
    if path is not None:
        meta = {
            "model": getattr(model, "model_name", name),
            "model_args": getattr(model, "model_args", {}),
            **(meta or {}),
            **({"recipe": _jsonable(recipe)} if recipe is not None else {}),
        }
        save_state(path, model, state if state is not None else TrainState(finished=True), meta, resumable=unfinished)
    return False


def _jsonable(value: Any) -> Any:
    """``value`` as it reads back from a JSON sidecar (tuples become lists)."""
    return json.loads(json.dumps(value))


_UNSET = object()


def _check_recipe(path: Path, saved: dict[str, Any] | None, wanted: dict[str, Any] | None) -> None:
    """Refuse a checkpoint whose training recipe is not this run's (see :func:`load_or_train`)."""
    if saved is None or wanted is None:
        return
    wanted = _jsonable(wanted)
    differ = [k for k in sorted(set(saved) | set(wanted)) if saved.get(k, _UNSET) != wanted.get(k, _UNSET)]
    if not differ:
        return

    def show(recipe: dict[str, Any]) -> str:
        return ", ".join(f"{k}={json.dumps(recipe[k]) if k in recipe else '(unset)'}" for k in differ)

    raise ValueError(
        f"{path} holds a model trained with {show(saved)}, but this run trains it with {show(wanted)}; "
        f"pass another --checkpoint-dir (or delete that file) to train this one"
    )
