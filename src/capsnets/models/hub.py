"""Models from files: building a model from a checkpoint, saving one, and pretrained weights.

:func:`create_model` is the registry's :func:`~capsnets.models.registry.create_model` plus ``pretrained=``
(timm's ``create_model(..., pretrained=True)``). :func:`load_model` rebuilds the model a checkpoint records and
loads its weights; :func:`save_model` writes one. Files are read and written by :mod:`capsnets.io`.

A pretrained weight is a checkpoint in the library's one format (:mod:`capsnets.io`): a ``.safetensors`` file
whose embedded sidecar records the model name and ``model_args`` (so the model is rebuilt exactly), without
optimizer state. Shipped weights live in ``capsnets/weights/`` as
``<model>-<dataset>.safetensors`` beside ``<model>-<dataset>.json``, the readable copy of the sidecar, which is
also the weight's model card: its ``card`` entry gives the data, the training command, the seed, the test
accuracy, the date and the torch version, and its ``sha256`` entry the SHA-256 of the ``.safetensors`` file,
checked before the file is loaded.

Examples::

    >>> model = create_model("capsnet_small", pretrained="mnist")                  # shipped, offline
    >>> model = create_model("capsnet_small", pretrained="runs/a/best.safetensors")  # doctest: +SKIP
    >>> model = create_model("capsnet_small", pretrained="https://example.org/w.safetensors",
    ...                      sha256="9f86d0...")                                    # doctest: +SKIP
"""

from __future__ import annotations

import copy
import json
import os
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsnets.io import (
    Checkpoint,
    CheckpointError,
    atomic_write,
    file_sha256,
    load_checkpoint,
    sidecar_path,
    write_checkpoint,
)
from capsnets.models import registry
from capsnets.models.registry import model_arguments
from capsnets.validation import ArgumentError

#: The folder of the weights shipped inside the package.
WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"
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


def create_model(
    name: str, *, pretrained: str | os.PathLike | None = None, sha256: str | None = None, **overrides
) -> nn.Module:
    """Build a registered model, with trained weights when ``pretrained`` is given.

    Args:
        name: a name from :func:`~capsnets.models.list_models`.
        pretrained: load trained weights: a shipped tag (the data set, e.g. ``"mnist"``;
            ``capsnets list-models --pretrained`` lists them), a local ``.safetensors`` checkpoint or ``file://``
            URL, or an ``https://`` URL (then ``sha256`` is required). The model is rebuilt with the arguments the
            weight records, so ``overrides`` may only add ``device``. Returned in eval mode.
        sha256: the expected SHA-256 of the ``pretrained`` file (hex).
        **overrides: keyword arguments of the model's builder (e.g. ``num_classes``, ``input_size``,
            ``routing`` (a routing object or its spec), ``device``); see
            :func:`~capsnets.models.model_schema` and :func:`capsnets.models.registry.create_model`.

    Examples:
        >>> model = create_model("capsnet_small", num_classes=10)
        >>> model = create_model("capsnet_digits", routing=DynamicRouting(2))
        >>> model = create_model("capsnet_small", pretrained="mnist")
    """
    if pretrained is None:
        if sha256 is not None:
            raise ArgumentError("sha256 is the expected digest of a pretrained weight; pass it with pretrained=...")
        return registry.create_model(name, **overrides)
    model_arguments(name)  # an unknown name is reported as such
    extra = sorted(set(overrides) - {"device"})
    if extra:
        raise ArgumentError(
            f"model {name!r} with pretrained={pretrained!r} is built with the arguments its weight "
            f"records; {', '.join(extra)} cannot be changed (build it without pretrained=... "
            "and load the weights yourself)"
        )
    model, _ = load_pretrained(pretrained, name, sha256=sha256, device=overrides.get("device") or "cpu")
    return model


def build_model(name: str, model_args: dict[str, Any] | None = None) -> nn.Module:
    """``create_model(name, **model_args)`` for recorded arguments: list values (from YAML/JSON) become tuples."""
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in (model_args or {}).items()}
    return registry.create_model(name, **args)


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s ``state_dict`` as a checkpoint stores it (keys ``model.<name>``)."""
    return {f"model.{k}": v for k, v in model.state_dict().items()}


def save_model(path: str | os.PathLike, model: nn.Module, *, meta: dict[str, Any] | None = None) -> Path:
    """Write a model built by :func:`create_model` to a checkpoint that :func:`load_model` rebuilds it from.

    Args:
        path: target ``.safetensors`` file (the readable sidecar goes beside it as ``.json``).
        model: a model with ``model_name`` and ``model_args`` (as :func:`create_model` returns it).
        meta: other JSON-safe entries for the sidecar (data set, metrics, ``classes``...).

    Examples::

        >>> save_model("runs/m.safetensors", create_model("capsnet_small"))   # doctest: +SKIP
        >>> model, checkpoint = load_model("runs/m.safetensors")              # doctest: +SKIP
    """
    meta = {"model": model.model_name, "model_args": model.model_args, **(meta or {})}
    return write_checkpoint(path, model_tensors(model), meta)


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[nn.Module, Checkpoint]:
    """Rebuild the model recorded in a checkpoint's sidecar, load its weights, move it to ``device`` (eval mode).

    Args:
        path: a run directory (its best checkpoint), or a ``.safetensors`` / ``.json`` checkpoint file.

    Raises:
        CheckpointError: the file cannot be read (:func:`capsnets.io.load_checkpoint`), names no model, records
            arguments that do not build it, or its weights do not fit the model.
    """
    checkpoint = load_checkpoint(path)
    if "model" not in checkpoint.meta:
        raise CheckpointError(
            f"sidecar of '{checkpoint.path}' does not name the model; it was not written by capsnets' trainer"
        )
    name, args = checkpoint.meta["model"], checkpoint.meta.get("model_args")
    try:  # first without memory: a damaged sidecar's sizes must not allocate anything
        with torch.device("meta"):
            probe = build_model(name, args)
    except (RuntimeError, NotImplementedError):  # a builder that needs real tensors
        probe = None
    except (ValueError, TypeError) as err:
        raise CheckpointError(
            f"the sidecar of '{checkpoint.path}' records model {name!r} with arguments that do not "
            f"build it ({str(err).splitlines()[0] if str(err) else type(err).__name__}); use "
            "another checkpoint or retrain"
        ) from err
    if probe is not None:
        check_fits(probe, checkpoint)
    model = build_model(name, args)
    restore_model(model, checkpoint)
    return model.to(device).eval(), checkpoint


def restore_model(model: nn.Module, checkpoint: Checkpoint) -> None:
    """Load the checkpoint's weights into ``model``; a key or shape mismatch raises ``CheckpointError``."""
    check_fits(model, checkpoint)
    model.load_state_dict(checkpoint.model_state())


def check_fits(model: nn.Module, checkpoint: Checkpoint) -> None:
    """Raise ``CheckpointError`` unless ``model``'s parameters and buffers have the checkpoint's names and shapes
    (``model`` may live on the meta device)."""
    state = checkpoint.model_state()
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"checkpoint '{checkpoint.path}' does not fit the model (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, wrong shape {wrong[:5]}); build the model with the checkpoint's model name "
            f"and model_args ({checkpoint.meta.get('model')!r}, {checkpoint.meta.get('model_args')})"
        )


def shipped_weights() -> dict[str, PretrainedWeight]:
    """The weights shipped with the package, by ``<model>-<dataset>`` name, read from their cards."""
    weights = {}
    for card_path in sorted(WEIGHTS_DIR.glob("*.json")):
        card = json.loads(card_path.read_text())
        weight = PretrainedWeight(
            model=card["model"], dataset=card["dataset"], path=card_path.with_suffix(".safetensors"), card=card
        )
        weights[weight.name] = weight
    return weights


def shipped_weight(name: str) -> PretrainedWeight:
    """The shipped weight ``<model>-<dataset>``; an unknown name raises :class:`PretrainedError` listing them."""
    weights = shipped_weights()
    if name not in weights:
        raise PretrainedError(
            f"no shipped pretrained weight {name!r}; shipped: {', '.join(weights) or 'none'} "
            "(`capsnets list-models --pretrained`)"
        )
    return weights[name]


def resolve_pretrained(pretrained: str | os.PathLike, model: str | None = None, *, sha256: str | None = None) -> Path:
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


def download_weights(
    url: str, sha256: str | None, cache_dir: str | os.PathLike | None = None, timeout: float = 60.0
) -> Path:
    """Download ``url`` into ``cache_dir`` (default :data:`CACHE_DIR`) atomically, verified against ``sha256``.

    A file already cached under its SHA-256 is used without a download. A download whose SHA-256 differs is
    deleted and refused; nothing is left in the cache.
    """
    if not sha256 or len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256.lower()):
        raise PretrainedError(
            f"a pretrained weight from a URL needs its expected SHA-256 (64 hex digits), got "
            f"{sha256!r}; pass sha256=... (the model card or the publisher gives it)"
        )
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
            raise PretrainedError(
                f"pretrained weight {url} has SHA-256 {found}, expected {sha256}; refused "
                "(a damaged download or a different file)"
            )

    atomic_write(target, fetch, fsync=True)
    return target


def load_pretrained(
    pretrained: str | os.PathLike,
    model: str | None = None,
    *,
    sha256: str | None = None,
    device: str | torch.device = "cpu",
) -> tuple[nn.Module, Checkpoint]:
    """Rebuild and load the model a pretrained weight records (see :func:`resolve_pretrained`), in eval mode.

    Raises:
        PretrainedError: as :func:`resolve_pretrained`, or the weight is for another model than ``model``.
    """
    module, checkpoint = load_model(resolve_pretrained(pretrained, model, sha256=sha256), device)
    if model is not None and checkpoint.meta.get("model") != model:
        raise PretrainedError(
            f"pretrained weight '{checkpoint.path}' is for model {checkpoint.meta.get('model')!r}, not {model!r}"
        )
    return module, checkpoint


def save_pretrained(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    dataset: str,
    card: dict[str, Any],
    half: bool = False,
    classes: list[str] | None = None,
) -> Path:
    """Write ``model`` as a pretrained weight: a checkpoint without optimizer state, its sidecar carrying the
    model ``card`` (data, command, seed, test_accuracy, date...), float16 tensors when ``half``; then add the
    file's SHA-256 to the readable ``.json`` copy (the model card)."""
    saved = copy.deepcopy(model).cpu()
    if half:
        saved = saved.half()
    meta = {
        "model": model.model_name,
        "model_args": model.model_args,
        "dataset": dataset,
        "metrics": {"test_accuracy": card["test_accuracy"]},
        "card": {**card, "dtype": "float16" if half else "float32", "torch": torch.__version__},
    }
    if classes is not None:
        meta["classes"] = list(classes)
    path = save_model(path, saved, meta=meta)
    sidecar = json.loads(sidecar_path(path).read_text())
    sidecar["sha256"] = file_sha256(path)
    text = json.dumps(sidecar, indent=2) + "\n"
    atomic_write(sidecar_path(path), lambda tmp: Path(tmp).write_text(text))
    return path


def without_decoder(model: nn.Module) -> nn.Module:
    """``model`` rebuilt with ``reconstruction=False`` and loaded with its weights but the decoder's."""
    if "reconstruction" not in model_arguments(model.model_name):
        raise PretrainedError(
            f"model '{model.model_name}' has no 'reconstruction' argument; it cannot be published without a decoder"
        )
    bare = registry.create_model(model.model_name, **{**model.model_args, "reconstruction": False})
    state = model.state_dict()
    missing = [key for key in bare.state_dict() if key not in state]
    if missing:
        raise PretrainedError(
            f"model '{model.model_name}' without its decoder has weights the trained model lacks: {missing[:3]}"
        )
    bare.load_state_dict({key: state[key] for key in bare.state_dict()})
    return bare.eval()


def _check_sha256(path: Path, expected: str) -> None:
    found = file_sha256(path)
    if found != expected.lower():
        raise PretrainedError(
            f"pretrained weight '{path}' has SHA-256 {found}, expected {expected}; refused (the "
            "file is damaged or was replaced)"
        )


def _canonical(dataset: str) -> str:
    return dataset.lower().replace("-", "_")
