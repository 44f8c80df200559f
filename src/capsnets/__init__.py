"""capsnets: capsule networks in PyTorch.

Vector capsules with dynamic routing, matrix capsules with EM routing and convolutional capsules, with
a registry of models, a trainer and a command-line tool (``capsnets --help``).
"""

from capsnets._version import __version__
from capsnets.models import (
    ModelOutput,
    Weights,
    count_parameters,
    create_model,
    get_model_weights,
    get_weights,
    list_models,
    load_model,
    save_model,
)

__all__ = [
    "ModelOutput",
    "Weights",
    "__version__",
    "count_parameters",
    "create_model",
    "get_model_weights",
    "get_weights",
    "list_models",
    "load_model",
    "save_model",
]
