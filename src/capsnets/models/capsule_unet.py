"""A capsule U-Net: a convolutional-capsule encoder with local routing and a convolutional decoder with skip
connections, in 2D (after 3D-UCaps: Nguyen, Hua, Nguyen et al. 2021, "3D-UCaps: 3D Capsules Unet for Volumetric
Image Segmentation", MICCAI; their code: VinAIResearch/3D-UCaps, ``module/ucaps.py``).

SegCaps (LaLonde & Bagci 2018) routes all the way up and back down; 3D-UCaps keeps the capsules where they
encode parts and wholes, in the encoder, and decodes with convolutions, which learn the translation-equivariant
upsampling a U-Net learns. Architecture, with the encoder's capsule types ``T`` and dimensions ``D`` of the
registered sizes:

| block | layers | grid |
|---|---|---|
| features | conv 5x5, conv 5x5 dilated 2 (batch norm, ReLU), conv 5x5 dilated 2 (batch norm, tanh): ``F`` maps | H |
| primary | one capsule type of ``F`` dims -> ``T0 x D0``, 3x3, routed once (skip 1) | H |
| encoder | pairs of 3x3 capsule layers, the first of each pair of stride 2, routed 3 times: skip 2 at H/2, skip 3 at H/4, then the class capsules (one type per class) at H/8 | H/2 .. H/8 |
| decoder | three times: a 2x2 stride-2 transposed convolution, the skip of that grid concatenated, a 3x3 convolution (batch norm, ReLU); the last a 1x1 convolution to one logit per class | H/4 .. H |

``capsule_unet``: the encoder of 3D-UCaps in 2D (``F`` 64; types 16 (primary), 16, 16, 8, 8, 8 and the classes;
dims 4, 8, 8, 16, 16, 32, 64) and its decoder's channels (256, 128, 128, 64, 64): 1.0M parameters for one class,
1.2M for four, against U-Net's 31.0M. ``capsule_unet_small``: half the features, types and capsule dimensions and
a fifth to a quarter of the decoder's channels (48, 32, 32, 16, 16), for CPUs: 95k parameters for one class,
117k for four, under a quarter of ``unet_small``'s 486k. The class capsules at H/8 have
one type per class, the background included (two for a binary model); their lengths get a margin loss against the
fraction of each class in each 8x8 cell (:class:`~capsnets.losses.CapsuleUNetLoss`), as in 3D-UCaps, beside the
cross-entropy of the decoder's logits.

Deviations from 3D-UCaps: 2D; dynamic routing by agreement (Sabour et al. 2017) with per-example logits
(:class:`~capsnets.layers.ConvCapsules2d`) where 3D-UCaps routes by cosine similarity; no reconstruction branch;
batch norm and ReLU where 3D-UCaps uses MONAI's instance norm and PReLU. ``H`` and ``W`` must be
divisible by 8.

Dimension legend: ``B`` batch, ``T`` capsule types, ``D`` capsule dim, ``H``/``W`` grid, ``K`` classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from capsnets.functional import VECTOR_ROUTING_TYPES, DynamicRouting, as_routing, routing_config
from capsnets.layers import ConvCapsules2d
from capsnets.models.registry import register_model
from capsnets.models.segcaps import SegmentationOutput
from capsnets.validation import (
    ArgumentError,
    Device,
    DType,
    ImageSize,
    PositiveInt,
    Routing,
    image_batch,
    image_size,
    placement,
    positive_int,
)

__all__ = ["CapsuleUNet", "capsule_unet", "capsule_unet_small"]


class CapsuleUNet(nn.Module):
    """A 2D capsule U-Net (see the module docstring).

    Args:
        input_size: nominal ``(C, H, W)``; ``H`` and ``W`` divisible by 8.
        features: channels of the last feature convolution (the primary capsules' input dimension); the first two
            have a quarter and a half of it.
        types: the capsule types of the primary layer and of the encoder's first four layers (then one more
            layer of ``types[-1]`` types before the class capsules): 5 numbers.
        dims: the capsule dimensions of the primary layer, the encoder's five layers and the class capsules: 7
            numbers.
        decoder: the decoder's channels: after each of the three transposed convolutions and its 3x3
            convolution, ``(up3, conv3, up2, conv2, up1)``.
        num_classes: 1 for binary segmentation (a sigmoid of one logit; two class capsule types, background and
            object), else the classes K, the background included (a softmax over K logits).
        routing: the routing of every capsule layer but the primary one (which routes once): an object, its spec
            or its type name (default ``"dynamic"``: :class:`~capsnets.functional.DynamicRouting`).

    Shape:
        - images: ``(B, C, H, W)``
        - output: :class:`~capsnets.models.segcaps.SegmentationOutput` with ``probabilities`` and ``logits``
          ``(B, K, H, W)`` and ``capsules``, the class capsules, ``(B, max(K, 2), D, H/8, W/8)``.

    Examples::

        >>> model = CapsuleUNet(input_size=(1, 16, 16), features=8, types=(2, 2, 2, 2, 2), dims=(2, 2, 2, 2, 2, 2, 4),
        ...                     decoder=(8, 8, 8, 8, 8), num_classes=3, routing=DynamicRouting(2))
        >>> out = model(torch.rand(2, 1, 16, 16))
        >>> out.probabilities.shape, out.capsules.shape
        (torch.Size([2, 3, 16, 16]), torch.Size([2, 3, 4, 2, 2]))
    """

    default_loss = "capsule_unet"
    task = "segmentation"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 64, 64),
        features: int = 64,
        types: Sequence[int] = (16, 16, 16, 8, 8),
        dims: Sequence[int] = (4, 8, 8, 16, 16, 32, 64),
        decoder: Sequence[int] = (256, 128, 128, 64, 64),
        num_classes: int = 1,
        routing="dynamic",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        if self.input_size[1] % 8 or self.input_size[2] % 8:
            raise ArgumentError(
                f"CapsuleUNet needs H and W divisible by 8 (three stride-2 stages), got input_size {self.input_size}",
                "input_size",
            )
        self.num_classes = positive_int("num_classes", num_classes)
        f = positive_int("features", features)
        t, d, c = _counts("types", types, 5), _counts("dims", dims, 7), _counts("decoder", decoder, 5)
        routed = as_routing(routing, None, types=VECTOR_ROUTING_TYPES)
        self.routing_spec = routing_config(routed, strict=False)
        device, dtype = placement(device, dtype)
        factory = {"device": device, "dtype": dtype}
        classes = max(self.num_classes, 2)  # a binary model's capsules: background and object

        def caps(i, di, j, dj, stride=1, routing=routed):
            return ConvCapsules2d(i, di, j, dj, kernel_size=3, stride=stride, routing=routing, **factory)

        def conv(i, o, kernel=3, dilation=1, activation=nn.ReLU):
            return [
                nn.Conv2d(i, o, kernel, padding=dilation * (kernel // 2), dilation=dilation, bias=False, **factory),
                nn.BatchNorm2d(o, **factory),
                activation(),
            ]

        quarter, half = max(1, f // 4), max(1, f // 2)
        self.features = nn.Sequential(  # normalised, as 3D-UCaps' MONAI convolutions are: capsules of unit scale
            *conv(self.input_size[0], quarter, 5),
            *conv(quarter, half, 5, dilation=2),
            *conv(half, f, 5, dilation=2, activation=nn.Tanh),
        )
        self.primary = caps(1, f, t[0], d[0], routing=DynamicRouting(1))  # skip 1, H
        self.encoder = nn.ModuleList(
            [
                caps(t[0], d[0], t[1], d[1], stride=2),
                caps(t[1], d[1], t[2], d[2]),  # skip 2, H/2
                caps(t[2], d[2], t[3], d[3], stride=2),
                caps(t[3], d[3], t[4], d[4]),  # skip 3, H/4
                caps(t[4], d[4], t[4], d[5], stride=2),
                caps(t[4], d[5], classes, d[6]),  # the class capsules, H/8
            ]
        )

        def up(i, o):
            return nn.ConvTranspose2d(i, o, 2, stride=2, **factory)

        self.up3, self.merge3 = up(classes * d[6], c[0]), nn.Sequential(*conv(c[0] + t[4] * d[4], c[1]))  # H/4
        self.up2, self.merge2 = up(c[1], c[2]), nn.Sequential(*conv(c[2] + t[2] * d[2], c[3]))  # H/2
        self.up1 = up(c[3], c[4])  # H
        self.head = nn.Conv2d(c[4] + t[0] * d[0], self.num_classes, 1, **factory)

    def forward(self, images: Tensor, masks: Tensor | None = None) -> SegmentationOutput:
        """Per-pixel probabilities and logits of ``images`` and the class capsules (a non-empty batch; uint8
        images are scaled to ``[0, 1]``, floating-point ones cast to the parameters' dtype:
        :func:`~capsnets.validation.image_batch`). ``masks`` is not used (the decoder is convolutional)."""
        images = image_batch(
            images,
            (self.input_size[0], None, None),
            dtype=self.head.weight.dtype,
            owner="CapsuleUNet",
            name="images",
            multiple=8,
        )
        skip1 = self.primary(self.features(images).unsqueeze(1))  # (B, T0, D0, H, W)
        skip2 = self.encoder[1](self.encoder[0](skip1))  # (B, T2, D2, H/2, W/2)
        skip3 = self.encoder[3](self.encoder[2](skip2))  # (B, T3, D3, H/4, W/4)
        capsules = self.encoder[5](self.encoder[4](skip3))  # (B, K', D6, H/8, W/8)
        x = self.merge3(torch.cat([self.up3(capsules.flatten(1, 2)), skip3.flatten(1, 2)], dim=1))
        x = self.merge2(torch.cat([self.up2(x), skip2.flatten(1, 2)], dim=1))
        logits = self.head(torch.cat([self.up1(x), skip1.flatten(1, 2)], dim=1))  # (B, K, H, W)
        probabilities = torch.sigmoid(logits) if self.num_classes == 1 else torch.softmax(logits, dim=1)
        return SegmentationOutput(probabilities, capsules=capsules, logits=logits)


def _counts(name: str, values: Sequence[int], length: int) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != length:
        raise ArgumentError(f"{name} must be {length} positive integers, got {values!r}", name)
    return tuple(positive_int(name, v) for v in values)


@register_model("capsule_unet", task="segmentation")
def capsule_unet(
    *,
    input_size: ImageSize = (1, 64, 64),
    routing: Routing = "dynamic",
    num_classes: PositiveInt = 1,
    device: Device | None = None,
    dtype: DType | None = None,
) -> CapsuleUNet:
    """3D-UCaps' encoder and decoder in 2D (1.0M parameters for one class; ``num_classes``: see
    :class:`CapsuleUNet`)."""
    return CapsuleUNet(
        input_size=input_size,
        features=64,
        types=(16, 16, 16, 8, 8),
        dims=(4, 8, 8, 16, 16, 32, 64),
        decoder=(256, 128, 128, 64, 64),
        num_classes=num_classes,
        routing=routing,
        device=device,
        dtype=dtype,
    )


@register_model("capsule_unet_small", task="segmentation")
def capsule_unet_small(
    *,
    input_size: ImageSize = (1, 32, 32),
    routing: Routing = "dynamic",
    num_classes: PositiveInt = 1,
    device: Device | None = None,
    dtype: DType | None = None,
) -> CapsuleUNet:
    """:func:`capsule_unet` with half the features, types and capsule dimensions and a smaller decoder, for CPUs
    (95k parameters for one class; ``num_classes``: see :class:`CapsuleUNet`)."""
    return CapsuleUNet(
        input_size=input_size,
        features=32,
        types=(8, 8, 8, 4, 4),
        dims=(4, 4, 4, 8, 8, 16, 32),
        decoder=(48, 32, 32, 16, 16),
        num_classes=num_classes,
        routing=routing,
        device=device,
        dtype=dtype,
    )
