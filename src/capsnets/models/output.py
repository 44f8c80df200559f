"""What every registered model returns.

Models return a :class:`ModelOutput` so that the trainer, the evaluator and the plots can work with any
model family without knowing about capsules: ``scores`` is the only field every model fills.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.functional import capsule_length


@dataclass
class ModelOutput:
    """The result of a model's forward pass.

    Attributes:
        scores: ``(B, num_classes)`` class scores; ``argmax`` over the last dim is the prediction.
            Capsule lengths in ``[0, 1)`` for vector capsules, activations for matrix capsules,
            logits for CNN baselines (``score_kind`` says which).
        score_kind: ``"length"``, ``"activation"`` or ``"logits"``.
        capsules: ``(B, num_classes, D)`` class capsule vectors (or flattened poses), if any.
        reconstruction: ``(B, C, H, W)`` decoder output in ``[0, 1]``, if the model has a decoder.
    """

    scores: Tensor
    score_kind: str = "logits"
    capsules: Tensor | None = None
    reconstruction: Tensor | None = None


def independent_probabilities(output: ModelOutput) -> Tensor:
    """Each class's probability of being present, independently of the others (multi-label classification):
    class capsule lengths and matrix capsule activations as they are (clamped to ``[0, 1]``), the sigmoid of logits.

    Shape:
        ``output.scores`` ``(B, K)`` -> ``(B, K)`` float32.

    Examples::

        >>> independent_probabilities(ModelOutput(torch.tensor([[0.0, 2.0]]), "logits"))
        tensor([[0.5000, 0.8808]])
    """
    scores = output.scores.float()
    return torch.sigmoid(scores) if output.score_kind == "logits" else scores.clamp(0.0, 1.0)


def vector_capsule_output(
    capsules: Tensor, decoder: Callable[[Tensor, Tensor], Tensor] | None = None, labels: Tensor | None = None
) -> ModelOutput:
    """The output of a vector capsule classifier: the class capsules' lengths as scores and, with a ``decoder``,
    the reconstruction from the capsule of each image's label (in training) or of its longest capsule.

    Shape:
        capsules ``(B, K, D)``, labels ``(B,)`` -> scores ``(B, K)``.
    """
    lengths = capsule_length(capsules)  # (B, K)
    reconstruction = None
    if decoder is not None:
        reconstruction = decoder(capsules, labels if labels is not None else lengths.argmax(dim=1))
    return ModelOutput(lengths, "length", capsules, reconstruction)
