"""Pretrained weights: shipped inside the package, a local checkpoint file, or a URL with its SHA-256.

A pretrained weight is a checkpoint in the library's one format (:mod:`capsnets.engine.checkpoint`): a
``.safetensors`` file whose embedded sidecar records the model name and ``model_args`` (so the model is
rebuilt exactly), without optimizer state. Shipped weights live in ``capsnets/weights/`` as
``<model>-<dataset>.safetensors`` beside ``<model>-<dataset>.json``, the readable copy of the sidecar, which is
also the weight's model card: its ``card`` entry gives the data, the training command, the seed, the test
accuracy, the date and the torch version, and its ``sha256`` entry the SHA-256 of the ``.safetensors`` file,
checked before the file is loaded.

Examples::

    >>> model = capsnets.create_model("capsnet_small", pretrained="mnist")        # shipped, offline
    >>> model = capsnets.create_model("capsnet_small", pretrained="runs/a/best.safetensors")  # doctest: +SKIP
    >>> model = capsnets.create_model("capsnet_small", pretrained="https://example.org/w.safetensors",
    ...                               sha256="9f86d0...")                          # doctest: +SKIP
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsnets.engine.checkpoint import Checkpoint, CheckpointError, load_model, save_checkpoint, sidecar_path
from capsnets.files import atomic_write

#: The folder of the weights shipped inside the package.
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
#: Where weights downloaded from a URL are kept, named by their SHA-256.
CACHE_DIR = Path.home() / ".cache" / "capsnets" / "weights"


class PretrainedError(CheckpointError):
    """A pretrained weight is unknown, missing, fails its SHA-256, or does not fit the model asked for."""


@dataclass(frozen=True)
class PretrainedWeight:
    """A weight shipped in :data:`WEIGHTS_DIR`, described by its model card."""

    model: str
    dataset: str
    path: Path
    card: dict[str, Any]

    @property
    def name(self) -> str:
        """``<model>-<dataset>``: the name ``--pretrained`` takes."""
        return f"{self.model}-{self.dataset}"

    @property
    def accuracy(self) -> float:
        """Test accuracy recorded on the card (a fraction)."""
        return float(self.card["card"]["test_accuracy"])

    @property
    def sha256(self) -> str:
        return str(self.card["sha256"])


def shipped_weights() -> dict[str, PretrainedWeight]:
    """The weights shipped with the package, by ``<model>-<dataset>`` name, read from their cards."""
    weights = {}
    for card_path in sorted(WEIGHTS_DIR.glob("*.json")):
        card = json.loads(card_path.read_text())
        weight = PretrainedWeight(model=card["model"], dataset=card["dataset"],
                                  path=card_path.with_suffix(".safetensors"), card=card)
        weights[weight.name] = weight
    return weights


def shipped_weight(name: str) -> PretrainedWeight:
    """The shipped weight ``<model>-<dataset>``; an unknown name raises :class:`PretrainedError` listing them."""
    weights = shipped_weights()
    if name not in weights:
        raise PretrainedError(f"no shipped pretrained weight {name!r}; shipped: {', '.join(weights) or 'none'} "
                              "(`capsnets list-models --pretrained`)")
    return weights[name]


def resolve_pretrained(pretrained: str | os.PathLike, model: str | None = None, *,
                       sha256: str | None = None) -> Path:
    """The local checkpoint file that ``pretrained`` names, checked against its SHA-256 where one is known.

    Args:
        pretrained: a shipped tag for ``model`` (a data set: ``"mnist"``, ``"fashion_mnist"``), a shipped name
            ``"<model>-<dataset>"``, a local ``.safetensors`` path or ``file://`` URL, or an ``https://`` URL.
        model: the model the weight is for (needed for a bare tag).
        sha256: the file's expected SHA-256 (hex); required for an ``https://`` URL, checked for local files
            when given.

    Raises:
        PretrainedError: an unknown tag, a missing file, a URL without ``sha256``, a SHA-256 mismatch.
    """
    text = os.fspath(pretrained)
    scheme = urllib.parse.urlparse(text).scheme.lower()
    if scheme in ("http", "https"):
        return download_weights(text, sha256)
    if scheme == "file":
        text = urllib.request.url2pathname(urllib.parse.urlparse(text).path)
    elif scheme and len(scheme) > 1:  # not a Windows drive letter
        raise PretrainedError(f"pretrained URL {text!r}: only https:// and file:// URLs are read")
    if not text.endswith(".safetensors"):
        name = text if model is None or text.startswith(f"{model}-") else f"{model}-{_canonical(text)}"
        weight = shipped_weight(name)
        _check_sha256(weight.path, sha256 or weight.sha256)
        return weight.path
    path = Path(text).expanduser()
    if not path.is_file():
        raise PretrainedError(f"pretrained weight file '{path}' does not exist")
    if sha256 is not None:
        _check_sha256(path, sha256)
    return path


def download_weights(url: str, sha256: str | None, cache_dir: str | os.PathLike | None = None,
                     timeout: float = 60.0) -> Path:
    """Download ``url`` into ``cache_dir`` (default :data:`CACHE_DIR`) atomically, verified against ``sha256``.

    A file already cached under its SHA-256 is used without a download. A download whose SHA-256 differs is
    deleted and refused; nothing is left in the cache.
    """
    if not sha256 or len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256.lower()):
        raise PretrainedError(f"a pretrained weight from a URL needs its expected SHA-256 (64 hex digits), got "
                              f"{sha256!r}; pass sha256=... (the model card or the publisher gives it)")
    sha256 = sha256.lower()
    folder = Path(cache_dir) if cache_dir is not None else CACHE_DIR
    target = folder / f"{sha256[:16]}-{Path(urllib.parse.urlparse(url).path).name or 'weights.safetensors'}"
    if target.is_file() and file_sha256(target) == sha256:
        return target
    folder.mkdir(parents=True, exist_ok=True)

    def fetch(tmp: str) -> None:
        try:
            with open(tmp, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
        except OSError as err:  # URLError, timeouts
            raise PretrainedError(f"could not download pretrained weight {url} ({err})") from err
        found = file_sha256(tmp)
        if found != sha256:
            raise PretrainedError(f"pretrained weight {url} has SHA-256 {found}, expected {sha256}; refused "
                                  "(a damaged download or a different file)")

    atomic_write(target, fetch, fsync=True)
    return target


def load_pretrained(pretrained: str | os.PathLike, model: str | None = None, *, sha256: str | None = None,
                    device: str | torch.device = "cpu") -> tuple[nn.Module, Checkpoint]:
    """Rebuild and load the model a pretrained weight records (see :func:`resolve_pretrained`), in eval mode.

    Raises:
        PretrainedError: as :func:`resolve_pretrained`, or the weight is for another model than ``model``.
    """
    module, checkpoint = load_model(resolve_pretrained(pretrained, model, sha256=sha256), device)
    if model is not None and checkpoint.meta.get("model") != model:
        raise PretrainedError(f"pretrained weight '{checkpoint.path}' is for model {checkpoint.meta.get('model')!r}, "
                              f"not {model!r}")
    return module, checkpoint


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, in hex."""
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def save_pretrained(model: nn.Module, path: str | os.PathLike, *, dataset: str, card: dict[str, Any],
                    half: bool = False, classes: list[str] | None = None) -> Path:
    """Write ``model`` as a pretrained weight: a checkpoint without optimizer state, its sidecar carrying the
    model ``card`` (data, command, seed, test_accuracy, date...), float16 tensors when ``half``; then add the
    file's SHA-256 to the readable ``.json`` copy (the model card)."""
    saved = copy.deepcopy(model).cpu()
    if half:
        saved = saved.half()
    meta = {"model": model.model_name, "model_args": model.model_args, "dataset": dataset,
            "metrics": {"test_accuracy": card["test_accuracy"]},
            "card": {**card, "dtype": "float16" if half else "float32", "torch": torch.__version__}}
    if classes is not None:
        meta["classes"] = list(classes)
    path = save_checkpoint(path, model=saved, meta=meta)
    sidecar = json.loads(sidecar_path(path).read_text())
    sidecar["sha256"] = file_sha256(path)
    text = json.dumps(sidecar, indent=2) + "\n"
    atomic_write(sidecar_path(path), lambda tmp: Path(tmp).write_text(text))
    return path


def publish_checkpoint(checkpoint: str | os.PathLike, *, command: str, data: str, data_dir: str | None = None,
                       out_dir: str | os.PathLike = WEIGHTS_DIR, reconstruction: bool = True) -> Path:
    """Evaluate a trained checkpoint on its data set's test split with its weights in float32 and rounded to
    float16, and save it to ``out_dir/<model>-<dataset>.safetensors`` (float16 when that loses no accuracy)
    with its model card: ``data`` (what it was trained and tested on), ``command`` (how it was trained), the
    seed and epochs, both accuracies and the date. ``reconstruction=False`` ships the model without its
    reconstruction decoder (rebuilt with ``reconstruction=False``; the scores do not depend on the decoder),
    for models whose builder takes that argument."""
    import time

    from capsnets.data import load_dataset
    from capsnets.engine.evaluate import evaluate

    model, trained = load_model(checkpoint, "cpu")
    if not reconstruction:
        model = _without_decoder(model)
    dataset = _canonical(trained.meta["dataset"])
    test = load_dataset(dataset, root=data_dir, train=False)
    accuracy32 = evaluate(model, test)["accuracy"]
    accuracy16 = evaluate(copy.deepcopy(model).half().float(), test)["accuracy"]
    half = accuracy16 >= accuracy32
    config = trained.meta.get("config") or {}
    card = {"data": data, "command": command, "seed": config.get("seed"), "epochs": trained.meta.get("epoch"),
            "test_accuracy": accuracy16 if half else accuracy32, "test_images": len(test.labels),
            "accuracy_float32": accuracy32, "accuracy_float16": accuracy16,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}
    path = Path(out_dir) / f"{model.model_name}-{dataset}.safetensors"
    return save_pretrained(model, path, dataset=dataset, card=card, half=half, classes=trained.meta.get("classes"))


def _without_decoder(model: nn.Module) -> nn.Module:
    """``model`` rebuilt with ``reconstruction=False`` and loaded with its weights but the decoder's."""
    from capsnets.models import create_model, model_arguments

    if "reconstruction" not in model_arguments(model.model_name):
        raise PretrainedError(f"model '{model.model_name}' has no 'reconstruction' argument; it cannot be "
                              "published without a decoder")
    bare = create_model(model.model_name, **{**model.model_args, "reconstruction": False})
    state = model.state_dict()
    missing = [key for key in bare.state_dict() if key not in state]
    if missing:
        raise PretrainedError(f"model '{model.model_name}' without its decoder has weights the trained model "
                              f"lacks: {missing[:3]}")
    bare.load_state_dict({key: state[key] for key in bare.state_dict()})
    return bare.eval()


def _check_sha256(path: Path, expected: str) -> None:
    found = file_sha256(path)
    if found != expected.lower():
        raise PretrainedError(f"pretrained weight '{path}' has SHA-256 {found}, expected {expected}; refused (the "
                              "file is damaged or was replaced)")


def _canonical(dataset: str) -> str:
    return dataset.lower().replace("-", "_")
