"""Publishing a trained checkpoint as a pretrained weight: evaluated, rounded to float16 where that costs no
accuracy, and saved with its model card (:func:`capsnets.models.hub.save_pretrained`)."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

from torch import nn

from capsnets.checkpoints import load_checkpoint
from capsnets.data import load_dataset
from capsnets.engine.evaluate import evaluate
from capsnets.inference import calibrate_reconstruction
from capsnets.models.hub import model_from_checkpoint, save_pretrained, without_decoder
from capsnets.models.pretrained import WEIGHTS_DIR
from capsnets.models.registry import complete_model_args


def publish_checkpoint(
    checkpoint: str | os.PathLike,
    *,
    command: str,
    data: str,
    data_dir: str | None = None,
    out_dir: str | os.PathLike = WEIGHTS_DIR,
    reconstruction: bool = True,
) -> Path:
    """Evaluate a trained checkpoint on its data set's test split with its weights in float32 and rounded to
    float16, and save it to ``out_dir/<model>-<dataset>.safetensors`` (float16 when that loses no accuracy)
    with every argument of the model's builder (:func:`~capsnets.models.registry.complete_model_args`) and its
    model card: ``data`` (what it was trained and tested on), ``command`` (how it was trained), the seed and
    epochs, both accuracies and the date. ``reconstruction=False`` ships the model without its
    reconstruction decoder (rebuilt with ``reconstruction=False``; the scores do not depend on the decoder),
    for models whose builder takes that argument."""
    trained = load_checkpoint(checkpoint)
    model = model_from_checkpoint(trained, "cpu")
    if not reconstruction:
        model = without_decoder(model)
    dataset = trained.meta["dataset"].lower().replace("-", "_")
    test = load_dataset(dataset, root=data_dir, train=False)
    accuracy32 = evaluate(model, test)["accuracy"]
    accuracy16 = evaluate(copy.deepcopy(model).half().float(), test)["accuracy"]
    half = accuracy16 >= accuracy32
    config = trained.meta.get("config") or {}
    card = {
        "data": data,
        "command": command,
        "seed": config.get("seed"),
        "epochs": trained.meta.get("epoch"),
        "test_accuracy": accuracy16 if half else accuracy32,
        "test_images": len(test.labels),
        "accuracy_float32": accuracy32,
        "accuracy_float16": accuracy16,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    model.model_args = complete_model_args(model)  # the weight rebuilds its model whatever the defaults become
    path = Path(out_dir) / f"{model.model_name}-{dataset}.safetensors"
    limits = _training_limits(copy.deepcopy(model).half().float() if half else model, dataset, data_dir)
    return save_pretrained(
        model,
        path,
        dataset=dataset,
        card=card,
        half=half,
        classes=trained.meta.get("classes"),
        reconstruction_limits=limits,
    )


def _training_limits(model: nn.Module, dataset: str, data_dir: str | None = None) -> dict | None:
    """The limits of ``model``'s good reconstructions (:func:`~capsnets.inference.calibrate_reconstruction`) on the
    whole training split of ``dataset``, as stored (no augmentation); None for a model without a decoder."""
    return calibrate_reconstruction(model, load_dataset(dataset, root=data_dir, train=True).images)


def recalibrate_weight(path: str | os.PathLike, *, data_dir: str | None = None) -> Path:
    """Write the shipped weight ``path`` again with the limits of its reconstructions set on its data set's whole
    training split (as :func:`publish_checkpoint` does), its tensors, card and classes kept."""
    weight = load_checkpoint(path)
    model = model_from_checkpoint(weight, "cpu")
    dataset = weight.meta["dataset"]
    half = (weight.meta.get("card") or {}).get("dtype") == "float16"
    model = model.float()
    return save_pretrained(
        model,
        path,
        dataset=dataset,
        card={key: value for key, value in weight.meta["card"].items() if key != "dtype"},
        half=half,
        classes=weight.meta.get("classes"),
        reconstruction_limits=_training_limits(model, dataset, data_dir),
    )
