"""Efficient-CapsNet (Mazzia, Salvetti & Chiaberge 2021, "Efficient-CapsNet: capsule network with self-attention
routing", Scientific Reports 11, Sec. "Methods" and Fig. 1), as in the authors' code (EscVM/Efficient-CapsNet,
``models/efficient_capsnet_graph_mnist.py``, ``models/efficient_capsnet_graph_smallnorb.py``, ``utils/layers.py``).

Four convolutions -> depthwise-separable primary capsules -> class capsules by self-attention routing
(:class:`~capsnets.functional.SelfAttentionRouting`, with the paper's squash,
:func:`~capsnets.functional.efficient_squash`, in both capsule layers) -> a reconstruction decoder fed the
masked class capsules. The primary convolution is depthwise with a kernel as large as the last feature map, so
it leaves one position, whose channels are the primary capsules. Registered variants:

- ``efficient_capsnet``: the MNIST model. Convolutions 32 5x5, 64 3x3, 64 3x3, 128 3x3 stride 2, each ReLU then
  batch norm; 16 primary capsules of 8-D; 10 class capsules of 16-D; the fully connected decoder (512, 1024).
  161,824 parameters without the decoder (the paper's 161K, Table 2, which leaves the decoder out) and
  1,573,168 with it.
- ``efficient_capsnet_smallnorb``: the smallNORB model. Convolutions 32 7x7 stride 2, 64 3x3, 64 3x3, 128 3x3
  stride 2, each leaky ReLU (slope 0.3) then instance norm; 5 class capsules; a convolutional decoder (a
  linear layer to a 1-channel seed image, then three rounds of bilinear 2x upsampling and a 3x3 convolution, and
  a last 3x3 convolution with a sigmoid). The authors feed 48x48 stereo pairs, ``input_size=(2, 48, 48)``:
  151,664 parameters without the decoder (the paper's 151K, Table 4), 381,234 with it. Its default here is the
  library's 32x32 grey crops (smallNORB and the viewpoint set): a 4x4 primary kernel and a 6x6 decoder seed
  instead of 8x8, 143,952 parameters without the decoder, 370,101 with it.

Both use the margin loss with the reconstruction term (``default_loss = "margin"``): its default weight,
0.0005 times the summed squared error, is the authors' 0.392 times the mean squared error on 28x28 images. As
in the authors' code, the decoder's sigmoid is compared with the images as the data set gives them (for
smallNORB, standardised).
Initialisation as the authors' Keras code: truncated He normal for the convolutions and the class capsules'
transformation (with Keras's fan-in of that 4-D weight), Glorot for the rest, instance norm scales and
offsets uniform in [-0.05, 0.05]. Deviation: batch norm keeps running statistics with PyTorch's momentum,
0.1 (Keras's 0.99 is a momentum of 0.01 here), so that short runs evaluate with settled statistics.

Dimension legend: ``B`` batch, ``C`` image channels, ``F`` channels of the last convolution, ``N`` primary
capsules, ``D_p`` their dim, ``K`` classes, ``D`` class capsule dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from capsnets.functional import VECTOR_ROUTING_TYPES, as_routing, efficient_squash, mask_capsules, routing_config
from capsnets.layers import CapsuleDecoder, LinearCapsules
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
    choice,
    conv_output_size,
    flag,
    image_batch,
    image_size,
    placement,
    positive_int,
)

#: ``(channels, kernel, stride)`` of the four convolutions of the authors' MNIST and smallNORB models.
MNIST_CONVS = ((32, 5, 1), (64, 3, 1), (64, 3, 1), (128, 3, 2))
SMALLNORB_CONVS = ((32, 7, 2), (64, 3, 1), (64, 3, 1), (128, 3, 2))
#: The decoders: ``"fully_connected"`` (MNIST) or ``"convolutional"`` (smallNORB).
DECODERS = ("fully_connected", "convolutional")
_KERAS_EPS = 1e-3  # epsilon of Keras's batch norm and of TensorFlow Addons' instance norm


class DepthwisePrimaryCapsules(nn.Module):
    """Primary capsules from a depthwise convolution: each channel of the map filtered on its own, the channels
    at each position grouped into capsules of ``capsule_dim``, squashed with Efficient-CapsNet's squash.

    Args:
        channels: channels ``F`` of the input map (and of the output, ``F / capsule_dim`` capsules per position).
        capsule_dim: dimension ``D_p`` of each capsule.
        kernel_size: ``(kh, kw)`` of the depthwise convolution (the authors': the whole map).

    Shape:
        - input: ``(B, F, H, W)``
        - output: ``(B, F / D_p * H' * W', D_p)``, capsules ordered by (row, column, capsule).

    Examples::

        >>> DepthwisePrimaryCapsules(128, 8, (9, 9))(torch.randn(2, 128, 9, 9)).shape
        torch.Size([2, 16, 8])
    """

    def __init__(
        self, channels: int, capsule_dim: int, kernel_size: tuple[int, int], *, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.channels = positive_int("channels", channels)
        self.capsule_dim = positive_int("capsule_dim", capsule_dim)
        if channels % capsule_dim:
            raise ArgumentError(f"channels ({channels}) must be a multiple of capsule_dim ({capsule_dim})")
        self.conv = nn.Conv2d(channels, channels, kernel_size, groups=channels, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        maps = self.conv(x)  # (B, F, H', W')
        caps = maps.permute(0, 2, 3, 1).reshape(x.shape[0], -1, self.capsule_dim)  # (B, N, D_p)
        return efficient_squash(caps)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, capsule_dim={self.capsule_dim}, kernel_size={self.conv.kernel_size}"


class ConvCapsuleDecoder(nn.Module):
    """The smallNORB decoder of Efficient-CapsNet: masked class capsules -> a linear layer to a 1-channel seed
    image ``(H + 16) / 8`` on a side -> three times (bilinear 2x upsampling, 3x3 convolution, leaky ReLU with
    slope 0.2) with 64, 128 and 128 channels -> a 3x3 convolution to ``C`` channels and a sigmoid. No padding:
    a 6x6 seed gives 32x32, an 8x8 seed 48x48.

    Args:
        num_capsules, capsule_dim: the class capsules ``K`` and their dim ``D``.
        output_shape: ``(C, H, W)``, ``H`` and ``W`` multiples of 8.

    Shape:
        - capsules: ``(B, K, D)``; select: ``(B,)`` class indices or ``(B, K)`` mask
        - output: ``(B, C, H, W)`` in ``[0, 1]``

    Examples::

        >>> ConvCapsuleDecoder(5, 16, (1, 32, 32))(torch.randn(2, 5, 16), torch.tensor([0, 3])).shape
        torch.Size([2, 1, 32, 32])
    """

    def __init__(
        self, num_capsules: int, capsule_dim: int, output_shape: Sequence[int], *, device=None, dtype=None
    ) -> None:
        super().__init__()
        channels, height, width = output_shape
        if height % 8 or width % 8:
            raise ArgumentError(
                f"the convolutional decoder draws images whose sides are multiples of 8, got "
                f"input_size {tuple(output_shape)}; build the model without it (reconstruction=False)"
            )
        self.output_shape = tuple(output_shape)
        self.seed = ((height + 16) // 8, (width + 16) // 8)
        factory = {"device": device, "dtype": dtype}
        self.linear = nn.Linear(num_capsules * capsule_dim, math.prod(self.seed), **factory)
        layers: list[nn.Module] = []
        for fan_in, fan_out in ((1, 64), (64, 128), (128, 128)):
            layers += [
                nn.Upsample(scale_factor=2, mode="bilinear"),
                nn.Conv2d(fan_in, fan_out, 3, **factory),
                nn.LeakyReLU(0.2),
            ]
        self.convs = nn.Sequential(*layers, nn.Conv2d(128, channels, 3, **factory), nn.Sigmoid())

    def forward(self, capsules: Tensor, select: Tensor) -> Tensor:
        seed = self.linear(mask_capsules(capsules, select))  # (B, h0 * w0)
        return self.convs(seed.view(-1, 1, *self.seed))  # (B, C, H, W)

    def extra_repr(self) -> str:
        return f"output_shape={self.output_shape}, seed={self.seed}"


class EfficientCapsNet(Classifier):
    """Convolutions -> depthwise primary capsules -> class capsules by routing -> optional decoder.

    Args:
        input_size: ``(C, H, W)`` of the input images.
        num_classes: class capsules ``K``.
        convs: ``(channels, kernel, stride)`` of each convolution (no padding); the last one's channels ``F``
            are split into primary capsules.
        norm: ``"batch"`` (each convolution followed by ReLU and batch norm, the MNIST model) or ``"instance"``
            (leaky ReLU of slope 0.3 and instance norm with a learned scale and offset, the smallNORB model).
        primary_dim: primary capsule dim ``D_p`` (``F / D_p`` primary capsules).
        class_dim: class capsule dim ``D``.
        routing: routing of the class capsules, its spec or its type name (default ``"self_attention"``:
            :class:`~capsnets.functional.SelfAttentionRouting` with its defaults).
        decoder: ``"fully_connected"`` (hidden 512, 1024), ``"convolutional"`` (:class:`ConvCapsuleDecoder`) or None.

    Shape:
        - images: ``(B, C, H, W)``; labels (optional, selects the decoded capsule): ``(B,)``
        - output: :class:`ModelOutput` with ``scores`` ``(B, K)`` (capsule lengths), ``capsules`` ``(B, K, D)``,
          ``reconstruction`` ``(B, C, H, W)``.

    Examples::

        >>> model = EfficientCapsNet()
        >>> out = model(torch.rand(4, 1, 28, 28))
        >>> out.scores.shape, out.capsules.shape, out.reconstruction.shape
        (torch.Size([4, 10]), torch.Size([4, 10, 16]), torch.Size([4, 1, 28, 28]))
    """

    default_loss = "margin"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 28, 28),
        num_classes: int = 10,
        convs: Sequence[tuple[int, int, int]] = MNIST_CONVS,
        norm: str = "batch",
        primary_dim: int = 8,
        class_dim: int = 16,
        routing: Callable[..., Tensor] | Mapping | str = "self_attention",
        decoder: str | None = "fully_connected",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        choice("norm", norm, ("batch", "instance"))
        choice("decoder", decoder, (*DECODERS, None))
        self.num_classes = positive_int("num_classes", num_classes)
        routing = as_routing(routing, None, types=VECTOR_ROUTING_TYPES)
        self.routing_spec = routing_config(routing, strict=False)
        device, dtype = placement(device, dtype)
        factory = {"device": device, "dtype": dtype}
        self.stem, grid = _stem(self.input_size, convs, norm, factory)
        self.primary = DepthwisePrimaryCapsules(convs[-1][0], primary_dim, grid, **factory)
        self.class_capsules = LinearCapsules(
            convs[-1][0] // primary_dim, primary_dim, num_classes, class_dim, routing=routing, **factory
        )
        self.decoder = None
        if decoder == "fully_connected":
            self.decoder = CapsuleDecoder(num_classes, class_dim, self.input_size, hidden=(512, 1024), **factory)
        elif decoder == "convolutional":
            self.decoder = ConvCapsuleDecoder(num_classes, class_dim, self.input_size, **factory)
        self._init_as_keras()

    @torch.no_grad()
    def _init_as_keras(self) -> None:
        """The authors' initialisation (module docstring); biases zero, as Keras's."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.zeros_(module.bias)
                nn.init.xavier_uniform_(module.weight)  # Keras's default, glorot_uniform
            elif isinstance(module, nn.InstanceNorm2d):
                nn.init.uniform_(module.weight, -0.05, 0.05)
                nn.init.uniform_(module.bias, -0.05, 0.05)
        for conv in self.stem.modules():
            if isinstance(conv, nn.Conv2d):
                _keras_normal_(conv.weight, fan=conv.weight[0].numel())
        # Keras reads the fan-in of FCCaps's (K, N, D_p, D) weight as N * K * D_p (here it is (N, K, D, D_p))
        _keras_normal_(self.class_capsules.weight, fan=self.class_capsules.weight[:, :, 0].numel())
        if isinstance(self.decoder, CapsuleDecoder):
            linears = [m for m in self.decoder.mlp if isinstance(m, nn.Linear)]
            for linear in linears[:-1]:
                _keras_normal_(linear.weight, fan=linear.in_features)
            _keras_normal_(linears[-1].weight, fan=linears[-1].in_features + linears[-1].out_features)

    def forward_features(self, images: Tensor) -> Tensor:
        """What the class capsule layer (:meth:`get_classifier`) routes: the primary capsules of ``images`` (a
        non-empty batch, as :meth:`forward` takes it).

        Shape:
            images ``(B, C, H, W)`` -> ``(B, N, D_p)``, ``N = F / D_p`` primary capsules.

        Examples::

            >>> EfficientCapsNet().forward_features(torch.rand(2, 1, 28, 28)).shape
            torch.Size([2, 16, 8])
        """
        images = image_batch(images, self.input_size, dtype=self.primary.conv.weight.dtype, owner=type(self).__name__)
        return self.primary(self.stem(images))  # (B, F, h, w) -> (B, N, D_p)

    def encode(self, images: Tensor) -> Tensor:
        """Class capsules ``(B, K, D)``."""
        return self.class_capsules(self.forward_features(images))  # (B, N, D_p) -> (B, K, D)

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        """Class capsules, scores and reconstruction of ``images`` (a non-empty batch; uint8 images are scaled to
        ``[0, 1]``, floating-point ones cast to the parameters' dtype:
        :func:`~capsnets.validation.image_batch`)."""
        return vector_capsule_output(self.encode(images), self.decoder, labels)


def _stem(input_size: tuple[int, int, int], convs, norm: str, factory: dict) -> tuple[nn.Sequential, tuple]:
    """The convolutions, each followed by its activation and norm, and the ``(h, w)`` of their last map."""
    channels, height, width = input_size
    layers: list[nn.Module] = []
    for out_channels, kernel, stride in convs:
        height, width = (conv_output_size(s, kernel, stride, 0) for s in (height, width))
        if min(height, width) < 1:
            raise ArgumentError(
                f"input_size {input_size} is too small for the convolutions {tuple(convs)} "
                f"((channels, kernel, stride), no padding)"
            )
        layers.append(nn.Conv2d(channels, out_channels, kernel, stride, **factory))
        if norm == "batch":
            layers += [nn.ReLU(), nn.BatchNorm2d(out_channels, eps=_KERAS_EPS, **factory)]
        else:
            layers += [nn.LeakyReLU(0.3), nn.InstanceNorm2d(out_channels, eps=_KERAS_EPS, affine=True, **factory)]
        channels = out_channels
    return nn.Sequential(*layers), (height, width)


def _keras_normal_(weight: Tensor, fan: float) -> None:
    """Keras's truncated normal of variance ``2 / fan``: standard deviation ``sqrt(2 / fan) / 0.8796``, truncated
    at two of them. ``fan`` the fan-in: He normal; fan-in plus fan-out: Glorot normal."""
    std = math.sqrt(2.0 / fan) / 0.87962566103423978
    nn.init.trunc_normal_(weight, 0.0, std, -2.0 * std, 2.0 * std)


@register_model("efficient_capsnet")
def efficient_capsnet(
    *,
    num_classes: PositiveInt = 10,
    input_size: ImageSize = (1, 28, 28),
    routing: Routing = "self_attention",
    reconstruction: bool = True,
    device: Device | None = None,
    dtype: DType | None = None,
) -> EfficientCapsNet:
    """The paper's MNIST model (161,824 parameters without the decoder, 1,573,168 with it)."""
    return EfficientCapsNet(
        input_size=input_size,
        num_classes=num_classes,
        routing=routing,
        decoder="fully_connected" if flag("reconstruction", reconstruction) else None,
        device=device,
        dtype=dtype,
    )


@register_model("efficient_capsnet_smallnorb")
def efficient_capsnet_smallnorb(
    *,
    num_classes: PositiveInt = 5,
    input_size: ImageSize = (1, 32, 32),
    routing: Routing = "self_attention",
    reconstruction: bool = True,
    device: Device | None = None,
    dtype: DType | None = None,
) -> EfficientCapsNet:
    """The paper's smallNORB model: 7x7 stride-2 stem, instance norm, convolutional decoder (143,952 parameters
    without the decoder on 32x32 grey images, 151,664 on the authors' 48x48 stereo pairs)."""
    return EfficientCapsNet(
        input_size=input_size,
        num_classes=num_classes,
        convs=SMALLNORB_CONVS,
        norm="instance",
        routing=routing,
        decoder="convolutional" if flag("reconstruction", reconstruction) else None,
        device=device,
        dtype=dtype,
    )
