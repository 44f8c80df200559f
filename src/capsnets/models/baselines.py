"""CNN baselines the papers compare capsules with.

- ``cnn_baseline``: Sabour, Frosst & Hinton (2017), Sec. 5. Three 5x5 stride-1 convolutions of 256, 256
  and 128 channels ("same" padding, ReLU, no pooling), then fully connected layers of 328 and 192 units
  (ReLU, dropout on the second) into a softmax: 35,445,522 parameters for 28x28 inputs, the paper's 35.4M.
- ``cnn_smallnorb``: Hinton, Sabour & Frosst (2018), Sec. 5, the smallNORB baseline: two 5x5
  convolutions of 32 and 64 channels, each followed by 2x2 max pooling, then 1024 hidden units with
  dropout: 4,252,549 parameters for 32x32 inputs and 5 classes, the paper's 4.2M.
- ``cnn_baseline_narrow`` / ``cnn_smallnorb_narrow``: the same designs narrowed for CPU smoke runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from capsnets.models.classifier import Classifier
from capsnets.models.output import ModelOutput
from capsnets.models.registry import register_model
from capsnets.validation import (
    ArgumentError,
    Device,
    DType,
    ImageSize,
    PositiveInt,
    Probability,
    image_batch,
    image_size,
    number,
    placement,
    positive_int,
)


class BaselineCNN(Classifier):
    """Plain CNN classifier returning logits in :class:`ModelOutput`.

    Args:
        input_size: ``(C, H, W)``.
        num_classes: output classes.
        channels: convolution widths.
        kernel_size: convolution kernel (odd; padded to keep the size).
        hidden: fully connected widths.
        dropout: dropout probability before the last hidden layer's output.

    Shape:
        images ``(B, C, H, W)`` -> ``scores`` ``(B, num_classes)`` (logits).

    Examples::

        >>> BaselineCNN(channels=(16, 16, 8), hidden=(64, 32))(torch.rand(2, 1, 28, 28)).scores.shape
        torch.Size([2, 10])
    """

    default_loss = "cross_entropy"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 28, 28),
        num_classes: int = 10,
        channels: Sequence[int] = (256, 256, 128),
        kernel_size: int = 5,
        hidden: Sequence[int] = (328, 192),
        dropout: float = 0.5,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        if positive_int("kernel_size", kernel_size) % 2 != 1:
            raise ArgumentError(f"kernel_size must be odd to keep the image size, got {kernel_size}", "kernel_size")
        dropout = number("dropout", dropout, 0.0, 1.0, high_open=True)
        self.num_classes = positive_int("num_classes", num_classes)
        device, dtype = placement(device, dtype)
        factory = {"device": device, "dtype": dtype}
        convs: list[nn.Module] = []
        in_ch = self.input_size[0]
        for out_ch in channels:
            convs += [nn.Conv2d(in_ch, out_ch, kernel_size, padding=kernel_size // 2, **factory), nn.ReLU(inplace=True)]
            in_ch = out_ch
        self.features = nn.Sequential(*convs)
        sizes = [in_ch * self.input_size[1] * self.input_size[2], *hidden]
        fcs: list[nn.Module] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            fcs += [nn.Linear(fan_in, fan_out, **factory), nn.ReLU(inplace=True)]
        fcs += [nn.Dropout(dropout), nn.Linear(sizes[-1], num_classes, **factory)]
        self.classifier = nn.Sequential(*fcs)

    @property
    def classifier_name(self) -> str:
        """The last linear layer, ``classifier.<last>``."""
        return f"classifier.{len(self.classifier) - 1}"

    def forward_features(self, images: Tensor) -> Tensor:
        """What the last linear layer (:meth:`get_classifier`) takes: the last hidden layer's output for
        ``images`` (as :meth:`forward` takes them), after its dropout.

        Shape:
            images ``(B, C, H, W)`` -> ``(B, hidden[-1])``.

        Examples::

            >>> BaselineCNN(channels=(16, 16, 8), hidden=(64, 32)).forward_features(torch.rand(2, 1, 28, 28)).shape
            torch.Size([2, 32])
        """
        images = image_batch(images, self.input_size, dtype=self.classifier[-1].weight.dtype, owner="BaselineCNN")
        return self.classifier[:-1](self.features(images).flatten(1))

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        """Logits of ``images`` (a non-empty batch; uint8 images are scaled to ``[0, 1]``, floating-point ones cast
        to the parameters' dtype: :func:`~capsnets.validation.image_batch`)."""
        images = image_batch(images, self.input_size, dtype=self.classifier[-1].weight.dtype, owner="BaselineCNN")
        return ModelOutput(self.classifier(self.features(images).flatten(1)), "logits")


class SmallNorbCNN(Classifier):
    """Two conv + max-pool stages and one hidden layer (the EM paper's smallNORB baseline).

    Args:
        input_size: ``(C, H, W)`` with ``H`` and ``W`` divisible by 4.
        num_classes: output classes.
        channels: widths of the two 5x5 convolutions.
        hidden: width of the hidden layer.
        dropout: dropout probability after the hidden layer.

    Shape:
        images ``(B, C, H, W)`` -> ``scores`` ``(B, num_classes)`` (logits).

    Examples::

        >>> SmallNorbCNN(channels=(8, 16), hidden=64)(torch.rand(2, 1, 32, 32)).scores.shape
        torch.Size([2, 5])
    """

    default_loss = "cross_entropy"
    #: The last linear layer.
    classifier_name = "classifier.3"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 32, 32),
        num_classes: int = 5,
        channels: Sequence[int] = (32, 64),
        hidden: int = 1024,
        dropout: float = 0.5,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        if self.input_size[1] % 4 or self.input_size[2] % 4:
            raise ArgumentError(
                f"input_size must be (C, H, W) with H and W divisible by 4, got {input_size!r}", "input_size"
            )
        dropout = number("dropout", dropout, 0.0, 1.0, high_open=True)
        self.num_classes = positive_int("num_classes", num_classes)
        device, dtype = placement(device, dtype)
        factory = {"device": device, "dtype": dtype}
        c, h, w = self.input_size
        self.features = nn.Sequential(
            nn.Conv2d(c, channels[0], 5, padding=2, **factory),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels[0], channels[1], 5, padding=2, **factory),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(channels[1] * (h // 4) * (w // 4), hidden, **factory),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes, **factory),
        )

    def forward_features(self, images: Tensor) -> Tensor:
        """What the last linear layer (:meth:`get_classifier`) takes: the hidden layer's output for ``images`` (as
        :meth:`forward` takes them), after its dropout.

        Shape:
            images ``(B, C, H, W)`` -> ``(B, hidden)``.

        Examples::

            >>> SmallNorbCNN(channels=(8, 16), hidden=64).forward_features(torch.rand(2, 1, 32, 32)).shape
            torch.Size([2, 64])
        """
        images = image_batch(images, self.input_size, dtype=self.classifier[-1].weight.dtype, owner="SmallNorbCNN")
        return self.classifier[:-1](self.features(images).flatten(1))

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        """Logits of ``images`` (as :meth:`BaselineCNN.forward` takes them)."""
        images = image_batch(images, self.input_size, dtype=self.classifier[-1].weight.dtype, owner="SmallNorbCNN")
        return ModelOutput(self.classifier(self.features(images).flatten(1)), "logits")  # (B, num_classes)


@register_model("cnn_baseline")
def cnn_baseline(
    *,
    num_classes: PositiveInt = 10,
    input_size: ImageSize = (1, 28, 28),
    dropout: Probability = 0.5,
    device: Device | None = None,
    dtype: DType | None = None,
) -> BaselineCNN:
    """The paper's baseline CNN (35.4M parameters on 28x28)."""
    return BaselineCNN(input_size=input_size, num_classes=num_classes, dropout=dropout, device=device, dtype=dtype)


@register_model("cnn_baseline_narrow")
def cnn_baseline_narrow(
    *,
    num_classes: PositiveInt = 10,
    input_size: ImageSize = (1, 28, 28),
    dropout: Probability = 0.5,
    device: Device | None = None,
    dtype: DType | None = None,
) -> BaselineCNN:
    """``cnn_baseline`` narrowed for CPU smoke runs: 16/16/8 channels, 64/32 hidden units."""
    return BaselineCNN(
        input_size=input_size,
        num_classes=num_classes,
        channels=(16, 16, 8),
        hidden=(64, 32),
        dropout=dropout,
        device=device,
        dtype=dtype,
    )


@register_model("cnn_smallnorb")
def cnn_smallnorb(
    *,
    num_classes: PositiveInt = 5,
    input_size: ImageSize = (1, 32, 32),
    dropout: Probability = 0.5,
    device: Device | None = None,
    dtype: DType | None = None,
) -> SmallNorbCNN:
    """The EM paper's smallNORB baseline CNN (4.2M parameters)."""
    return SmallNorbCNN(input_size=input_size, num_classes=num_classes, dropout=dropout, device=device, dtype=dtype)


@register_model("cnn_smallnorb_narrow")
def cnn_smallnorb_narrow(
    *,
    num_classes: PositiveInt = 5,
    input_size: ImageSize = (1, 32, 32),
    dropout: Probability = 0.5,
    device: Device | None = None,
    dtype: DType | None = None,
) -> SmallNorbCNN:
    """``cnn_smallnorb`` narrowed to 8/16 channels and 64 hidden units (69K parameters, about
    ``matrix_capsnet_small``'s 67K)."""
    return SmallNorbCNN(
        input_size=input_size,
        num_classes=num_classes,
        channels=(8, 16),
        hidden=64,
        dropout=dropout,
        device=device,
        dtype=dtype,
    )
