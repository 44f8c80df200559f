"""Where the demo's model comes from: a shipped pretrained weight, a run directory or checkpoint the user names, or
one the demo trains.

By default :func:`load_demo_model` loads the shipped weight :data:`DEMO_PRETRAINED` (``capsnet_small`` on MNIST,
offline: :mod:`capsnets.models.hub`). Given a run directory ``out`` instead, it trains :data:`DEMO_TRAINING`
(``capsnet_digits`` on scikit-learn's 8x8 digits, offline, on one CPU thread unless ``OMP_NUM_THREADS`` says
otherwise, about 97% test accuracy) there on the first start and loads it on later starts; a training interrupted
there is continued.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from capsnets.checkpoints import load_checkpoint
from capsnets.demo.capsules import DemoModel
from capsnets.engine import TrainConfig, train
from capsnets.inference import checkpoint_class_names
from capsnets.models.hub import model_from_checkpoint
from capsnets.models.pretrained import resolve_pretrained
from capsnets.validation import ArgumentError

__all__ = ["DEMO_PRETRAINED", "DEMO_RUN_DIR", "DEMO_TRAINING", "load_demo_model"]

logger = logging.getLogger(__name__)

#: The shipped weight the demo shows when neither a checkpoint nor a run directory is named.
DEMO_PRETRAINED = "capsnet_small-mnist"
#: The run directory the demo model is trained into and loaded from when ``--out`` is given without a path.
DEMO_RUN_DIR = "runs/demo"
#: The demo model's training (:class:`~capsnets.engine.TrainConfig` fields; ``out`` is the run directory).
DEMO_TRAINING = {"model": "capsnet_digits", "dataset": "digits", "epochs": 10, "batch_size": 32, "device": "cpu"}


def load_demo_model(
    checkpoint: str | os.PathLike | None = None,
    *,
    out: str | os.PathLike = DEMO_RUN_DIR,
    pretrained: str | None = None,
    sha256: str | None = None,
    data_dir: str | os.PathLike | None = None,
) -> DemoModel:
    """The model the demo shows, on the CPU, with a sentence saying where it comes from (``DemoModel.source``).

    Args:
        checkpoint: a run directory (its best checkpoint) or a ``.safetensors`` checkpoint; None: ``pretrained``,
            else the demo model in ``out``.
        out: the demo model's run directory: loaded when it holds a finished training, continued when it holds an
            interrupted one, trained (:data:`DEMO_TRAINING`) when it is missing or empty.
        pretrained: a pretrained weight (see :func:`~capsnets.models.pretrained.resolve_pretrained`), shown
            when ``checkpoint`` is None.
        sha256: the expected SHA-256 of the ``pretrained`` file (required for a URL).
        data_dir: the folder of the data set whose test images the page offers (default: the one the training
            recorded, else ``$CAPSNETS_DATA`` or the library's default).

    Raises:
        ValueError: the checkpoint cannot be loaded, or ``out`` holds other files (naming it).
    """
    if checkpoint is not None:
        model, loaded = _load(checkpoint)
        return _demo_model(model, loaded, f"loaded from {loaded.path}{_epoch(loaded)}", data_dir)
    if pretrained is not None:
        model, loaded = _load(resolve_pretrained(pretrained, sha256=sha256))
        return _demo_model(model, loaded, f"the pretrained weight {pretrained}", data_dir)
    run = Path(out)
    if (run / "summary.json").is_file():
        model, loaded = _load(run)
        return _demo_model(
            model,
            loaded,
            f"loaded from {loaded.path}{_epoch(loaded)}, trained by an earlier start of the demo or by capsnets train",
            data_dir,
        )
    seconds = _train(run)
    model, loaded = _load(run)
    return _demo_model(
        model,
        loaded,
        f"trained now in {seconds:.0f} s ({DEMO_TRAINING['model']} on "
        f"{DEMO_TRAINING['dataset']}, {DEMO_TRAINING['epochs']} epochs), saved in "
        f"{run}: the next start loads it",
        data_dir,
    )


def _load(source: str | os.PathLike):
    """The model of a checkpoint or run directory on the CPU, and the checkpoint."""
    checkpoint = load_checkpoint(source)
    return model_from_checkpoint(checkpoint, "cpu"), checkpoint


def _train(run: Path) -> float:
    """Train :data:`DEMO_TRAINING` into ``run`` (or continue it there); the seconds it took."""
    if run.exists() and not run.is_dir():
        raise ArgumentError(f"'{run}' is a file, not a run directory for the demo model; name another --out")
    resume = (run / "last.safetensors").is_file()
    if not resume and run.is_dir() and any(run.iterdir()):
        raise ArgumentError(f"'{run}' holds files but no demo model; name another --out, or empty it")
    logger.info(
        "%s the demo model (%s on %s, %d epochs, well under a minute on one CPU thread) in %s",
        "continuing" if resume else "training",
        DEMO_TRAINING["model"],
        DEMO_TRAINING["dataset"],
        DEMO_TRAINING["epochs"],
        run,
    )
    start = time.perf_counter()
    threads = torch.get_num_threads()
    if "OMP_NUM_THREADS" not in os.environ:  # else the user's choice stands
        # one thread: the model is small, and more threads on busy cores wait on each other (docs/demo.md)
        torch.set_num_threads(1)
    try:
        train(TrainConfig(**DEMO_TRAINING, out=str(run)), resume=resume)
    finally:
        torch.set_num_threads(threads)
    return time.perf_counter() - start


def _demo_model(model, checkpoint, source: str, data_dir: str | os.PathLike | None = None) -> DemoModel:
    meta = checkpoint.meta
    dataset = meta.get("dataset")
    if not isinstance(dataset, str):
        dataset = None
    elif not dataset.startswith("folder:"):
        dataset = dataset.lower().replace("-", "_")  # as the data registry names it
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    accuracy = (meta.get("metrics") or {}).get("test_accuracy") if isinstance(meta.get("metrics"), dict) else None
    if isinstance(accuracy, float):
        source += f"; test accuracy {100 * accuracy:.1f}%"
    image_size = config.get("image_size") if str(dataset).startswith("folder:") else None
    return DemoModel(
        model,
        classes=checkpoint_class_names(meta, int(model.num_classes)),
        dataset=dataset,
        source=source,
        name=meta.get("model"),
        data_dir=str(data_dir) if data_dir is not None else config.get("data_dir"),
        image_size=image_size,
    )


def _epoch(checkpoint) -> str:
    epoch = checkpoint.meta.get("epoch")
    return f" (epoch {epoch})" if epoch is not None else ""
