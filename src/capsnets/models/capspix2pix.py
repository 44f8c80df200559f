"""CapsPix2pix: image synthesis from label maps with a convolutional capsule generator (Bass et al. 2019).

Bass, Dai, Stuart et al. (2019), "Image synthesis with a convolutional capsule generative adversarial
network" (MIDL). pix2pix (Isola et al. 2017) is a conditional GAN: a generator maps a label map to
an image, a PatchGAN discriminator judges (label map, image) pairs patch by patch, and the generator is
trained on the adversarial loss plus ``lambda`` times the L1 distance to the real image. CapsPix2pix
keeps the discriminator and the losses and builds the generator from convolutional capsule layers.

Here the capsule generator is the SegCaps R3 trunk (:class:`~capsnets.models.segcaps.SegCaps` without its
reconstruction decoder; see there for the layers) whose final capsule at every pixel is turned into the
output pixel by 1x1 convolutions (64, 128 ReLU, then sigmoid), the same head SegCaps uses to reconstruct.
The pix2pix baseline generator is a U-Net (:class:`~capsnets.models.unet.UNet`) with batch normalisation, as
in pix2pix, and a sigmoid output.
Deviations: Bass et al. add a noise input and use their own capsule U-Net; outputs lie in ``[0, 1]``
(sigmoid, not tanh); the discriminator has two stride-2 stages (a 10x10 receptive field suited to 32x32
images, against pix2pix's 70x70 for 256x256).

Registered (task ``"synthesis"``): ``capspix2pix`` / ``capspix2pix_small`` (16-D / 8-D first capsules;
``routing`` as for SegCaps) and ``pix2pix`` / ``pix2pix_small``
(U-Net width 64 / 8). Inputs: ``(B, K, H, W)`` label maps (one
channel per class), ``H`` and ``W`` divisible by 8 (16 for the U-Net).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from capsnets.models.registry import register_model
from capsnets.models.segcaps import SegCaps
from capsnets.models.unet import UNet
from capsnets.validation import Device, DType, ImageSize, PositiveInt, Routing, placement, positive_int


@dataclass
class SynthesisOutput:
    """What an image-synthesis generator returns.

    Attributes:
        images: ``(B, C, H, W)`` generated images in ``[0, 1]``.
        capsules: ``(B, D, H, W)`` the final capsule at every pixel (None for the CNN generator).
    """

    images: Tensor
    capsules: Tensor | None = None


class CapsPix2pixGenerator(nn.Module):
    """Label map -> image through the SegCaps capsule trunk and a 1x1 convolutional head.

    Args:
        input_size: ``(K, H, W)`` of the label maps.
        out_channels: channels of the generated image.
        width: capsule dimension of the first capsule types (see :class:`SegCaps`).
        routing: of the capsule layers (see :class:`SegCaps`).
        head_hidden: channels of the head's hidden 1x1 convolutions.

    Shape:
        label maps ``(B, K, H, W)`` -> :class:`SynthesisOutput` with images ``(B, out_channels, H, W)``.

    Examples::

        >>> generator = CapsPix2pixGenerator(input_size=(10, 32, 32), width=4)
        >>> generator(torch.rand(2, 10, 32, 32)).images.shape
        torch.Size([2, 1, 32, 32])
    """

    task = "synthesis"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (10, 32, 32),
        out_channels: int = 1,
        width: int = 16,
        routing="dynamic",
        head_hidden: Sequence[int] = (64, 128),
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        device, dtype = placement(device, dtype)
        self.trunk = SegCaps(
            input_size=input_size, width=width, routing=routing, decoder_hidden=None, device=device, dtype=dtype
        )
        self.input_size, self.out_channels = self.trunk.input_size, positive_int("out_channels", out_channels)
        self.routing_spec = self.trunk.routing_spec
        sizes, layers = [width, *head_hidden], []
        for a, b in zip(sizes, sizes[1:]):
            layers += [nn.Conv2d(a, b, 1, device=device, dtype=dtype), nn.ReLU()]
        self.head = nn.Sequential(
            *layers, nn.Conv2d(sizes[-1], out_channels, 1, device=device, dtype=dtype), nn.Sigmoid()
        )

    def decode(self, capsules: Tensor) -> Tensor:
        """Images ``(B, C, H, W)`` from final capsules ``(B, D, H, W)`` (e.g. perturbed ones)."""
        return self.head(capsules)

    def forward(self, label_maps: Tensor) -> SynthesisOutput:
        """Images generated from ``label_maps`` (a non-empty batch; uint8 maps are scaled to ``[0, 1]``,
        floating-point ones cast to the parameters' dtype: :func:`~capsnets.validation.image_batch`)."""
        capsules = self.trunk.encode(label_maps, owner="CapsPix2pixGenerator", name="label_maps")[:, 0]  # (B, D, H, W)
        return SynthesisOutput(self.decode(capsules), capsules)


class Pix2pixGenerator(nn.Module):
    """The pix2pix baseline (Isola et al. 2017): a U-Net from label maps to a sigmoid image.

    Args:
        input_size: ``(K, H, W)`` of the label maps (``H``, ``W`` divisible by 16).
        out_channels: channels of the generated image.
        width: channels of the U-Net's first stage.

    Shape:
        label maps ``(B, K, H, W)`` -> :class:`SynthesisOutput` with images ``(B, out_channels, H, W)``.

    Examples::

        >>> Pix2pixGenerator(width=8)(torch.rand(2, 10, 32, 32)).images.shape
        torch.Size([2, 1, 32, 32])
    """

    task = "synthesis"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (10, 32, 32),
        out_channels: int = 1,
        width: int = 64,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.unet = UNet(
            input_size=input_size, width=width, out_channels=out_channels, batch_norm=True, device=device, dtype=dtype
        )
        self.input_size, self.out_channels = self.unet.input_size, out_channels

    def forward(self, label_maps: Tensor) -> SynthesisOutput:
        """Images generated from ``label_maps`` (as :meth:`CapsPix2pixGenerator.forward` takes them)."""
        return SynthesisOutput(torch.sigmoid(self.unet.logits(label_maps, owner="Pix2pixGenerator", name="label_maps")))


class PatchDiscriminator(nn.Module):
    """PatchGAN: one real/fake logit per patch of the (label map, image) pair.

    Args:
        in_channels: label-map channels plus image channels.
        width: channels of the first convolution (doubled at each further stride-2 stage).
        stages: stride-2 4x4 convolutions (LeakyReLU 0.2; batch norm after all but the first).

    Shape:
        ``(B, K, H, W), (B, C, H, W) -> (B, 1, H / 2**stages - 1, W / 2**stages - 1)`` logits.

    Examples::

        >>> PatchDiscriminator(11, width=8)(torch.rand(2, 10, 32, 32), torch.rand(2, 1, 32, 32)).shape
        torch.Size([2, 1, 7, 7])
    """

    def __init__(self, in_channels: int, *, width: int = 64, stages: int = 2, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        layers, channels = [], positive_int("in_channels", in_channels)
        for k in range(positive_int("stages", stages)):
            out = positive_int("width", width) * 2**k
            layers += [nn.Conv2d(channels, out, 4, 2, 1, **factory)]
            layers += [nn.BatchNorm2d(out, **factory)] if k else []
            layers += [nn.LeakyReLU(0.2)]
            channels = out
        self.net = nn.Sequential(*layers, nn.Conv2d(channels, 1, 4, 1, 1, **factory))

    def forward(self, label_maps: Tensor, images: Tensor) -> Tensor:
        return self.net(torch.cat([label_maps, images], dim=1))


@register_model("capspix2pix", task="synthesis")
def capspix2pix(
    *,
    input_size: ImageSize = (10, 32, 32),
    out_channels: PositiveInt = 1,
    routing: Routing = "dynamic",
    device: Device | None = None,
    dtype: DType | None = None,
) -> CapsPix2pixGenerator:
    """CapsPix2pix generator on the SegCaps R3 trunk (16-D first capsules)."""
    return CapsPix2pixGenerator(
        input_size=input_size, out_channels=out_channels, width=16, routing=routing, device=device, dtype=dtype
    )


@register_model("capspix2pix_small", task="synthesis")
def capspix2pix_small(
    *,
    input_size: ImageSize = (10, 32, 32),
    out_channels: PositiveInt = 1,
    routing: Routing = "dynamic",
    device: Device | None = None,
    dtype: DType | None = None,
) -> CapsPix2pixGenerator:
    """CapsPix2pix generator with 8-D first capsules and a (32, 64) head, for CPUs."""
    return CapsPix2pixGenerator(
        input_size=input_size,
        out_channels=out_channels,
        width=8,
        head_hidden=(32, 64),
        routing=routing,
        device=device,
        dtype=dtype,
    )


@register_model("pix2pix", task="synthesis")
def pix2pix(
    *,
    input_size: ImageSize = (10, 32, 32),
    out_channels: PositiveInt = 1,
    device: Device | None = None,
    dtype: DType | None = None,
) -> Pix2pixGenerator:
    """pix2pix's U-Net generator (width 64)."""
    return Pix2pixGenerator(input_size=input_size, out_channels=out_channels, width=64, device=device, dtype=dtype)


@register_model("pix2pix_small", task="synthesis")
def pix2pix_small(
    *,
    input_size: ImageSize = (10, 32, 32),
    out_channels: PositiveInt = 1,
    device: Device | None = None,
    dtype: DType | None = None,
) -> Pix2pixGenerator:
    """pix2pix's U-Net generator with width 8, for CPUs."""
    return Pix2pixGenerator(input_size=input_size, out_channels=out_channels, width=8, device=device, dtype=dtype)
