"""Transforming auto-encoders (Hinton, Krizhevsky & Wang 2011, "Transforming Auto-encoders").

Each of ``N`` capsules has its own recognition units (one hidden sigmoid layer over the whole image) that
output a presence probability ``p`` and an explicit pose, here a 2-D position ``(x, y)``. The known
transformation, a shift ``(dx, dy)``, is added to every capsule's pose; each capsule's generative units
(one hidden sigmoid layer) turn the shifted pose into an image, scaled by ``p``; the capsules'
contributions are summed. Trained without labels to reconstruct the shifted image, the poses have to
become coordinates that move with the image. Paper (Sec. 3, MNIST): 30 capsules of 10 recognition and
20 generative units each, shifts of up to +-2 pixels in x and y.

Deviations: the summed contributions pass through a sigmoid so the output lies in ``[0, 1]`` like the
targets (the paper uses a linear sum with squared error); the shift is in pixels (``dx`` along columns,
``dy`` along rows) and enters the pose as ``(dx, dy)``. Training pairs (images, shifts and the shifted
images) come from the data side (:func:`capsnets.data.shift_pairs`).
Registered: ``transforming_autoencoder`` (the paper's sizes, 28x28), task ``"autoencoder"``.

Dimension legend: ``B`` batch, ``N`` capsules, ``R``/``G`` recognition/generative units per capsule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from capsnets.models.registry import register_model
from capsnets.validation import (
    ArgumentError,
    Device,
    DType,
    ImageSize,
    PositiveInt,
    image_batch,
    image_size,
    placement,
    positive_int,
)


@dataclass
class AutoencoderOutput:
    """What a transforming auto-encoder returns.

    Attributes:
        reconstruction: ``(B, C, H, W)`` the predicted transformed image in ``[0, 1]``.
        probabilities: ``(B, N)`` each capsule's presence probability.
        poses: ``(B, N, 2)`` each capsule's pose ``(x, y)`` *before* the transformation was applied.
    """

    reconstruction: Tensor
    probabilities: Tensor
    poses: Tensor


class TransformingAutoencoder(nn.Module):
    """Capsules with explicit 2-D poses, trained to predict the shifted image (see the module docstring).

    Args:
        input_size: ``(C, H, W)``.
        capsules: number of capsules ``N``.
        recognition_units, generative_units: hidden units per capsule (``R``, ``G``).

    Shape:
        - images: ``(B, C, H, W)``; shifts: ``(B, 2)`` pixels ``(dx, dy)``
        - output: :class:`AutoencoderOutput`

    Examples::

        >>> model = TransformingAutoencoder(input_size=(1, 28, 28))
        >>> model(torch.rand(4, 1, 28, 28), torch.tensor([[1, 0], [0, 2], [-1, -1], [2, -2]])).reconstruction.shape
        torch.Size([4, 1, 28, 28])
    """

    default_loss = "transforming"
    task = "autoencoder"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 28, 28),
        capsules: int = 30,
        recognition_units: int = 10,
        generative_units: int = 20,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        device, dtype = placement(device, dtype)
        n, r, g = (
            positive_int(k, v)
            for k, v in (
                ("capsules", capsules),
                ("recognition_units", recognition_units),
                ("generative_units", generative_units),
            )
        )
        pixels = math.prod(self.input_size)
        factory = {"device": device, "dtype": dtype}
        self.num_capsules = n
        # every capsule's layers stacked: one matmul for all capsules
        self.recognition = nn.Linear(pixels, n * r, **factory)  # image -> (N*R)
        self.recognition_out = nn.Parameter(torch.randn(n, r, 3, **factory) / math.sqrt(r))  # (N, R, p|x|y)
        self.recognition_bias = nn.Parameter(torch.zeros(n, 3, **factory))
        self.generation_in = nn.Parameter(torch.randn(n, 2, g, **factory) / math.sqrt(2))  # (N, 2, G)
        self.generation_bias = nn.Parameter(torch.zeros(n, g, **factory))
        self.generation_out = nn.Parameter(torch.randn(n, g, pixels, **factory) / math.sqrt(g * n))  # (N, G, pixels)
        self.output_bias = nn.Parameter(torch.zeros(pixels, **factory))

    def encode(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Presence probabilities ``(B, N)`` and poses ``(B, N, 2)``."""
        images = image_batch(images, self.input_size, dtype=self.output_bias.dtype, owner="TransformingAutoencoder")
        hidden = torch.sigmoid(self.recognition(images.flatten(1)))  # (B, N*R)
        hidden = hidden.view(len(images), self.num_capsules, -1)  # (B, N, R)
        out = torch.einsum("bnr,nrk->bnk", hidden, self.recognition_out) + self.recognition_bias  # (B, N, 3)
        return torch.sigmoid(out[..., 0]), out[..., 1:]

    def decode(self, probabilities: Tensor, poses: Tensor) -> Tensor:
        """The image that capsules with these probabilities ``(B, N)`` and poses ``(B, N, 2)`` generate."""
        hidden = torch.sigmoid(torch.einsum("bnk,nkg->bng", poses, self.generation_in) + self.generation_bias)
        contributions = torch.einsum("bng,ngp->bnp", hidden, self.generation_out)  # (B, N, pixels)
        logits = (probabilities.unsqueeze(-1) * contributions).sum(dim=1) + self.output_bias
        return torch.sigmoid(logits).view(-1, *self.input_size)

    def forward(self, images: Tensor, shifts: Tensor) -> AutoencoderOutput:
        """The images shifted by ``shifts``, as the capsules predict them (``images``: a non-empty batch; uint8
        images are scaled to ``[0, 1]``, floating-point ones cast to the parameters' dtype:
        :func:`~capsnets.validation.image_batch`)."""
        if shifts.shape != (len(images), 2):
            raise ArgumentError(
                f"shifts must be (B, 2) = ({len(images)}, 2) pixel offsets (dx, dy), got {tuple(shifts.shape)}"
            )
        probabilities, poses = self.encode(images)
        moved = poses + shifts.to(poses.dtype).unsqueeze(1)  # the known transformation, applied to every pose
        return AutoencoderOutput(self.decode(probabilities, moved), probabilities, poses)


@register_model("transforming_autoencoder", task="autoencoder")
def transforming_autoencoder(
    *,
    input_size: ImageSize = (1, 28, 28),
    capsules: PositiveInt = 30,
    recognition_units: PositiveInt = 10,
    generative_units: PositiveInt = 20,
    device: Device | None = None,
    dtype: DType | None = None,
) -> TransformingAutoencoder:
    """The paper's MNIST transforming auto-encoder: 30 capsules, 10 recognition and 20 generative units each."""
    return TransformingAutoencoder(
        input_size=input_size,
        capsules=capsules,
        recognition_units=recognition_units,
        generative_units=generative_units,
        device=device,
        dtype=dtype,
    )
