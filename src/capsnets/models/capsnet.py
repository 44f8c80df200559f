"""CapsNet with dynamic routing (Sabour, Frosst & Hinton 2017, "Dynamic Routing Between Capsules").

Architecture (Sec. 4, Fig. 1-2): ReLU Conv1 -> PrimaryCapsules -> DigitCaps (routing) -> masked decoder.
Registered variants:

- ``capsnet``: the paper's MNIST model, 28x28 input, 8,215,568 parameters with the decoder.
- ``capsnet_small``: the same design, narrower (for CPU tests and quick experiments).
- ``capsnet_digits``: for scikit-learn's 8x8 digits (3x3 kernels).

The builders take ``routing`` (a routing object or its spec) or, for the default
:class:`~capsnets.functional.DynamicRouting`, ``routing_iterations`` and ``detach_routing`` (None: the
routing's defaults). As in the paper, the parent pre-activations have no bias. Deviation: the routing's
gradient path follows the authors' released code by default (``detach_routing``: predictions detached in
non-final iterations).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from capsnets.functional import DynamicRouting, as_routing, capsule_length
from capsnets.layers import CapsuleDecoder, LinearCapsules, PrimaryCapsules
from capsnets.layers.validation import conv_output_size, image_batch, positive_int
from capsnets.models.arguments import Device, DType, ImageSize, PositiveInt, VectorRouting
from capsnets.models.output import ModelOutput
from capsnets.models.registry import register_model


class CapsNet(nn.Module):
    """Conv -> primary capsules -> class capsules with routing -> optional reconstruction decoder.

    Args:
        input_size: ``(C, H, W)`` of the input images.
        num_classes: number of class capsules.
        conv_channels: channels of the first (ReLU) convolution.
        conv_kernel: its kernel size.
        primary_types: capsule types in the primary layer.
        primary_dim: primary capsule dimension.
        primary_kernel, primary_stride: the primary convolution's kernel and stride.
        class_dim: class capsule dimension.
        routing: routing callable for the class capsules, or its spec (a dict); None: ``DynamicRouting()``.
        decoder_hidden: hidden sizes of the decoder; ``None`` builds no decoder.

    Shape:
        - images: ``(B, C, H, W)``; labels (optional, selects the decoded capsule): ``(B,)``
        - output: :class:`ModelOutput` with ``scores`` ``(B, num_classes)`` (capsule lengths),
          ``capsules`` ``(B, num_classes, class_dim)``, ``reconstruction`` ``(B, C, H, W)``.

    Examples::

        >>> model = CapsNet(input_size=(1, 28, 28), routing=DynamicRouting(2))
        >>> model(torch.rand(4, 1, 28, 28)).scores.shape
        torch.Size([4, 10])
    """

    default_loss = "margin"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 28, 28),
        num_classes: int = 10,
        conv_channels: int = 256,
        conv_kernel: int = 9,
        primary_types: int = 32,
        primary_dim: int = 8,
        primary_kernel: int = 9,
        primary_stride: int = 2,
        class_dim: int = 16,
        routing: Callable[..., Tensor] | dict | None = None,
        decoder_hidden: Sequence[int] | None = (512, 1024),
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if len(tuple(input_size)) != 3:
            raise ValueError(f"input_size must be (C, H, W), got {input_size!r}")
        self.input_size = tuple(int(s) for s in input_size)
        self.num_classes = positive_int("num_classes", num_classes)
        channels, height, width = self.input_size
        factory = {"device": device, "dtype": dtype}
        self.conv = nn.Conv2d(channels, conv_channels, conv_kernel, **factory)
        conv_h, conv_w = (conv_output_size(s, conv_kernel, 1, 0) for s in (height, width))
        if min(conv_h, conv_w) < 1:
            raise ValueError(f"input_size {self.input_size} is smaller than conv_kernel={conv_kernel}")
        self.primary = PrimaryCapsules(
            conv_channels, primary_types, primary_dim, kernel_size=primary_kernel, stride=primary_stride, **factory
        )
        self.classes = LinearCapsules(
            self.primary.num_capsules(conv_h, conv_w), primary_dim, num_classes, class_dim,
            routing=routing, **factory,
        )
        self.decoder = None
        if decoder_hidden is not None:
            self.decoder = CapsuleDecoder(num_classes, class_dim, self.input_size, hidden=decoder_hidden, **factory)

    def encode(self, images: Tensor) -> Tensor:
        """Class capsules ``(B, num_classes, class_dim)``."""
        images = image_batch(images, self.input_size, dtype=self.conv.weight.dtype, owner=type(self).__name__)
        features = torch.relu(self.conv(images))  # (B, conv_channels, H1, W1)
        return self.classes(self.primary(features))  # (B, N, D_p) -> (B, K, D_c)

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        """Class capsules, scores and reconstruction of ``images`` (a non-empty batch; uint8 images are scaled to
        ``[0, 1]``, floating-point ones cast to the parameters' dtype:
        :func:`~capsnets.layers.validation.image_batch`)."""
        capsules = self.encode(images)
        lengths = capsule_length(capsules)  # (B, K)
        reconstruction = None
        if self.decoder is not None:
            select = labels if labels is not None else lengths.argmax(dim=1)
            reconstruction = self.decoder(capsules, select)
        return ModelOutput(lengths, "length", capsules, reconstruction)


def _routing(routing, routing_iterations: int | None, detach_routing: bool | None):
    """The builders' routing: ``routing`` if given, else dynamic routing with the settings that are not None."""
    return as_routing(routing, DynamicRouting, iterations=routing_iterations, detach_routing=detach_routing)


@register_model("capsnet")
def capsnet(*, num_classes: PositiveInt = 10, input_size: ImageSize = (1, 28, 28),
            routing_iterations: PositiveInt | None = None, detach_routing: bool | None = None,
            routing: VectorRouting | None = None, reconstruction: bool = True, device: Device | None = None,
            dtype: DType | None = None) -> CapsNet:
    """The paper's MNIST CapsNet (Sec. 4): 256 9x9 conv, 32x8-D primary capsules, 16-D class capsules."""
    return CapsNet(
        input_size=input_size, num_classes=num_classes,
        routing=_routing(routing, routing_iterations, detach_routing),
        decoder_hidden=(512, 1024) if reconstruction else None, device=device, dtype=dtype,
    )


@register_model("capsnet_small")
def capsnet_small(*, num_classes: PositiveInt = 10, input_size: ImageSize = (1, 28, 28),
                  routing_iterations: PositiveInt | None = None, detach_routing: bool | None = None,
                  routing: VectorRouting | None = None, reconstruction: bool = True, device: Device | None = None,
                  dtype: DType | None = None) -> CapsNet:
    """CapsNet narrowed for CPUs: 32-channel conv, 8 types of 8-D primary capsules (288 capsules)."""
    return CapsNet(
        input_size=input_size, num_classes=num_classes, conv_channels=32, primary_types=8,
        routing=_routing(routing, routing_iterations, detach_routing),
        decoder_hidden=(256, 512) if reconstruction else None, device=device, dtype=dtype,
    )


@register_model("capsnet_digits")
def capsnet_digits(*, num_classes: PositiveInt = 10, input_size: ImageSize = (1, 8, 8),
                   routing_iterations: PositiveInt | None = None, detach_routing: bool | None = None,
                   routing: VectorRouting | None = None, reconstruction: bool = True, device: Device | None = None,
                   dtype: DType | None = None) -> CapsNet:
    """CapsNet for 8x8 digits: 3x3 kernels, primary stride 1 (4x4 grid of 16 types of 8-D capsules)."""
    return CapsNet(
        input_size=input_size, num_classes=num_classes, conv_channels=64, conv_kernel=3,
        primary_types=16, primary_kernel=3, primary_stride=1,
        routing=_routing(routing, routing_iterations, detach_routing),
        decoder_hidden=(128, 256) if reconstruction else None, device=device, dtype=dtype,
    )
