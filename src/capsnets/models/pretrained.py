"""Pretrained weights: the ones shipped with the package, described as torchvision describes its weights.

Each shipped weight is a :class:`Weights`: its name (``"<model>-<dataset>"``), the file, its SHA-256, and a
``meta`` dictionary with what a user needs to feed the model and to judge it (the class names, the input size,
the normalisation, the parameter count, the test accuracy with its data set, and the command that trained it).
``weights.transforms()`` turns a file path, a Pillow image, an array or a tensor into the model's input, as
torchvision's ``weights.transforms()`` does. :func:`get_weights` finds one weight by name; :func:`get_model_weights`
lists a model's weights as a :class:`ModelWeights` (torchvision's functions of the same names). A weight's name is
also accepted in timm's spelling, ``"<model>.<dataset>"`` (``"capsnet_small.mnist"``), wherever a name is taken
(:func:`resolve_pretrained`). The files are checkpoints in the library's one
format (:mod:`capsnets.checkpoints`), ``capsnets/weights/<model>-<dataset>.safetensors`` beside
``<model>-<dataset>.json``, the export of its sidecar with the file's SHA-256 added: the weight's model card, read to
list the weights (loading a weight reads the sidecar in its header).

Examples::

    >>> weights = get_weights("capsnet_small-mnist")
    >>> weights.meta["categories"][:3], weights.meta["input_size"]
    (['0', '1', '2'], (1, 28, 28))
    >>> model = capsnets.create_model("capsnet_small", pretrained=weights)      # doctest: +SKIP
    >>> batch = torch.stack([weights.transforms()("digit.png")])              # doctest: +SKIP
"""

from __future__ import annotations

import glob
import json
import os
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsnets.checkpoints import CheckpointError
from capsnets.files import atomic_write, atomic_write_text, file_sha256
from capsnets.images import NORB_LIKE, ImageTransform, framing
from capsnets.models import registry
from capsnets.models.download import DownloadError, check_url, fetch, max_download_bytes
from capsnets.validation import ArgumentError, shown

__all__ = [
    "CACHE_DIR",
    "LEFTOVER_AGE_S",
    "WEIGHTS_DIR",
    "ModelWeights",
    "PretrainedError",
    "Weights",
    "download_weights",
    "get_model_weights",
    "get_weights",
    "resolve_pretrained",
]

#: The folder of the weights shipped inside the package.
WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"
#: Where weights downloaded from a URL are kept, named by their SHA-256.
CACHE_DIR = Path.home() / ".cache" / "capsnets" / "weights"
#: Seconds after which a temporary file of a download in :data:`CACHE_DIR` is taken as left by a killed process
#: (an error removes its own at once) and removed by the next download of the same file.
LEFTOVER_AGE_S = 24 * 3600
#: The data set whose weight a model loads for ``pretrained=True`` when it has several.
DEFAULT_DATASET = "mnist"


class PretrainedError(CheckpointError):
    """A pretrained weight is unknown, missing, fails its SHA-256, or does not fit the model asked for."""


@dataclass(frozen=True)
class Weights:
    """A weight shipped with the package (torchvision's ``Weights``), read from its model card.

    Attributes:
        name: ``"<model>-<dataset>"``, what :func:`get_weights` and ``--pretrained`` take.
        model: the registered model it is for.
        dataset: the data set it was trained and tested on (``"mnist"``, ``"fashion_mnist"``).
        path: the ``.safetensors`` file.
        sha256: the file's SHA-256 (hex), checked before the file is loaded.
        default: whether ``create_model(model, pretrained=True)`` loads this weight.
        meta: ``categories`` (the class names, in the order of the model's scores), ``input_size``
            (``(C, H, W)``), ``normalization`` (see below), ``num_params`` (trainable parameters),
            ``metrics`` (``{dataset: {"accuracy": fraction, "test_images": count}}``, on the data set's test split),
            ``recipe`` (the command that trained it) and ``card`` (the whole model card: data, seed, epochs, date,
            dtype, torch version).

    ``meta["framing"]`` says how the training images were framed, which :meth:`transforms` repeats on a user's
    image (:func:`capsnets.images.framing`: for MNIST, the digit's box scaled to 20x20 and centred by its centre
    of mass in 28x28).

    ``meta["normalization"]`` says what the model's input holds: pixels scaled to ``[0, 1]`` (``uint8 / 255``,
    ``mean`` 0 and ``std`` 1 per channel: nothing subtracted) for most data sets; for smallNORB-like data
    (``per_image_standardization``) each image standardised to zero mean and unit variance
    (:func:`capsnets.images.standardize`), with no fixed ``mean`` and ``std``. :meth:`transforms` does either.

    Examples::

        >>> weights = get_weights("capsnet_small-fashion_mnist")
        >>> weights.meta["categories"][0], weights.meta["metrics"]["fashion_mnist"]["test_images"]
        ('T-shirt/top', 10000)
        >>> weights.meta["normalization"]["mean"], weights.meta["normalization"]["std"]
        ((0.0,), (1.0,))
    """

    name: str
    model: str
    dataset: str
    path: Path
    sha256: str
    default: bool = False
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def transforms(self, *, invert: str = "auto") -> ImageTransform:
        """The preprocessing the model expects: a callable from a path, Pillow image, array or tensor to its
        ``(C, H, W)`` input, and from a batch (a ``(B, C, H, W)`` tensor or a list of images) to its
        ``(B, C, H, W)`` input (:class:`capsnets.images.ImageTransform`; ``invert`` as there).

        Examples::

            >>> get_weights("capsnet_small-mnist").transforms()(torch.zeros(56, 56)).shape
            torch.Size([1, 28, 28])
            >>> get_weights("capsnet_small-mnist").transforms()(torch.zeros(4, 1, 56, 56)).shape
            torch.Size([4, 1, 28, 28])
        """
        return ImageTransform(self.meta["input_size"], self.dataset, invert=invert)


def get_weights(name: str) -> Weights:
    """The shipped weight ``name``, as torchvision's ``get_weights``.

    Args:
        name: the weight's name, ``"<model>-<dataset>"``, or timm's ``"<model>.<dataset>"``
            (what ``list_models(pretrained=True, include_tags=True)`` lists).

    Raises:
        PretrainedError: no shipped weight has that name; the message lists those that exist.
        ArgumentError: ``name`` is not a string.

    Examples::

        >>> get_weights("capsnet_small-mnist").meta["metrics"]
        {'mnist': {'accuracy': 0.9938, 'test_images': 10000}}
        >>> get_weights("capsnet_small.fashion_mnist").name
        'capsnet_small-fashion_mnist'
    """
    if not isinstance(name, str):
        raise ArgumentError(
            f"a weight's name must be a string such as 'capsnet_small-mnist', got {shown(name)}", "name"
        )
    cards = _cards()
    full = _weight_name(name)
    if full not in cards:
        raise PretrainedError(
            f"no shipped pretrained weight {full!r}; shipped: {', '.join(cards) or 'none'} "
            "(`capsnets list-models --pretrained`)"
        )
    return _shipped(cards, cards[full]["model"])[full]


class _UnknownWeight(PretrainedError, KeyError, AttributeError):
    """A :class:`PretrainedError` for a weight a :class:`ModelWeights` does not hold, which is also the
    ``KeyError`` of a mapping and the ``AttributeError`` of an attribute (``in``, ``.get()``, ``hasattr``)."""

    __str__ = Exception.__str__  # the message as written (KeyError's would quote it)


class ModelWeights(Mapping[str, Weights]):
    """The shipped weights of one model (what :func:`get_model_weights` returns): a read-only mapping from each
    weight's name to its :class:`Weights`, the default first, with torchvision's ``DEFAULT`` and tags as
    attributes.

    Iterating gives the weights' names (``"<model>-<dataset>"``), the default first, then the others by name.
    A weight is looked up by its name, by its tag (its data set: ``"mnist"``), by timm's ``"<model>.<dataset>"``,
    or as an attribute named by its tag in upper case (``.MNIST``, ``.FASHION_MNIST``), as torchvision's weight
    enums are. It compares equal to a ``dict`` of the same names and weights.

    Args:
        model: the registered model.
        weights: its weights by name, the default first.

    Attributes:
        model: the model the weights are for.
        DEFAULT: the weight ``create_model(model, pretrained=True)`` loads; a model without shipped weights
            raises :class:`PretrainedError`, which names the models with one.

    Raises:
        PretrainedError: an unknown name or tag (also a ``KeyError``, and an ``AttributeError`` for an attribute);
            the message lists the model's tags.

    Examples::

        >>> weights = get_model_weights("capsnet_small")
        >>> list(weights)
        ['capsnet_small-mnist', 'capsnet_small-fashion_mnist']
        >>> weights.DEFAULT.name, weights.FASHION_MNIST.name
        ('capsnet_small-mnist', 'capsnet_small-fashion_mnist')
        >>> weights["mnist"] is weights["capsnet_small.mnist"] is weights["capsnet_small-mnist"]
        True
        >>> "fashion_mnist" in weights, len(weights)
        (True, 2)
    """

    def __init__(self, model: str, weights: Mapping[str, Weights]) -> None:
        self.model = model
        self._weights = dict(weights)

    @property
    def DEFAULT(self) -> Weights:
        if not self._weights:
            return default_weights(self.model)  # raises, naming the models with weights
        return next(iter(self._weights.values()))

    def __getitem__(self, key: str) -> Weights:
        if isinstance(key, str):
            if key in self._weights:
                return self._weights[key]
            name = _weight_name(key, self.model)
            if name in self._weights:
                return self._weights[name]
        raise self._unknown(key, "")

    def __getattr__(self, name: str) -> Weights:  # only for the attributes the class lacks: the tags
        weights, model = self.__dict__.get("_weights", {}), self.__dict__.get("model")
        if name.startswith("_") or not name.isupper():
            hint = f" (a tag is an attribute in upper case: .{name.upper()})" if f"{model}-{name}" in weights else ""
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}{hint}")
        if f"{model}-{name.lower()}" in weights:
            return weights[f"{model}-{name.lower()}"]
        raise self._unknown(name, "attribute ")

    def __iter__(self) -> Iterator[str]:
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)

    def __repr__(self) -> str:
        return f"ModelWeights(model={self.model!r}, weights={list(self._weights)!r})"

    def __reduce__(self):
        return type(self), (self.model, self._weights)

    @property
    def _tags(self) -> list[str]:
        return [weights.dataset for weights in self._weights.values()]

    def _unknown(self, key, what: str) -> _UnknownWeight:
        if not self._weights:
            return _UnknownWeight(
                f"model {self.model!r} has no shipped pretrained weight ({what}{shown(key)} asked for); models "
                f"with weights: {', '.join(pretrained_models()) or 'none'} (`capsnets list-models --pretrained`)"
            )
        tags = self._tags
        return _UnknownWeight(
            f"model {self.model!r} has no shipped weight {what}{shown(key)}; its tags: {', '.join(tags)} (look one "
            f"up by its tag, {tags[0]!r}, its name, {self.model + '-' + tags[0]!r}, timm's "
            f"{self.model + '.' + tags[0]!r}, or as .{tags[0].upper()})"
        )


def get_model_weights(model: str) -> ModelWeights:
    """The shipped weights of ``model``, as torchvision's ``get_model_weights``: a :class:`ModelWeights`, a
    read-only mapping by name, the default (``pretrained=True``) first and marked ``default``.

    The default is the ``mnist`` weight where one is shipped, else the first by name; ``.DEFAULT`` is it. A model
    without weights gives an empty one.

    Args:
        model: a registered model's name.

    Raises:
        ArgumentError: an unknown model (with a "did you mean").

    Examples::

        >>> list(get_model_weights("capsnet_small"))
        ['capsnet_small-mnist', 'capsnet_small-fashion_mnist']
        >>> get_model_weights("capsnet_small")["capsnet_small-mnist"].default
        True
        >>> get_model_weights("capsnet_small").DEFAULT.name, get_model_weights("capsnet_small").MNIST.dataset
        ('capsnet_small-mnist', 'mnist')
        >>> len(get_model_weights("capsnet"))
        0
    """
    registry.model_arguments(model)  # an unknown name is reported as such
    return ModelWeights(model, _shipped(_cards(), model))


def default_weights(model: str) -> Weights:
    """The weight ``create_model(model, pretrained=True)`` loads; :class:`PretrainedError` for a model without one,
    listing the models that have weights."""
    found = get_model_weights(model)
    if not found:
        raise PretrainedError(
            f"model {model!r} has no shipped pretrained weight; models with weights: "
            f"{', '.join(pretrained_models()) or 'none'} (`capsnets list-models --pretrained`)"
        )
    return next(iter(found.values()))


def pretrained_models() -> list[str]:
    """The models with a shipped weight, sorted (read from the cards' ``model`` entries only)."""
    return sorted({card["model"] for card in _cards().values()})


def pretrained_tags() -> dict[str, list[str]]:
    """The tags (data sets) of the shipped weights by model, models sorted, each model's default first (read from
    the cards alone, without building the models)."""
    cards = _cards()
    return {model: [card["dataset"] for card in _ordered(cards, model)] for model in pretrained_models()}


registry.set_pretrained_source(pretrained_tags)  # list_models(pretrained=True, include_tags=...)


def resolve_pretrained(
    pretrained: str | os.PathLike | Weights | bool, model: str | None = None, *, sha256: str | None = None
) -> Path:
    """The local checkpoint file that ``pretrained`` names, checked against its SHA-256 where one is known.

    Args:
        pretrained: ``True`` (the default weight of ``model``), a :class:`Weights`, a shipped tag for ``model``
            (a data set: ``"mnist"``, ``"fashion_mnist"``), a shipped name ``"<model>-<dataset>"`` or, as timm
            writes it, ``"<model>.<dataset>"``, a local ``.safetensors`` path or ``file://`` URL, or an
            ``https://`` URL.
        model: the model the weight is for (needed for ``True`` and a bare tag).
        sha256: the file's expected SHA-256 (hex); required for an ``https://`` URL, checked for local files
            when given.

    A URL is downloaded by :func:`download_weights` (its size limit raised by ``$CAPSNETS_MAX_DOWNLOAD_BYTES``).

    Raises:
        PretrainedError: an unknown tag, a model without weights, a missing file, a URL without ``sha256``, a
            SHA-256 mismatch.
        ArgumentError: ``pretrained`` is none of these.

    Examples::

        >>> resolve_pretrained("capsnet_small.mnist").name
        'capsnet_small-mnist.safetensors'
        >>> resolve_pretrained("fashion_mnist", "capsnet_small") == get_weights("capsnet_small-fashion_mnist").path
        True
    """
    if not isinstance(pretrained, (str, os.PathLike, Weights)) and pretrained is not True:
        raise ArgumentError(
            f"pretrained must be True, a Weights, a weight's tag or name ('mnist', 'capsnet_small-mnist', "
            f"'capsnet_small.mnist'), a .safetensors path or a URL; got {shown(pretrained)}",
            "pretrained",
        )
    if pretrained is True:
        if model is None:
            raise PretrainedError("pretrained=True needs the model's name; give a weight's name instead")
        pretrained = default_weights(model)
    if isinstance(pretrained, Weights):
        _check_sha256(pretrained.path, sha256 or pretrained.sha256)
        return pretrained.path
    text = os.fspath(pretrained)
    scheme = urllib.parse.urlparse(text).scheme.lower()
    if scheme in ("http", "https"):
        return download_weights(text, sha256)
    if scheme == "file":
        text = urllib.request.url2pathname(urllib.parse.urlparse(text).path)
    elif scheme and len(scheme) > 1:  # not a Windows drive letter
        raise PretrainedError(f"pretrained URL {text!r}: only https:// and file:// URLs are read")
    if not text.endswith(".safetensors"):
        weights = get_weights(_weight_name(text, model))
        _check_sha256(weights.path, sha256 or weights.sha256)
        return weights.path
    path = Path(text).expanduser()
    if not path.is_file():
        raise PretrainedError(f"pretrained weight file '{path}' does not exist")
    if sha256 is not None:
        _check_sha256(path, sha256)
    return path


def download_weights(
    url: str,
    sha256: str | None,
    cache_dir: str | os.PathLike | None = None,
    timeout: float = 60.0,
    *,
    max_bytes: int | None = None,
) -> Path:
    """Download ``url`` into ``cache_dir`` (default :data:`CACHE_DIR`) atomically, verified against ``sha256``.

    A file already cached under its SHA-256 is used without a download. The download goes to a temporary file
    beside the cached one, renamed into place only once its SHA-256 matches; on any failure (a digest that
    differs, the size limit, a stalled server, a connection dropped mid-body) it is removed and nothing is left
    in the cache. One left by a killed process is removed by the next download of the same file, once it is
    :data:`LEFTOVER_AGE_S` old. The bounds are those of :func:`capsnets.models.download.fetch`: ``https://`` only (plain
    ``http://`` to this machine's loopback alone, redirects included), a maximum size checked while streaming,
    and a timeout on every read.

    Args:
        url: an ``https://`` URL (or ``file://``, or ``http://`` to ``localhost``, ``127.0.0.1``, ``::1``).
        sha256: the file's expected SHA-256 (64 hex digits).
        cache_dir: the folder of downloaded weights (default :data:`CACHE_DIR`).
        timeout: the most seconds to wait for the connection or for each read of the body.
        max_bytes: the largest file accepted, in bytes (default: ``$CAPSNETS_MAX_DOWNLOAD_BYTES``, else
            :data:`~capsnets.models.download.MAX_DOWNLOAD_BYTES`, 1 GiB).

    Raises:
        PretrainedError: no valid ``sha256``; the URL is refused, unreachable, too large, stalled or cut short; the
            file's SHA-256 differs.
        ArgumentError: ``max_bytes`` (or the environment variable) is not a positive integer.

    Examples::

        >>> download_weights("http://example.org/w.safetensors", "0" * 64)
        Traceback (most recent call last):
            ...
        capsnets.models.pretrained.PretrainedError: 'http://example.org/w.safetensors': plain http:// is refused ...
    """
    if not sha256 or len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256.lower()):
        raise PretrainedError(
            f"a pretrained weight from a URL needs its expected SHA-256 (64 hex digits), got "
            f"{sha256!r}; pass sha256=... (the model card or the publisher gives it)"
        )
    sha256 = sha256.lower()
    limit = max_download_bytes(max_bytes)
    try:
        check_url(url)
    except DownloadError as err:
        raise PretrainedError(str(err)) from None
    folder = Path(cache_dir) if cache_dir is not None else CACHE_DIR
    target = folder / f"{sha256[:16]}-{Path(urllib.parse.urlparse(url).path).name or 'weights.safetensors'}"
    if target.is_file() and file_sha256(target) == sha256:
        return target
    _remove_leftovers(target)

    def download(tmp: str) -> None:
        try:
            found = fetch(url, tmp, max_bytes=limit, timeout=timeout)
        except DownloadError as err:
            raise PretrainedError(f"pretrained weight: {err}") from err
        if found != sha256:
            raise PretrainedError(
                f"pretrained weight {url} has SHA-256 {found}, expected {sha256}; refused, nothing is kept "
                "(a damaged download or a different file)"
            )

    atomic_write(target, download, fsync=True)
    return target


def _remove_leftovers(target: Path) -> None:
    """Remove the temporary files of ``target`` that a killed download left in the cache: those not written to for
    :data:`LEFTOVER_AGE_S` (a download under way writes to its own at least every ``timeout`` seconds)."""
    cutoff = time.time() - LEFTOVER_AGE_S
    for leftover in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        try:
            if leftover.stat().st_mtime < cutoff:
                leftover.unlink()
        except OSError:  # removed by another process meanwhile
            pass


def stamp_sha256(path: str | os.PathLike) -> None:
    """Add the SHA-256 of the ``.safetensors`` file ``path`` to its sidecar's ``.json`` export (the model card)."""
    card_path = Path(path).with_suffix(".json")
    card = json.loads(card_path.read_text())
    card["sha256"] = file_sha256(path)
    text = json.dumps(card, indent=2) + "\n"
    atomic_write_text(card_path, text)


def _cards() -> dict[str, dict[str, Any]]:
    """The model cards in :data:`WEIGHTS_DIR` by weight name, sorted, each with its ``path``."""
    cards = {}
    for path in sorted(WEIGHTS_DIR.glob("*.json")):
        card = json.loads(path.read_text())
        cards[f"{card['model']}-{card['dataset']}"] = {**card, "path": path.with_suffix(".safetensors")}
    return cards


def _ordered(cards: dict[str, dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """The cards of ``model`` among ``cards``, the default first (its :data:`DEFAULT_DATASET` one), then by name."""
    mine = [card for card in cards.values() if card["model"] == model]
    return sorted(mine, key=lambda card: (card["dataset"] != DEFAULT_DATASET, card["path"].name))


def _shipped(cards: dict[str, dict[str, Any]], model: str) -> dict[str, Weights]:
    """The weights of ``model`` among ``cards``, by name, the default first."""
    return {
        f"{model}-{card['dataset']}": _weights(card, default=k == 0) for k, card in enumerate(_ordered(cards, model))
    }


def _weight_name(text: str, model: str | None = None) -> str:
    """The ``"<model>-<dataset>"`` name a user's spelling of a weight means: timm's ``"<model>.<dataset>"`` (for a
    registered model), a bare tag (a data set, any case, ``-`` for ``_``) of ``model``, or the text as it is (a
    name, or one :func:`get_weights` refuses)."""
    head, dot, tag = text.partition(".")
    if dot and tag and head in registry.list_models():
        return f"{head}-{_canonical(tag)}"
    if model is None or text.startswith(f"{model}-") or text in _cards():
        return text
    return f"{model}-{_canonical(text)}"


def _weights(card: dict[str, Any], default: bool) -> Weights:
    model, dataset = card["model"], card["dataset"]
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in (card.get("model_args") or {}).items()}
    built = registry.create_model(model, **args)  # for its sizes (the meta device takes seconds to start)
    channels = int(built.input_size[0])
    if dataset in NORB_LIKE:
        normalization = {"scale": (0.0, 1.0), "mean": None, "std": None, "per_image_standardization": True}
    else:
        normalization = {
            "scale": (0.0, 1.0),
            "mean": (0.0,) * channels,
            "std": (1.0,) * channels,
            "per_image_standardization": False,
        }
    details = card["card"]
    meta = {
        "categories": [str(c) for c in card.get("classes") or range(int(built.num_classes))],
        "input_size": tuple(int(v) for v in built.input_size),
        "normalization": normalization,
        "framing": framing(dataset, built.input_size),
        "num_params": registry.count_parameters(built),
        "metrics": {dataset: {"accuracy": float(details["test_accuracy"]), "test_images": details.get("test_images")}},
        "recipe": details.get("command"),
        "card": details,
    }
    return Weights(f"{model}-{dataset}", model, dataset, card["path"], str(card["sha256"]), default, meta)


def _check_sha256(path: Path, expected: str) -> None:
    found = file_sha256(path)
    if found != expected.lower():
        raise PretrainedError(
            f"pretrained weight '{path}' has SHA-256 {found}, expected {expected}; refused (the "
            "file is damaged or was replaced)"
        )


def _canonical(dataset: str) -> str:
    return dataset.lower().replace("-", "_")
