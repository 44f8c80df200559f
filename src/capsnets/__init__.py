"""capsnets: capsule networks in PyTorch.

Vector capsules with dynamic routing, matrix capsules with EM routing and convolutional capsules, with
a registry of models, pretrained weights, a trainer and a command-line tool (``capsnets --help``).

Examples::

    >>> import capsnets
    >>> capsnets.list_models("capsnet_s*")
    ['capsnet_small', 'capsnet_svhn']
    >>> model = capsnets.create_model("capsnet_small", pretrained=True)
    >>> model.class_names == capsnets.get_weights("capsnet_small-mnist").meta["categories"]
    True
    >>> [(p.label, p.uncertain) for p in capsnets.predict(model, ["seven.png", "noise.png"])]  # doctest: +SKIP
    [('7', False), ('8', True)]
"""

from capsnets._version import __version__
from capsnets.inference import Prediction, predict
from capsnets.models import (
    ModelOutput,
    Weights,
    count_parameters,
    create_model,
    get_model,
    get_model_weights,
    get_weights,
    list_models,
    load_model,
    save_model,
)

__all__ = [
    "ModelOutput",
    "Prediction",
    "Weights",
    "__version__",
    "count_parameters",
    "create_model",
    "get_model",
    "get_model_weights",
    "get_weights",
    "list_models",
    "load_model",
    "predict",
    "save_model",
]
