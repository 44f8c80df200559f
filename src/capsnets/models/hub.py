"""Models from files: building a model from a checkpoint, saving one, and pretrained weights.

:func:`create_model` is the registry's :func:`~capsnets.models.registry.create_model` plus ``pretrained=``
(timm's ``create_model(..., pretrained=True)``). :func:`load_model` rebuilds the model a checkpoint or a run
directory records and loads its weights; :func:`save_model` writes one. Files are read and written by
:mod:`capsnets.checkpoints`; the shipped weights are described in :mod:`capsnets.models.pretrained`.

A model loaded from a file carries ``class_names`` (the class names its checkpoint records) and
``checkpoint_meta`` (the checkpoint's sidecar: model, data set, metrics, configuration...).

Examples::

    >>> model = create_model("capsnet_small", pretrained=True)                     # shipped, offline
    >>> model.class_names[:3]
    ['0', '1', '2']
    >>> model = load_model("runs/quickstart")                                       # doctest: +SKIP
    >>> model = create_model("capsnet_small", pretrained="https://example.org/w.safetensors",
    ...                      sha256="9f86d0...")                                    # doctest: +SKIP
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from capsnets.checkpoints import Checkpoint, CheckpointError, load_checkpoint, write_checkpoint
from capsnets.models import registry
from capsnets.models.legacy_args import upgrade_model_args
from capsnets.models.pretrained import PretrainedError, Weights, resolve_pretrained, stamp_sha256
from capsnets.models.registry import model_arguments
from capsnets.validation import ArgumentError, shown

logger = logging.getLogger(__name__)

#: The name the classifier layer of capsnets 0.2.0 and earlier had in checkpoints (now ``class_capsules``).
_OLD_CLASSIFIER, _CLASSIFIER = "classes.", "class_capsules."


def create_model(
    name: str,
    *,
    pretrained: bool | str | os.PathLike | Weights | None = None,
    sha256: str | None = None,
    **overrides,
) -> nn.Module:
    """Build a registered model, with trained weights when ``pretrained`` is given.

    Args:
        name: a name from :func:`~capsnets.models.list_models`, or timm's ``"<model>.<tag>"``
            (``"capsnet_small.fashion_mnist"``: with ``pretrained=True``, that weight).
        pretrained: ``True`` loads the model's default shipped weight (:func:`~capsnets.models.get_model_weights`;
            ``list_models(pretrained=True)`` lists the models that have one); ``False`` or None builds it without
            weights. Otherwise the weight to load: a :class:`~capsnets.models.Weights`, a shipped tag (the data
            set, e.g. ``"mnist"``) or name (``"capsnet_small-mnist"``), a local ``.safetensors`` checkpoint, a run
            directory (its best checkpoint, else its last) or ``file://`` URL, or an ``https://`` URL (then
            ``sha256`` is required). The model is built with the arguments the weight records; ``overrides``
            change them as for fine-tuning (timm's manner): every tensor whose shape still fits is loaded, the
            others (the class capsules and the decoder's layers that depend on the class count for another
            ``num_classes``) keep their fresh initialisation, and an input convolution is adapted to another
            ``in_chans`` (:func:`adapt_input_conv`); one line (logged at INFO) says what was re-initialised, and
            the model's ``transfer`` attribute holds it (:class:`Transfer`). Returned in eval mode, with
            ``class_names`` (the weight's, unless the class count changed) and ``checkpoint_meta`` (the weight's
            sidecar; with overrides, ``pretrained_from`` names the weight).
        sha256: the expected SHA-256 of the ``pretrained`` file (hex).
        **overrides: keyword arguments of the model's builder (e.g. ``num_classes``, ``input_size``,
            ``routing`` (a routing object or its spec), ``device``); see
            :func:`~capsnets.models.model_schema` and :func:`capsnets.models.registry.create_model`. ``in_chans``
            (timm's name) sets the channels of ``input_size``.

    Raises:
        PretrainedError: ``pretrained=True`` for a model without a shipped weight (the message lists the models
            with one), an unknown tag, a missing file, a SHA-256 mismatch, or a weight of another model.

    Examples:
        >>> model = create_model("capsnet_small", num_classes=10)
        >>> model = create_model("capsnet_digits", routing=DynamicRouting(2))
        >>> model = create_model("capsnet_small", pretrained=True)   # the MNIST weight
        >>> model = create_model("capsnet_small", pretrained="fashion_mnist")
        >>> model.class_names[:2]
        ['T-shirt/top', 'Trouser']
        >>> model = create_model("capsnet_small", pretrained=True, num_classes=5, in_chans=3)
        >>> model.transfer.reinitialised
        ['class_capsules.weight', 'decoder.mlp.0.weight', 'decoder.mlp.4.weight', 'decoder.mlp.4.bias']
    """
    if isinstance(name, str) and "." in name and name.split(".", 1)[0] in registry.list_models():
        name, tag = name.split(".", 1)  # timm's "model.tag": the weight of that tag, with pretrained=True
        pretrained = f"{name}.{tag}" if pretrained is True else pretrained
    if "in_chans" in overrides:
        overrides = _with_in_chans(name, overrides)
    if pretrained is None or pretrained is False:
        if sha256 is not None:
            raise ArgumentError("sha256 is the expected digest of a pretrained weight; pass it with pretrained=...")
        return registry.create_model(name, **overrides)
    model_arguments(name)  # an unknown name is reported as such
    device = overrides.pop("device", None) or "cpu"
    trained = load_pretrained(pretrained, name, sha256=sha256, device="cpu")
    if not overrides:
        return trained.to(device)
    args = {**trained.model_args, **overrides}
    model = registry.create_model(name, **args)
    source = _source(pretrained, name, trained.checkpoint_meta.get("dataset"))
    model.transfer = transfer_weights(
        model, trained.state_dict(), channels=(trained.input_size[0], model.input_size[0])
    )
    logger.info("%s from %s: %s", name, source, model.transfer)
    if getattr(model, "num_classes", None) == getattr(trained, "num_classes", None):
        model.class_names = list(trained.class_names)
    model.checkpoint_meta = {**copy.deepcopy(trained.checkpoint_meta), "pretrained_from": source}
    return model.to(device).eval()


def get_model(name: str, weights: Weights | str | os.PathLike | None = None, **kwargs) -> nn.Module:
    """A registered model, with the shipped weight ``weights`` loaded, as torchvision's ``get_model``: the same as
    ``create_model(name, pretrained=weights, **kwargs)`` (:func:`create_model`).

    Args:
        name: a name from :func:`~capsnets.models.list_models`.
        weights: the weight to load: a :class:`~capsnets.models.Weights` (``get_model_weights(name).DEFAULT``), a
            weight's tag (``"mnist"``) or name (``"capsnet_small-mnist"``, timm's ``"capsnet_small.mnist"``), or
            anything else ``create_model``'s ``pretrained`` takes (a ``.safetensors`` file, a run directory, a URL
            with ``sha256=``); None builds the model untrained.
        **kwargs: what :func:`create_model` takes besides ``pretrained``: the builder's arguments (which change a
            weight's model as for fine-tuning), ``sha256``.

    Raises:
        PretrainedError: an unknown tag or name (the message lists those shipped), a weight of another model.
        ArgumentError: an unknown model, a ``weights`` of another type, an argument the model does not take.

    Examples::

        >>> model = get_model("capsnet_small", weights=capsnets.get_model_weights("capsnet_small").DEFAULT)
        >>> model.checkpoint_meta["dataset"], model.training
        ('mnist', False)
        >>> get_model("capsnet_small", weights="capsnet_small.fashion_mnist").class_names[1]
        'Trouser'
        >>> get_model("capsnet_small", num_classes=5).num_classes
        5
    """
    return create_model(name, pretrained=weights, **kwargs)


def _source(pretrained, name: str, dataset: str | None) -> str:
    """The weight a model was fine-tuned from, as a user names it: a shipped weight's name, else the path or URL."""
    if isinstance(pretrained, Weights):
        return pretrained.name
    if pretrained is True or (isinstance(pretrained, str) and pretrained == dataset and not Path(pretrained).exists()):
        return f"{name}-{dataset}"
    return os.fspath(pretrained)


def _with_in_chans(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with timm's ``in_chans`` turned into the channels of ``input_size``."""
    overrides = dict(overrides)
    channels = overrides.pop("in_chans")
    if not isinstance(channels, int) or isinstance(channels, bool) or channels < 1:
        raise ArgumentError(
            f"in_chans must be a positive int (the images' channels), got {shown(channels)}", "in_chans"
        )
    schema = registry.model_schema(name)
    if "input_size" not in schema:
        raise ArgumentError(f"model {name!r} takes no input_size, so in_chans cannot change it", "in_chans")
    size = overrides.get("input_size") or schema["input_size"].default
    overrides["input_size"] = (channels, *tuple(size)[1:])
    return overrides


class Transfer(NamedTuple):
    """What :func:`transfer_weights` did, by ``state_dict`` name."""

    loaded: list[str]  # copied as they were
    adapted: list[str]  # input convolutions adapted to another number of image channels
    reinitialised: list[str]  # the model's own: not in the weights, or of another shape there
    unused: list[str]  # in the weights, not in the model

    def __str__(self) -> str:
        parts = [f"loaded {len(self.loaded)} of {len(self.loaded) + len(self.adapted) + len(self.reinitialised)}"]
        if self.adapted:
            parts.append(f"adapted {', '.join(self.adapted)} to the image channels")
        if self.reinitialised:
            parts.append(f"re-initialised {', '.join(self.reinitialised)}")
        if self.unused:
            parts.append(f"left out {', '.join(self.unused)}")
        return "; ".join(parts)


def adapt_input_conv(weight: torch.Tensor, channels: int) -> torch.Tensor:
    """A convolution's weight for images of ``channels`` channels from one trained on another count, by timm's
    rule (``timm.models.adapt_input_conv``): summed over the trained channels for one channel, else the trained
    channels repeated to ``channels`` and scaled by (trained / new), so that a grey image (every channel equal)
    gets the trained response where ``channels`` is 1 or a multiple of the trained count.

    Shape:
        weight ``(O, I, kH, kW)`` -> ``(O, channels, kH, kW)``

    Examples:
        >>> adapt_input_conv(torch.ones(8, 1, 3, 3), 3).shape
        torch.Size([8, 3, 3, 3])
        >>> adapt_input_conv(torch.ones(8, 3, 3, 3), 1)[0, 0, 0, 0].item()
        3.0
    """
    if weight.dim() != 4 or not isinstance(channels, int) or channels < 1:
        raise ArgumentError(f"need a (O, I, kH, kW) weight and channels >= 1, got {tuple(weight.shape)}, {channels!r}")
    trained = weight.shape[1]
    if channels == 1:
        return weight.sum(dim=1, keepdim=True)
    repeats = -(-channels // trained)
    return weight.repeat(1, repeats, 1, 1)[:, :channels] * (trained / channels)


def transfer_weights(
    model: nn.Module, state: dict[str, torch.Tensor], *, channels: tuple[int, int] | None = None
) -> Transfer:
    """Load into ``model`` every tensor of ``state`` whose name and shape fit, leaving the others as the model
    initialised them: the start of a fine-tuning (timm's ``create_model(..., pretrained=True, num_classes=K)``).

    Args:
        model: the model to load into.
        state: a ``state_dict`` of the same family of model.
        channels: ``(trained, new)`` image channels: a 4-D weight that differs from the model's only in its input
            channels, ``trained`` against ``new``, is adapted (:func:`adapt_input_conv`) instead of re-initialised.

    Returns:
        a :class:`Transfer`; ``str()`` of it is the one-line account.

    Examples:
        >>> trained = registry.create_model("capsnet_digits")
        >>> model = registry.create_model("capsnet_digits", num_classes=4)
        >>> transfer_weights(model, trained.state_dict()).reinitialised
        ['class_capsules.weight', 'decoder.mlp.0.weight']
    """
    own = model.state_dict()
    chosen, loaded, adapted, fresh = {}, [], [], []
    for name, target in own.items():
        source = state.get(name)
        if source is not None and source.shape == target.shape:
            chosen[name] = source
            loaded.append(name)
        elif (
            source is not None
            and channels is not None
            and source.dim() == target.dim() == 4
            and (source.shape[1], target.shape[1]) == tuple(channels)
            and (source.shape[0], *source.shape[2:]) == (target.shape[0], *target.shape[2:])
        ):
            chosen[name] = adapt_input_conv(source, target.shape[1])
            adapted.append(name)
        else:
            fresh.append(name)
    with torch.no_grad():
        for name, value in chosen.items():
            own[name].copy_(value)
    return Transfer(loaded, adapted, fresh, sorted(set(state) - set(own)))


def build_model(name: str, model_args: dict[str, Any] | None = None, *, pretrained: Any = None) -> nn.Module:
    """``create_model(name, pretrained=pretrained, **model_args)`` for recorded arguments: those of an earlier
    capsnets translated (``capsnets.models.legacy_args.upgrade_model_args``), list values (from YAML/JSON) as
    tuples. With ``pretrained``, the arguments change the weight's model (fine-tuning; :func:`create_model`)."""
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in upgrade_model_args(name, model_args).items()}
    if pretrained is not None:
        return create_model(name, pretrained=pretrained, **args).train()
    return registry.create_model(name, **args)


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s ``state_dict`` as a checkpoint stores it (keys ``model.<name>``)."""
    return {f"model.{k}": v for k, v in model.state_dict().items()}


def save_model(path: str | os.PathLike, model: nn.Module, *, meta: dict[str, Any] | None = None) -> Path:
    """Write a model built by :func:`create_model` to a checkpoint that :func:`load_model` rebuilds it from.

    Args:
        path: target ``.safetensors`` file (its sidecar is exported beside it as ``.json``).
        model: a model with ``model_name`` and ``model_args`` (as :func:`create_model` returns it).
        meta: other JSON-safe entries for the sidecar (data set, metrics, ``classes``...).

    Examples::

        >>> save_model("runs/m.safetensors", create_model("capsnet_small"))   # doctest: +SKIP
        >>> model = load_model("runs/m.safetensors")                          # doctest: +SKIP
    """
    meta = {"model": model.model_name, "model_args": model.model_args, **(meta or {})}
    return write_checkpoint(path, model_tensors(model), meta)


def load_model(path_or_run_dir: str | os.PathLike, device: str | torch.device = "cpu") -> nn.Module:
    """The trained model of a run directory or checkpoint file, on ``device``, in eval mode.

    The model is rebuilt from the name and arguments its checkpoint records and its weights are loaded
    (:func:`model_from_checkpoint`). It carries ``class_names`` (the class names the run recorded) and
    ``checkpoint_meta`` (the checkpoint's sidecar, a dict: model, data set, epoch, metrics, configuration).

    Args:
        path_or_run_dir: a run directory (its best checkpoint, else its last), or a ``.safetensors`` / ``.json``
            checkpoint file.
        device: where the model goes.

    Raises:
        CheckpointError: no checkpoint in the directory, a file that cannot be read
            (:func:`capsnets.checkpoints.load_checkpoint`), that names no model, records arguments that do not build it,
            or whose weights do not fit the model.

    Examples::

        >>> model = load_model("runs/quickstart")                    # doctest: +SKIP
        >>> model.class_names, model.checkpoint_meta["dataset"]      # doctest: +SKIP
        (['0', '1', '2', '3', '4', '5', '6', '7', '8', '9'], 'mnist')
    """
    return model_from_checkpoint(load_checkpoint(path_or_run_dir), device)


def model_from_checkpoint(checkpoint: Checkpoint, device: str | torch.device = "cpu") -> nn.Module:
    """Rebuild the model a loaded checkpoint's sidecar records, load its weights, move it to ``device`` (eval mode).

    For code that needs the :class:`~capsnets.checkpoints.Checkpoint` itself (its path, its tensors): read it with
    :func:`capsnets.checkpoints.load_checkpoint`, then build the model here. The model gets ``class_names`` (the sidecar's
    ``classes``, else ``"0"``, ``"1"``...) and ``checkpoint_meta`` (a copy of the sidecar).

    Raises:
        CheckpointError: as :func:`load_model`.
    """
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
    recorded = checkpoint.meta.get("classes")
    if isinstance(recorded, list) and len(recorded) == getattr(model, "num_classes", None):
        model.class_names = [str(c) for c in recorded]
    model.checkpoint_meta = copy.deepcopy(checkpoint.meta)
    return model.to(device).eval()


def restore_model(model: nn.Module, checkpoint: Checkpoint) -> None:
    """Load the checkpoint's weights into ``model``; a key, shape or kind mismatch, or a NaN or infinite weight,
    raises ``CheckpointError``."""
    check_fits(model, checkpoint)
    _check_finite(checkpoint)
    model.load_state_dict(checkpoint.model_state())


def check_fits(model: nn.Module, checkpoint: Checkpoint) -> None:
    """Raise ``CheckpointError`` unless ``model``'s parameters and buffers have the checkpoint's names and shapes
    (``model`` may live on the meta device). A checkpoint whose classifier layer has the name it had in capsnets
    0.2.0 (``classes``, now ``class_capsules``) gets an error saying how to rename its tensors."""
    state = checkpoint.model_state()
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if any(k.startswith(_OLD_CLASSIFIER) for k in unexpected) and any(k.startswith(_CLASSIFIER) for k in missing):
        raise CheckpointError(_renamed_classifier_message(checkpoint))
    kinds = [k for k in expected if k in state and _kind(state[k].dtype) != _kind(expected[k].dtype)]
    if kinds:
        found = ", ".join(f"{k}: {state[k].dtype} for {expected[k].dtype}" for k in kinds[:3])
        raise CheckpointError(
            f"checkpoint '{checkpoint.path}' holds tensors of another kind than the model's ({found}); loading "
            "them would cast the weights into other numbers. Use a checkpoint written by capsnets, or retrain"
        )
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"checkpoint '{checkpoint.path}' does not fit the model (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, wrong shape {wrong[:5]}); build the model with the checkpoint's model name "
            f"and model_args ({checkpoint.meta.get('model')!r}, {checkpoint.meta.get('model_args')})"
        )


def _kind(dtype: torch.dtype) -> str:
    """``"float"`` (any precision), ``"complex"``, ``"bool"`` or ``"int"``: what a checkpoint may store a tensor as."""
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "float"
    return "bool" if dtype == torch.bool else "int"


def _check_finite(checkpoint: Checkpoint) -> None:
    """Raise ``CheckpointError`` when a weight of ``checkpoint`` is NaN or infinite (such a model answers noise)."""
    bad = [k for k, t in checkpoint.model_state().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise CheckpointError(
            f"checkpoint '{checkpoint.path}' holds NaN or infinite weights ({', '.join(bad[:3])}); the model would "
            "answer noise. Use an earlier checkpoint of the run, or retrain (a lower --lr avoids a diverging run)"
        )


def _renamed_classifier_message(checkpoint: Checkpoint) -> str:
    version = (checkpoint.meta.get("versions") or {}).get("capsnets", "0.2.0 or earlier")
    path = str(checkpoint.path)
    renamed = path.removesuffix(".safetensors") + "-renamed.safetensors"
    return (
        f"checkpoint '{path}' was saved by capsnets {version}, whose classifier layer was named 'classes'; it is "
        f"now 'class_capsules' (the tensors are the same). Rename its tensors once and load the new file: "
        f'python -c "from capsnets.checkpoints import load_checkpoint as l, write_checkpoint as w; c = l({path!r}); '
        f"w({renamed!r}, {{k.replace('model.classes.', 'model.class_capsules.', 1): v for k, v in "
        f'c.tensors.items()}}, c.meta)" (or retrain)'
    )


def load_pretrained(
    pretrained: bool | str | os.PathLike | Weights,
    model: str | None = None,
    *,
    sha256: str | None = None,
    device: str | torch.device = "cpu",
) -> nn.Module:
    """The model a pretrained weight records (see :func:`~capsnets.models.pretrained.resolve_pretrained`), rebuilt
    and loaded in eval mode, with ``class_names`` and ``checkpoint_meta``.

    Args:
        pretrained: a :class:`~capsnets.models.Weights`, a shipped name (``"capsnet_small-mnist"``), a checkpoint
            file, a run directory (its best checkpoint, else its last) or a URL; with ``model``, also ``True`` or a
            bare tag (``"mnist"``).
        model: the model the weight must be for.
        sha256: the file's expected SHA-256 (required for an ``https://`` URL).
        device: where the model goes.

    Raises:
        PretrainedError: as :func:`~capsnets.models.pretrained.resolve_pretrained`, or the weight is for another
            model than ``model``.

    Examples::

        >>> load_pretrained("capsnet_small-mnist").model_name
        'capsnet_small'
    """
    if isinstance(pretrained, Weights) and model is not None and pretrained.model != model:
        raise PretrainedError(f"pretrained weight {pretrained.name!r} is for model {pretrained.model!r}, not {model!r}")
    if isinstance(pretrained, (str, os.PathLike)) and Path(pretrained).is_dir():  # a run directory
        checkpoint = load_checkpoint(pretrained)
    else:
        checkpoint = load_checkpoint(resolve_pretrained(pretrained, model, sha256=sha256))
    if model is not None and checkpoint.meta.get("model") != model:
        raise PretrainedError(
            f"pretrained weight '{checkpoint.path}' is for model {checkpoint.meta.get('model')!r}, not {model!r}"
        )
    return model_from_checkpoint(checkpoint, device)


def save_pretrained(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    dataset: str,
    card: dict[str, Any],
    half: bool = False,
    classes: list[str] | None = None,
    reconstruction_limits: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a pretrained weight: a checkpoint without optimizer state, its sidecar carrying the
    model ``card`` (data, command, seed, test_accuracy, date...), the ``classes`` and the
    ``reconstruction_limits`` (:func:`~capsnets.inference.calibrate_reconstruction`) where given, float16
    tensors when ``half``; then add the file's SHA-256 to the sidecar's ``.json`` export (the model card)."""
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
    if reconstruction_limits is not None:
        meta["reconstruction_limits"] = dict(reconstruction_limits)
    path = save_model(path, saved, meta=meta)
    stamp_sha256(path)
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


def _shown(pretrained) -> str:
    return repr(pretrained.name) if isinstance(pretrained, Weights) else shown(pretrained)
