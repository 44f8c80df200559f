"""SegCaps: convolutional capsules for object segmentation (LaLonde & Bagci 2018, "Capsules for Object
Segmentation", arXiv 1804.04241).

Architecture (SegCaps R3, Fig. 2 of the paper): a 5x5 ReLU convolution whose 16 maps are one 16-D capsule
type; an encoder of 5x5 convolutional capsule layers (stride 2 halves the grid; the first capsule layer
routes once, every other layer three times); a decoder of 4x4 stride-2 transposed capsule layers, each
followed by concatenating the encoder's capsule types of the same grid (skip connections) and a 5x5
capsule layer; a final 1x1 capsule layer with one 16-D capsule type. The length of that capsule at each
pixel is the probability that the pixel belongs to the object. The reconstruction regulariser masks the
final capsules with the ground-truth mask (the predicted one at test time) and decodes them with three
1x1 convolutions (64, 128 ReLU, then sigmoid) into the input image inside the object.

Several classes (``num_classes`` K > 1, the background included): the final layer has one capsule type per
class, and the length of class k's capsule at a pixel is its score for k (the largest wins). The reconstruction
keeps, at each pixel, the capsule of its true class (the predicted one at test time), none at background
pixels (class 0). Deviation: the paper is binary (one capsule type); K types are our extension.

| block | layer (types x dim, kernel / stride, routing iterations) | grid |
|---|---|---|
| conv1 | conv 5x5, 16 ReLU maps = 1 x 16 | H |
| primary | capsules 2 x 16, 5/2, r1 | H/2 (skip 1: next layer) |
| encoder | 4 x 16, 5/1 -> 4 x 32, 5/2 -> 8 x 32, 5/1 (skip 2) -> 8 x 64, 5/2 -> 8 x 32, 5/1 | H/2 .. H/8 |
| decoder | up 8 x 32 + skip 2 -> 4 x 32; up 4 x 16 + skip 1 -> 4 x 16; up 2 x 16 + conv1 | H/4, H/2, H |
| segmentation | capsules K x 16, 1x1, r3 (K = 1: binary); length per pixel | H |

1,416,112 parameters without the reconstruction decoder, 1,425,649 with it (paper: 1.4M).
Deviation: the convolution's bias is part of every prediction (see :mod:`capsnets.layers.conv`).

Initialisation: the squash maps a vector of length ``s`` to one of length ``s^2 / (1 + s^2)``, about ``s^2`` for short
vectors, so a stack of capsule layers whose predictions are shorter than their children shrinks the lengths layer by
layer towards 0, where no gradient reaches the encoder. Each capsule layer's weights are therefore drawn from a normal
distribution of standard deviation ``2 J / sqrt(n I D_out)`` (``I``/``J`` child/parent types, ``D_out`` the parents'
dimension, ``n`` the kernel taps that fall on the nominal grid per output position, padding left out), with zero
biases: children of length 0.5 then give each parent, with the uniform couplings ``1 / J`` of the first routing
iteration, a vector of expected length 1 before the squash (0.5 after it), so lengths stay near 0.5 through the
layers and the final capsules' lengths start on both sides of the 0.5 threshold. Deviation: LaLonde & Bagci's code
(lalonderodney/SegCaps, ``capsule_layers.py``) draws He-normal weights (standard deviation ``sqrt(2 / fan_in)``) and
a bias of 0.1.
Registered: ``segcaps`` (the paper's R3, 1 x 512 x 512 nominal input: LUNA16 slices) and
``segcaps_small`` (half the capsule dimensions; for CPUs). Both are fully convolutional: any ``H, W``
divisible by 8 works. Their routing (every capsule layer but the first) is ``routing``: a routing object, its
spec or a type name (default ``"dynamic"``: :class:`~capsnets.functional.DynamicRouting` with its defaults).

Dimension legend: ``B`` batch, ``T`` capsule types, ``D`` capsule dim, ``H``/``W`` grid, ``K`` classes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor, nn

from capsnets.functional import VECTOR_ROUTING_TYPES, DynamicRouting, as_routing, capsule_length, routing_config
from capsnets.layers import ConvCapsules2d, ConvTransposeCapsules2d
from capsnets.models.registry import register_model
from capsnets.validation import (
    ArgumentError,
    Device,
    DType,
    ImageSize,
    PositiveInt,
    Routing,
    flag,
    image_batch,
    image_size,
    placement,
    positive_int,
)


@dataclass
class SegmentationOutput:
    """What a segmentation model returns.

    Attributes:
        probabilities: ``(B, K, H, W)`` per-pixel scores in ``[0, 1]``: with ``K = 1`` (binary) the probability of
            the object; with ``K > 1`` one map per class, the background (class 0) included: capsule lengths
            (SegCaps) or the softmax over classes (U-Net).
        capsules: ``(B, K, D, H, W)`` the segmentation capsules at every pixel (None for CNN baselines).
        reconstruction: ``(B, C, H, W)`` decoder output in ``[0, 1]`` (the image inside the mask), if any.
        logits: ``(B, K, H, W)`` pre-sigmoid (K = 1) or pre-softmax (K > 1) scores of CNNs (U-Net); the losses then
            take the cross-entropy from them, which keeps its gradient at any score.
    """

    probabilities: Tensor
    capsules: Tensor | None = None
    reconstruction: Tensor | None = None
    logits: Tensor | None = None

    def predicted_classes(self, threshold: float = 0.5) -> Tensor:
        """The class of each pixel, ``(B, K, H, W) -> (B, 1, H, W)`` int64: 1 where the probability is above
        ``threshold`` for one map (binary), else the class of the largest score."""
        if self.probabilities.shape[1] == 1:
            return (self.probabilities > threshold).long()
        return self.probabilities.argmax(dim=1, keepdim=True)


class SegCaps(nn.Module):
    """SegCaps R3 (see the module docstring), with the capsule dimensions scaled by ``width``.

    Args:
        input_size: nominal ``(C, H, W)``; ``H`` and ``W`` must be divisible by 8 (three stride-2 stages).
        width: capsule dimension of the first capsule types (16 in the paper); deeper layers use 2x / 4x.
        routing: the routing of every capsule layer but the first (which routes once): an object, its spec (a
            dict) or its type name (default ``"dynamic"``: :class:`~capsnets.functional.DynamicRouting`).
        decoder_hidden: channels of the reconstruction decoder's 1x1 convolutions; ``None``: no decoder.
        num_classes: capsule types of the final layer: 1 (binary: the object's probability) or the number of
            classes K, the background included.

    Shape:
        - images: ``(B, C, H, W)``; masks (optional, select what the decoder reconstructs): ``(B, 1, H, W)``
          class indices (0/1 for one class)
        - output: :class:`SegmentationOutput` with ``probabilities`` ``(B, K, H, W)``.

    Examples::

        >>> model = SegCaps(input_size=(1, 32, 32), width=4, routing=DynamicRouting(2))
        >>> model(torch.rand(2, 1, 32, 32)).probabilities.shape
        torch.Size([2, 1, 32, 32])
    """

    default_loss = "segcaps"
    task = "segmentation"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 512, 512),
        width: int = 16,
        routing="dynamic",
        decoder_hidden: Sequence[int] | None = (64, 128),
        num_classes: int = 1,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        self.num_classes = positive_int("num_classes", num_classes)
        if self.input_size[1] % 8 or self.input_size[2] % 8:
            raise ArgumentError(
                f"SegCaps needs H and W divisible by 8 (three stride-2 stages), got input_size {self.input_size}",
                "input_size",
            )
        d = positive_int("width", width)
        channels = self.input_size[0]
        routed = as_routing(routing, None, types=VECTOR_ROUTING_TYPES)
        self.routing_spec = routing_config(routed, strict=False)
        device, dtype = placement(device, dtype)
        factory = {"device": device, "dtype": dtype}
        once = DynamicRouting(1)  # the primary layer routes once

        def caps(i, di, j, dj, stride=1, kernel=5, routing=routed):
            return ConvCapsules2d(i, di, j, dj, kernel_size=kernel, stride=stride, routing=routing, **factory)

        def up(i, di, j, dj):
            return ConvTransposeCapsules2d(i, di, j, dj, routing=routed, **factory)

        self.conv1 = nn.Conv2d(channels, d, 5, padding=2, **factory)
        self.primary = caps(1, d, 2, d, stride=2, routing=once)
        self.enc1 = caps(2, d, 4, d)  # skip 1, H/2
        self.enc2 = nn.ModuleList([caps(4, d, 4, 2 * d, stride=2), caps(4, 2 * d, 8, 2 * d)])  # skip 2, H/4
        self.enc3 = nn.ModuleList([caps(8, 2 * d, 8, 4 * d, stride=2), caps(8, 4 * d, 8, 2 * d)])  # H/8
        self.up1, self.dec1 = up(8, 2 * d, 8, 2 * d), caps(16, 2 * d, 4, 2 * d)  # H/4
        self.up2, self.dec2 = up(4, 2 * d, 4, d), caps(8, d, 4, d)  # H/2
        self.up3 = up(4, d, 2, d)  # H
        self.segment = caps(3, d, self.num_classes, d, kernel=1)
        self.decoder = None
        if decoder_hidden is not None:
            sizes = [d, *decoder_hidden]
            layers: list[nn.Module] = []
            for a, b in zip(sizes, sizes[1:]):
                layers += [nn.Conv2d(a, b, 1, **factory), nn.ReLU()]
            self.decoder = nn.Sequential(*layers, nn.Conv2d(sizes[-1], channels, 1, **factory), nn.Sigmoid())
        self._init_capsule_layers()

    def _init_capsule_layers(self) -> None:
        """Draw the capsule layers' weights so that lengths stay near 0.5 through the layers (module docstring)."""
        height, width = self.input_size[1:]
        grids = [  # each capsule layer and the grid of its input, at the nominal input size
            (self.primary, 1),
            (self.enc1, 2),
            (self.enc2[0], 2),
            (self.enc2[1], 4),
            (self.enc3[0], 4),
            (self.enc3[1], 8),
            (self.up1, 8),
            (self.dec1, 4),
            (self.up2, 4),
            (self.dec2, 2),
            (self.up3, 2),
            (self.segment, 1),
        ]
        for layer, scale in grids:
            taps = _kernel_taps(layer.conv, (height // scale, width // scale))
            std = 2.0 * layer.out_types / math.sqrt(taps * layer.in_types * layer.out_dim)
            with torch.no_grad():
                nn.init.normal_(layer.conv.weight, 0.0, std)
                nn.init.zeros_(layer.conv.bias)

    def encode(self, images: Tensor, *, owner: str = "SegCaps", name: str = "images") -> Tensor:
        """The segmentation capsules ``(B, K, D, H, W)`` (``owner`` and ``name``: for the messages of the input
        check)."""
        images = image_batch(
            images, (self.input_size[0], None, None), dtype=self.conv1.weight.dtype, owner=owner, name=name, multiple=8
        )
        conv1 = torch.relu(self.conv1(images)).unsqueeze(1)  # (B, 1, D, H, W): one capsule type
        skip1 = self.enc1(self.primary(conv1))  # (B, 4, D, H/2, W/2)
        skip2 = self.enc2[1](self.enc2[0](skip1))  # (B, 8, 2D, H/4, W/4)
        x = self.enc3[1](self.enc3[0](skip2))  # (B, 8, 2D, H/8, W/8)
        x = self.dec1(torch.cat([self.up1(x), skip2], dim=1))  # (B, 4, 2D, H/4, W/4)
        x = self.dec2(torch.cat([self.up2(x), skip1], dim=1))  # (B, 4, D, H/2, W/2)
        x = torch.cat([self.up3(x), conv1], dim=1)  # (B, 3, D, H, W)
        return self.segment(x)  # (B, K, D, H, W)

    def forward(self, images: Tensor, masks: Tensor | None = None) -> SegmentationOutput:
        """Per-pixel probabilities, capsules and reconstruction of ``images`` (a non-empty batch; uint8 images are
        scaled to ``[0, 1]``, floating-point ones cast to the parameters' dtype:
        :func:`~capsnets.validation.image_batch`)."""
        capsules = self.encode(images)  # (B, K, D, H, W)
        output = SegmentationOutput(capsule_length(capsules, dim=2), capsules)  # probabilities (B, K, H, W)
        if self.decoder is not None:
            fits = masks is None or (masks.dim() == 4 and masks.shape[1] == 1 and masks.shape[2:] == capsules.shape[3:])
            if not fits or (masks is not None and masks.shape[0] != capsules.shape[0]):
                expected = (capsules.shape[0], 1, *capsules.shape[3:])
                raise ArgumentError(f"masks must have shape {expected} (B, 1, H, W), got {tuple(masks.shape)}")
            truth = (masks if masks is not None else output.predicted_classes()).long()  # (B, 1, H, W)
            if self.num_classes == 1:
                kept = capsules[:, 0] * truth.to(capsules.dtype)  # (B, D, H, W): the object's capsules
            else:  # each object pixel keeps its class's capsule; background pixels (class 0) none
                keep = nn.functional.one_hot(truth[:, 0], self.num_classes).permute(0, 3, 1, 2)[:, :, None]
                keep[:, 0] = 0  # (B, K, 1, H, W)
                kept = (capsules * keep.to(capsules.dtype)).sum(dim=1)  # (B, D, H, W)
            output.reconstruction = self.decoder(kept)
        return output


def _kernel_taps(conv: nn.Conv2d | nn.ConvTranspose2d, size: tuple[int, int]) -> float:
    """The mean number of kernel taps of ``conv`` that fall on an input grid of ``size`` (not on its padding) per
    output position."""
    ones, kernel = torch.ones(1, 1, *size), torch.ones(1, 1, *conv.kernel_size)
    if isinstance(conv, nn.ConvTranspose2d):
        counts = nn.functional.conv_transpose2d(
            ones, kernel, stride=conv.stride, padding=conv.padding, output_padding=conv.output_padding
        )
    else:
        counts = nn.functional.conv2d(ones, kernel, stride=conv.stride, padding=conv.padding)
    return counts.mean().item()


@register_model("segcaps", task="segmentation")
def segcaps(
    *,
    input_size: ImageSize = (1, 512, 512),
    routing: Routing = "dynamic",
    reconstruction: bool = True,
    num_classes: PositiveInt = 1,
    device: Device | None = None,
    dtype: DType | None = None,
) -> SegCaps:
    """The paper's SegCaps R3 (16-D first capsules; 1.4M parameters); ``num_classes``: see :class:`SegCaps`."""
    return SegCaps(
        input_size=input_size,
        width=16,
        routing=routing,
        decoder_hidden=(64, 128) if flag("reconstruction", reconstruction) else None,
        num_classes=num_classes,
        device=device,
        dtype=dtype,
    )


#: ``segcaps_small``'s training recipe (:func:`~capsnets.models.training_recipe`): Adam at 6e-3. Deviation: LaLonde &
#: Bagci's code (lalonderodney/SegCaps, ``train.py``, ``main.py``) trains with Adam at 1e-4 (betas 0.99, 0.999) for up
#: to 200 epochs of 2,000 steps.
SMALL_RECIPE: Mapping[str, object] = MappingProxyType({"lr": 6e-3})


@register_model("segcaps_small", task="segmentation", recipe=SMALL_RECIPE)
def segcaps_small(
    *,
    input_size: ImageSize = (1, 32, 32),
    routing: Routing = "dynamic",
    reconstruction: bool = True,
    num_classes: PositiveInt = 1,
    device: Device | None = None,
    dtype: DType | None = None,
) -> SegCaps:
    """SegCaps R3 with 8-D first capsules (about a quarter of the parameters), for CPUs and tests; ``num_classes``:
    see :class:`SegCaps`."""
    return SegCaps(
        input_size=input_size,
        width=8,
        routing=routing,
        decoder_hidden=(32, 64) if flag("reconstruction", reconstruction) else None,
        num_classes=num_classes,
        device=device,
        dtype=dtype,
    )
