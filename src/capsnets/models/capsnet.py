"""CapsNet with dynamic routing (Sabour, Frosst & Hinton 2017, "Dynamic Routing Between Capsules").

Architecture (Sec. 4, Fig. 1-2): ReLU Conv1 -> PrimaryCapsules -> DigitCaps (routing) -> masked decoder.
Registered variants:

- ``capsnet``: the paper's MNIST model, 28x28 input, 8,215,568 parameters with the decoder (Sec. 5: 8.2M, 6.8M
  without it). On smallNORB and the rendered viewpoint set it takes their 1x32x32 crops and 5 classes, as
  Sec. 7 trains the MNIST architecture, unchanged, on smallNORB (8,256,768 parameters).
- ``capsnet_cifar10``: Sec. 7's CIFAR-10 model: the MNIST model with 3 input channels, 64 primary capsule
  types, 24x24 patches of the 32x32 images (a random one in training, the central one at test) and a
  "none-of-the-above" parent in the routing softmax (:class:`~capsnets.functional.DynamicRouting`); no
  decoder, as the authors' released code trains it (``remake=false``). 11,990,528 parameters.
- ``capsnet_svhn``: Sec. 7's smaller SVHN model: 64 channels in the first convolution, 16 types of 6-D
  primary capsules, 8-D class capsules, a decoder from the 10 x 8-D capsules to 3x32x32. 4,720,480 parameters.
- ``capsnet_small``: the same design, narrower (for CPU tests and quick experiments).
- ``capsnet_digits``: for scikit-learn's 8x8 digits (3x3 kernels).

The builders take ``routing``: a routing object, its spec or a spec type name (default ``"dynamic"``:
:class:`~capsnets.functional.DynamicRouting` with its defaults; ``capsnet_cifar10``: with a
none-of-the-above parent). As in the paper, the parent pre-activations have no bias.
Deviations: the routing's gradient path follows the authors' released code by default (``detach_routing``:
predictions detached in non-final iterations). The CIFAR-10 patches are cut by the model (``crop``), not by
the data set, so any 32x32 data, ``evaluate``, ``predict`` and export give it what it was trained on; its
random windows come from torch's generator (saved in a run's checkpoints), not the data loader's. The released
code (Sarasra/models, ``research/capsules``) trains CIFAR-10 with ``num_prime_capsules=64,padding=SAME,
leaky=true,remake=false`` (its README) and also flips, jitters brightness and contrast and standardises each
patch (``input_data/cifar10/cifar10_input.py``); the paper names none of the padding and distortions, and they
are not done here. smallNORB's images are stereo pairs (two channels in the released code); the library reads
the left camera.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import torch
from torch import Tensor, nn

from capsnets.functional import VECTOR_ROUTING_TYPES, as_routing, routing_config
from capsnets.functional.crop import center_crop, random_crop
from capsnets.layers import CapsuleDecoder, LinearCapsules, PrimaryCapsules
from capsnets.models.classifier import Classifier
from capsnets.models.output import ModelOutput, vector_capsule_output
from capsnets.models.registry import register_model
from capsnets.validation import (
    ArgumentError,
    Device,
    DType,
    ImageSize,
    PositiveInt,
    Routing,
    conv_output_size,
    flag,
    image_batch,
    image_size,
    placement,
    positive_int,
)


class CapsNet(Classifier):
    """Conv -> primary capsules -> class capsules with routing -> optional reconstruction decoder.

    Args:
        input_size: ``(C, H, W)`` of the input images.
        crop: side of the square window of each image that the first convolution sees: a random window in
            training mode, the central one in eval mode (Sec. 7: CIFAR-10 on 24x24 patches); None: the whole
            image. A model that crops has no decoder (its reconstruction would be of the window, and the
            reconstruction loss compares it with the whole image).
        num_classes: number of class capsules.
        conv_channels: channels of the first (ReLU) convolution.
        conv_kernel: its kernel size.
        primary_types: capsule types in the primary layer.
        primary_dim: primary capsule dimension.
        primary_kernel, primary_stride: the primary convolution's kernel and stride.
        class_dim: class capsule dimension.
        routing: routing callable for the class capsules, its spec (a dict) or its type name (default
            ``"dynamic"``: :class:`~capsnets.functional.DynamicRouting` with its defaults).
        decoder_hidden: hidden sizes of the decoder; ``None`` builds no decoder.

    Shape:
        - images: ``(B, C, H, W)``; labels (optional, selects the decoded capsule): ``(B,)``
        - output: :class:`ModelOutput` with ``scores`` ``(B, num_classes)`` (capsule lengths),
          ``capsules`` ``(B, num_classes, class_dim)``, ``reconstruction`` ``(B, C, H, W)``.

    Examples::

        >>> model = CapsNet(input_size=(1, 28, 28), routing=DynamicRouting(2))
        >>> model(torch.rand(4, 1, 28, 28)).scores.shape
        torch.Size([4, 10])
        >>> cropped = CapsNet(input_size=(3, 32, 32), crop=24, conv_channels=16, primary_types=4,
        ...                   decoder_hidden=None).eval()
        >>> cropped(torch.rand(2, 3, 32, 32)).scores.shape, cropped.primary.num_capsules(16, 16)
        (torch.Size([2, 10]), 64)
    """

    default_loss = "margin"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 28, 28),
        crop: int | None = None,
        num_classes: int = 10,
        conv_channels: int = 256,
        conv_kernel: int = 9,
        primary_types: int = 32,
        primary_dim: int = 8,
        primary_kernel: int = 9,
        primary_stride: int = 2,
        class_dim: int = 16,
        routing: Callable[..., Tensor] | Mapping | str = "dynamic",
        decoder_hidden: Sequence[int] | None = (512, 1024),
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        self.num_classes = positive_int("num_classes", num_classes)
        routing = as_routing(routing, None, types=VECTOR_ROUTING_TYPES)
        self.routing_spec = routing_config(routing, strict=False)
        device, dtype = placement(device, dtype)
        channels, height, width = self.input_size
        self.crop = _check_crop(crop, self.input_size, decoder_hidden is not None)
        seen_h, seen_w = (height, width) if crop is None else (crop, crop)
        factory = {"device": device, "dtype": dtype}
        self.conv = nn.Conv2d(channels, conv_channels, conv_kernel, **factory)
        conv_h, conv_w = (conv_output_size(s, conv_kernel, 1, 0) for s in (seen_h, seen_w))
        if min(conv_h, conv_w) < 1:
            raise ArgumentError(f"input_size {self.input_size} (crop={crop}) is smaller than conv_kernel={conv_kernel}")
        self.primary = PrimaryCapsules(
            conv_channels, primary_types, primary_dim, kernel_size=primary_kernel, stride=primary_stride, **factory
        )
        self.class_capsules = LinearCapsules(
            self.primary.num_capsules(conv_h, conv_w),
            primary_dim,
            num_classes,
            class_dim,
            routing=routing,
            **factory,
        )
        self.decoder = None
        if decoder_hidden is not None:
            self.decoder = CapsuleDecoder(num_classes, class_dim, self.input_size, hidden=decoder_hidden, **factory)

    def primary_capsules(self, images: Tensor) -> Tensor:
        """Primary capsules ``(B, N, primary_dim)`` of ``images`` (cropped first when the model crops), ordered
        (type, row, column)."""
        images = image_batch(images, self.input_size, dtype=self.conv.weight.dtype, owner=type(self).__name__)
        if self.crop is not None:  # (B, C, crop, crop): a random window in training, the central one otherwise
            images = random_crop(images, self.crop) if self.training else center_crop(images, self.crop)
        return self.primary(torch.relu(self.conv(images)))  # (B, conv_channels, H1, W1) -> (B, N, D_p)

    def primary_grid(self) -> tuple[int, int]:
        """Spatial size ``(H', W')`` of the primary capsule grid for this model's input (its crop, if it crops):
        :meth:`primary_capsules` are ordered (type, row, column) over it."""
        side = self.input_size[1:] if self.crop is None else (self.crop, self.crop)
        conv = [conv_output_size(s, self.conv.kernel_size[0], self.conv.stride[0], self.conv.padding[0]) for s in side]
        return self.primary.output_grid(*conv)

    def forward_features(self, images: Tensor) -> Tensor:
        """What the class capsule layer (:meth:`get_classifier`) routes: the primary capsules of ``images``
        (:meth:`primary_capsules`).

        Shape:
            images ``(B, C, H, W)`` -> ``(B, N, primary_dim)``, ``N`` the primary capsules.

        Examples::

            >>> model = capsnets.create_model("capsnet_small")
            >>> model.get_classifier()(model.forward_features(torch.rand(2, 1, 28, 28))).shape
            torch.Size([2, 10, 16])
        """
        return self.primary_capsules(images)

    def encode(self, images: Tensor) -> Tensor:
        """Class capsules ``(B, num_classes, class_dim)``."""
        return self.class_capsules(self.forward_features(images))  # (B, N, D_p) -> (B, K, D_c)

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        """Class capsules, scores and reconstruction of ``images`` (a non-empty batch; uint8 images are scaled to
        ``[0, 1]``, floating-point ones cast to the parameters' dtype:
        :func:`~capsnets.validation.image_batch`)."""
        return vector_capsule_output(self.encode(images), self.decoder, labels)

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}" + (f", crop={self.crop}" if self.crop is not None else "")


def _check_crop(crop: int | None, input_size: tuple[int, int, int], decoder: bool) -> int | None:
    """``crop`` if it fits the images and the model has no decoder (:class:`CapsNet`'s ``crop``)."""
    if crop is None:
        return None
    crop = positive_int("crop", crop)
    if crop > min(input_size[1:]):
        raise ArgumentError(
            f"crop={crop} is larger than the {input_size[1]}x{input_size[2]} images of input_size {input_size}", "crop"
        )
    if decoder:
        raise ArgumentError(
            f"crop={crop} with a decoder: it would draw the {crop}x{crop} window, and the "
            f"reconstruction loss compares it with the whole {input_size[1]}x{input_size[2]} image; "
            f"leave the decoder out (reconstruction=false, as the authors' released code trains its "
            f"CIFAR-10 model) or the crop (crop=null)",
            "crop",
        )
    return crop


#: The routing of Sec. 7's CIFAR-10 model: dynamic routing with a none-of-the-above parent.
CIFAR10_ROUTING = MappingProxyType({"type": "dynamic", "none_of_the_above": True})


def _decoder(reconstruction, hidden: tuple[int, int]) -> tuple[int, int] | None:
    return hidden if flag("reconstruction", reconstruction) else None


@register_model("capsnet")
def capsnet(
    *,
    num_classes: PositiveInt = 10,
    input_size: ImageSize = (1, 28, 28),
    routing: Routing = "dynamic",
    reconstruction: bool = True,
    device: Device | None = None,
    dtype: DType | None = None,
) -> CapsNet:
    """The paper's MNIST CapsNet (Sec. 4): 256 9x9 conv, 32x8-D primary capsules, 16-D class capsules."""
    return CapsNet(
        input_size=input_size,
        num_classes=num_classes,
        routing=routing,
        decoder_hidden=_decoder(reconstruction, (512, 1024)),
        device=device,
        dtype=dtype,
    )


@register_model("capsnet_cifar10")
def capsnet_cifar10(
    *,
    num_classes: PositiveInt = 10,
    input_size: ImageSize = (3, 32, 32),
    crop: PositiveInt | None = 24,
    routing: Routing = CIFAR10_ROUTING,
    reconstruction: bool = False,
    device: Device | None = None,
    dtype: DType | None = None,
) -> CapsNet:
    """Sec. 7's CIFAR-10 CapsNet: the MNIST model with 64 primary capsule types, on ``crop`` x ``crop`` patches
    (random in training, central at test), routing with a none-of-the-above parent.

    ``reconstruction=true`` takes ``crop=null`` (a decoder of the whole image; see :class:`CapsNet`). The patches
    are the paper's only augmentation here: train with ``--max-shift 0``.
    """
    return CapsNet(
        input_size=input_size,
        crop=crop,
        num_classes=num_classes,
        primary_types=64,
        routing=routing,
        decoder_hidden=_decoder(reconstruction, (512, 1024)),
        device=device,
        dtype=dtype,
    )


@register_model("capsnet_svhn")
def capsnet_svhn(
    *,
    num_classes: PositiveInt = 10,
    input_size: ImageSize = (3, 32, 32),
    routing: Routing = "dynamic",
    reconstruction: bool = True,
    device: Device | None = None,
    dtype: DType | None = None,
) -> CapsNet:
    """Sec. 7's smaller SVHN CapsNet: 64-channel 9x9 conv, 16 types of 6-D primary capsules, 8-D class capsules;
    the decoder's hidden layers are the MNIST model's (512, 1024; the paper gives none)."""
    return CapsNet(
        input_size=input_size,
        num_classes=num_classes,
        conv_channels=64,
        primary_types=16,
        primary_dim=6,
        class_dim=8,
        routing=routing,
        decoder_hidden=_decoder(reconstruction, (512, 1024)),
        device=device,
        dtype=dtype,
    )


@register_model("capsnet_small")
def capsnet_small(
    *,
    num_classes: PositiveInt = 10,
    input_size: ImageSize = (1, 28, 28),
    routing: Routing = "dynamic",
    reconstruction: bool = True,
    device: Device | None = None,
    dtype: DType | None = None,
) -> CapsNet:
    """CapsNet narrowed for CPUs: 32-channel conv, 8 types of 8-D primary capsules (288 capsules)."""
    return CapsNet(
        input_size=input_size,
        num_classes=num_classes,
        conv_channels=32,
        primary_types=8,
        routing=routing,
        decoder_hidden=_decoder(reconstruction, (256, 512)),
        device=device,
        dtype=dtype,
    )


@register_model("capsnet_digits")
def capsnet_digits(
    *,
    num_classes: PositiveInt = 10,
    input_size: ImageSize = (1, 8, 8),
    routing: Routing = "dynamic",
    reconstruction: bool = True,
    device: Device | None = None,
    dtype: DType | None = None,
) -> CapsNet:
    """CapsNet for 8x8 digits: 3x3 kernels, primary stride 1 (4x4 grid of 16 types of 8-D capsules)."""
    return CapsNet(
        input_size=input_size,
        num_classes=num_classes,
        conv_channels=64,
        conv_kernel=3,
        primary_types=16,
        primary_kernel=3,
        primary_stride=1,
        routing=routing,
        decoder_hidden=_decoder(reconstruction, (128, 256)),
        device=device,
        dtype=dtype,
    )
