"""capsnets: capsule networks in PyTorch.

Vector capsules with dynamic routing, matrix capsules with EM routing and convolutional capsules, with
a registry of models, a trainer and a command-line tool (``capsnets --help``).
"""

from capsnets._version import __version__
from capsnets.inference import Prediction, predict
from capsnets.models import ModelOutput, count_parameters, create_model, list_models, load_model, save_model

__all__ = [
    "ModelOutput",
    "Prediction",
    "__version__",
    "count_parameters",
    "create_model",
    "list_models",
    "load_model",
    "predict",
    "save_model",
]
