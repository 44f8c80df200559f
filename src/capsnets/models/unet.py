"""U-Net, the segmentation baseline SegCaps is compared with (Ronneberger, Fischer & Brox 2015).

Four 2x2 max-pooling stages, each preceded by two 3x3 ReLU convolutions (64, 128, 256, 512 channels; 1024
at the bottom); the decoder upsamples with 2x2 stride-2 transposed convolutions, concatenates the encoder
maps of the same size and applies two 3x3 ReLU convolutions; a 1x1 convolution gives one logit per pixel
(``num_classes`` K > 1: K logits per pixel, a softmax over the classes, the background included).
31,030,593 parameters for one input channel (SegCaps' paper: U-Net 31M).
Deviation: "same" padding (the original crops valid convolutions), so the output has the input's size;
``H`` and ``W`` must be divisible by 16.
Registered: ``unet`` (base width 64) and ``unet_small`` (base width 8, for CPUs), task "segmentation".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from capsnets.models.registry import register_model
from capsnets.models.segcaps import SegmentationOutput
from capsnets.validation import (
    ArgumentError,
    Device,
    DType,
    ImageSize,
    PositiveInt,
    flag,
    image_batch,
    image_size,
    placement,
    positive_int,
)


def _double_conv(a: int, b: int, factory: dict, norm: bool) -> nn.Sequential:
    def block(i: int, o: int) -> list[nn.Module]:
        return [
            nn.Conv2d(i, o, 3, padding=1, bias=not norm, **factory),
            *([nn.BatchNorm2d(o, **factory)] if norm else []),
            nn.ReLU(),
        ]

    return nn.Sequential(*block(a, b), *block(b, b))


class UNet(nn.Module):
    """U-Net with one output probability per pixel (or one per class and pixel).

    Args:
        input_size: nominal ``(C, H, W)``; ``H`` and ``W`` divisible by 16.
        width: channels of the first stage (64 in the paper); stage ``k`` has ``width * 2**k``.
        out_channels: output maps: 1 for binary segmentation (a sigmoid), K > 1 for K classes (a softmax over
            them); pix2pix uses the image's channels.
        batch_norm: batch normalisation after every 3x3 convolution (pix2pix's generator has it; the
            original U-Net does not).

    Shape:
        images ``(B, C, H, W)`` -> :class:`SegmentationOutput` with ``probabilities`` and ``logits``
        ``(B, out_channels, H, W)`` (``capsules`` and ``reconstruction`` are None).

    Examples::

        >>> UNet(input_size=(1, 32, 32), width=8)(torch.rand(2, 1, 32, 32)).probabilities.shape
        torch.Size([2, 1, 32, 32])
    """

    default_loss = "binary_segmentation"
    task = "segmentation"
    depth = 4

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 512, 512),
        width: int = 64,
        out_channels: int = 1,
        batch_norm: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        if self.input_size[1] % 16 or self.input_size[2] % 16:
            raise ArgumentError(
                f"UNet needs H and W divisible by 16 (four poolings), got input_size {self.input_size}", "input_size"
            )
        flag("batch_norm", batch_norm)
        positive_int("out_channels", out_channels)
        device, dtype = placement(device, dtype)
        factory = {"device": device, "dtype": dtype}
        sizes = [positive_int("width", width) * 2**k for k in range(self.depth + 1)]
        self.down = nn.ModuleList(
            [_double_conv(a, b, factory, batch_norm) for a, b in zip([self.input_size[0], *sizes], sizes)]
        )
        self.up = nn.ModuleList([nn.ConvTranspose2d(b, a, 2, stride=2, **factory) for a, b in zip(sizes, sizes[1:])])
        self.merge = nn.ModuleList([_double_conv(2 * a, a, factory, batch_norm) for a in sizes[:-1]])
        self.head = nn.Conv2d(sizes[0], positive_int("out_channels", out_channels), 1, **factory)
        self.num_classes = out_channels

    def forward(self, images: Tensor, masks: Tensor | None = None) -> SegmentationOutput:
        """Per-pixel probabilities of ``images`` (a non-empty batch; uint8 images are scaled to ``[0, 1]``,
        floating-point ones cast to the parameters' dtype: :func:`~capsnets.validation.image_batch`)."""
        logits = self.logits(images)
        probabilities = torch.sigmoid(logits) if logits.shape[1] == 1 else torch.softmax(logits, dim=1)
        return SegmentationOutput(probabilities, logits=logits)

    def logits(self, images: Tensor, *, owner: str = "UNet", name: str = "images") -> Tensor:
        """``(B, C, H, W) -> (B, out_channels, H, W)`` pre-sigmoid outputs (``owner`` and ``name``: for the
        messages of the input check)."""
        images = image_batch(
            images, (self.input_size[0], None, None), dtype=self.head.weight.dtype, owner=owner, name=name, multiple=16
        )
        skips, x = [], images
        for k, block in enumerate(self.down):
            x = block(x if k == 0 else nn.functional.max_pool2d(x, 2))
            skips.append(x)
        for k in reversed(range(self.depth)):  # (B, w*2^k, H/2^k, W/2^k) at each step
            x = self.merge[k](torch.cat([self.up[k](x), skips[k]], dim=1))
        return self.head(x)


@register_model("unet", task="segmentation")
def unet(
    *,
    input_size: ImageSize = (1, 512, 512),
    batch_norm: bool = False,
    num_classes: PositiveInt = 1,
    device: Device | None = None,
    dtype: DType | None = None,
) -> UNet:
    """The U-Net of Ronneberger et al. with "same" padding (31.0M parameters; ``batch_norm``: see UNet;
    ``num_classes``: 1 for binary segmentation, else the classes, the background included)."""
    return UNet(
        input_size=input_size,
        width=64,
        out_channels=positive_int("num_classes", num_classes),
        batch_norm=batch_norm,
        device=device,
        dtype=dtype,
    )


@register_model("unet_small", task="segmentation")
def unet_small(
    *,
    input_size: ImageSize = (1, 32, 32),
    batch_norm: bool = False,
    num_classes: PositiveInt = 1,
    device: Device | None = None,
    dtype: DType | None = None,
) -> UNet:
    """U-Net with 8 channels in the first stage (about 1/64 of the parameters), for CPUs and tests
    (``num_classes``: as :func:`unet`)."""
    return UNet(
        input_size=input_size,
        width=8,
        out_channels=positive_int("num_classes", num_classes),
        batch_norm=batch_norm,
        device=device,
        dtype=dtype,
    )
