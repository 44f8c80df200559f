"""Model families, their registry, the output contract, models from files (:mod:`capsnets.models.hub`) and
pretrained weights (:mod:`capsnets.models.pretrained`)."""

from capsnets.models import (  # noqa: F401
    baselines,
    capsnet,
    capspix2pix,
    capsule_unet,
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
from capsnets.models.capsule_unet import CapsuleUNet
from capsnets.models.heinsen_capsnet import HeinsenCapsNet
from capsnets.models.hub import create_model, get_model, load_model, load_pretrained, model_from_checkpoint, save_model
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
    "CapsuleUNet",
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
