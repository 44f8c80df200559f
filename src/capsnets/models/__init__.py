"""Model families, their registry and the output contract."""
from capsnets.models import baselines, capsnet, matrix_capsnet  # noqa: F401  (registers the models)
from capsnets.models.baselines import BaselineCNN, SmallNorbCNN
from capsnets.models.capsnet import CapsNet
from capsnets.models.matrix_capsnet import MatrixCapsNet
from capsnets.models.output import ModelOutput
from capsnets.models.registry import count_parameters, create_model, list_models, model_arguments, register_model

__all__ = [
    "BaselineCNN", "CapsNet", "MatrixCapsNet", "SmallNorbCNN", "ModelOutput", "count_parameters", "create_model", "list_models",
    "model_arguments", "register_model",
]
