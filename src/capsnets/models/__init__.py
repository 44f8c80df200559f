"""Model families, their registry and the output contract."""
from capsnets.models import baselines, capsnet, matrix_capsnet, segcaps, transforming, unet  # noqa: F401
from capsnets.models.baselines import BaselineCNN, SmallNorbCNN
from capsnets.models.capsnet import CapsNet
from capsnets.models.matrix_capsnet import MatrixCapsNet
from capsnets.models.output import ModelOutput
from capsnets.models.registry import (count_parameters, create_model, list_models, model_arguments, model_task,
                                     register_model)
from capsnets.models.segcaps import SegCaps, SegmentationOutput
from capsnets.models.transforming import AutoencoderOutput, TransformingAutoencoder
from capsnets.models.unet import UNet

__all__ = [
    "AutoencoderOutput", "TransformingAutoencoder", "BaselineCNN", "CapsNet", "MatrixCapsNet", "SegCaps", "SegmentationOutput", "SmallNorbCNN", "ModelOutput", "UNet",
    "count_parameters", "create_model", "list_models", "model_arguments", "model_task", "register_model",
]
