"""Model families, their registry, the output contract, models from files (:mod:`capsnets.models.hub`) and
pretrained weights (:mod:`capsnets.models.pretrained`)."""

from __future__ import annotations

import os

from torch import nn

from capsnets.models import (  # noqa: F401
    baselines,
    capsnet,
    capspix2pix,
    efficient_capsnet,
    heinsen_capsnet,
    hvc_capsnet,
    matrix_capsnet,
    routing_zoo,
    segcaps,
    transforming,
    unet,
)
from capsnets.models.baselines import BaselineCNN, SmallNorbCNN
from capsnets.models.capsnet import CapsNet
from capsnets.models.capspix2pix import CapsPix2pixGenerator, PatchDiscriminator, Pix2pixGenerator, SynthesisOutput
from capsnets.models.heinsen_capsnet import HeinsenCapsNet
from capsnets.models.hub import create_model, load_model, load_pretrained, model_from_checkpoint, save_model
from capsnets.models.hvc_capsnet import HVCCapsNet
from capsnets.models.matrix_capsnet import MatrixCapsNet
from capsnets.models.output import ModelOutput
from capsnets.models.pretrained import ModelWeights, PretrainedError, Weights, get_model_weights, get_weights
from capsnets.models.registry import (
    count_parameters,
    default_routing,
    list_models,
    model_arguments,
    model_schema,
    model_task,
    register_model,
    routing_keys,
    training_recipe,
)
from capsnets.models.segcaps import SegCaps, SegmentationOutput
from capsnets.models.transforming import AutoencoderOutput, TransformingAutoencoder
from capsnets.models.unet import UNet

__all__ = [
    "AutoencoderOutput",
    "BaselineCNN",
    "CapsNet",
    "CapsPix2pixGenerator",
    "HVCCapsNet",
    "HeinsenCapsNet",
    "MatrixCapsNet",
    "ModelOutput",
    "ModelWeights",
    "PatchDiscriminator",
    "PretrainedError",
    "Pix2pixGenerator",
    "SegCaps",
    "SegmentationOutput",
    "SmallNorbCNN",
    "SynthesisOutput",
    "TransformingAutoencoder",
    "UNet",
    "Weights",
    "count_parameters",
    "create_model",
    "default_routing",
    "get_model",
    "get_model_weights",
    "get_weights",
    "list_models",
    "load_model",
    "load_pretrained",
    "model_arguments",
    "model_from_checkpoint",
    "model_schema",
    "model_task",
    "register_model",
    "routing_keys",
    "save_model",
    "training_recipe",
]


def get_model(name: str, weights: Weights | str | os.PathLike | None = None, **kwargs) -> nn.Module:
    """A registered model, with the shipped weight ``weights`` loaded, as torchvision's ``get_model``: the same as
    ``create_model(name, pretrained=weights, **kwargs)`` (:func:`~capsnets.models.hub.create_model`).

    Args:
        name: a name from :func:`list_models`.
        weights: the weight to load: a :class:`Weights` (``get_model_weights(name).DEFAULT``), a weight's tag
            (``"mnist"``) or name (``"capsnet_small-mnist"``, timm's ``"capsnet_small.mnist"``), or anything else
            ``create_model``'s ``pretrained`` takes (a ``.safetensors`` file, a URL with ``sha256=``); None builds
            the model untrained.
        **kwargs: what :func:`~capsnets.models.hub.create_model` takes besides ``pretrained``: the builder's
            arguments, ``sha256``.

    Raises:
        PretrainedError: an unknown tag or name (the message lists those shipped), a weight of another model.
        ArgumentError: an unknown model, a ``weights`` of another type, an argument the model does not take.

    Examples::

        >>> model = get_model("capsnet_small", weights=get_model_weights("capsnet_small").DEFAULT)
        >>> model.checkpoint_meta["dataset"], model.training
        ('mnist', False)
        >>> get_model("capsnet_small", weights="capsnet_small.fashion_mnist").class_names[1]
        'Trouser'
        >>> get_model("capsnet_small", num_classes=5).num_classes
        5
    """
    return create_model(name, pretrained=weights, **kwargs)
