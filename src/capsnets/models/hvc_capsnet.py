"""Byerly et al.'s branching and merging CNN with homogeneous vector capsules: capsules with no routing.

Byerly, Kalganova & Dear (2021), "No Routing Needed Between Capsules", Neurocomputing 463 (arXiv:2001.09136),
Sec. 3-4 (MNIST: 99.83% for one model, 99.87% for an ensemble), and the authors' code (AdamByerly/BMCNNwHFCs,
``python/models/SmallImageBranchingMerging.py``, with the settings of ``python/run_experiments.py``): nine
unpadded 3x3 convolutions of ``32, 48, ..., 160`` channels (``filters`` growing by ``growth``), each with batch
normalisation (a learned offset, no scale, epsilon 1e-3) and a ReLU. After the convolutions of ``branches``
(3, 6 and 9), the map's channels at each position form one capsule of ``D`` components (64, 112 and 160: the
code's ``hvc_dims``, equal to those convolutions' channels), and
:class:`~capsnets.layers.HomogeneousVectorCapsules` makes one class capsule per class from them; a class's logit
in a branch is its capsule's length. The branches' logits are merged with equal weights (the code's merge
strategy 0): each branch's logits are batch-normalised (an offset per branch), then summed over the branches.
Trained with cross-entropy on the logits.

Deviations: no reconstruction decoder (the code's reconstruction loss weighs 0.0005); the normalisations' running
statistics follow PyTorch's momentum (0.1), not the code's decay of 0.9997; no exponential moving average of the
weights for evaluation.

Dimension legend: ``B`` batch, ``K`` classes, ``D`` capsule dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from capsnets.layers import HomogeneousVectorCapsules, OffsetBatchNorm
from capsnets.models.classifier import Classifier
from capsnets.models.output import ModelOutput
from capsnets.models.registry import register_model
from capsnets.validation import (
    ArgumentError,
    Device,
    DType,
    ImageSize,
    PositiveInt,
    conv_output_size,
    image_batch,
    image_size,
    non_negative_int,
    placement,
    positive_int,
)


class HVCCapsNet(Classifier):
    """Byerly et al.'s MNIST network with homogeneous vector capsules (module docstring).

    Args:
        input_size: ``(C, H, W)``; each side at least ``2 * convolutions + 1``.
        num_classes: classes ``K``.
        convolutions: the unpadded 3x3 convolutions (the code's 9).
        filters, growth: the first convolution's channels and how many each next one adds (32 and 16).
        branches: the convolutions (1-based) after which a branch of capsules reads the map (3, 6, 9).

    Shape:
        images ``(B, C, H, W)`` -> :class:`ModelOutput` with ``scores`` ``(B, K)`` (logits) and ``capsules``
        ``(B, K, D)`` (the last branch's class capsules).

    Examples::

        >>> model = HVCCapsNet()
        >>> out = model(torch.rand(2, 1, 28, 28))
        >>> out.scores.shape, out.capsules.shape, out.score_kind
        (torch.Size([2, 10]), torch.Size([2, 10, 160]), 'logits')
    """

    default_loss = "cross_entropy"
    #: The class layer: every branch's class capsules (a ``ModuleDict`` by the convolution each branch reads).
    classifier_name = "branches"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 28, 28),
        num_classes: int = 10,
        convolutions: int = 9,
        filters: int = 32,
        growth: int = 16,
        branches: Sequence[int] = (3, 6, 9),
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        self.num_classes = positive_int("num_classes", num_classes)
        convolutions, filters = positive_int("convolutions", convolutions), positive_int("filters", filters)
        growth = non_negative_int("growth", growth)
        self.branch_after = tuple(sorted({positive_int("branches", b) for b in branches}))
        if not self.branch_after or self.branch_after[-1] > convolutions:
            raise ArgumentError(
                f"branches={list(branches)!r} is invalid: expected a non-empty list of convolutions from 1 to "
                f"{convolutions}, after which a branch reads the map",
                "branches",
            )
        device, dtype = placement(device, dtype)
        factory = {"device": device, "dtype": dtype}
        height, width = self.input_size[1:]
        self.convs, self.branches = nn.ModuleList(), nn.ModuleDict()
        in_channels = self.input_size[0]
        for index in range(1, convolutions + 1):
            channels = filters + growth * (index - 1)
            self.convs.append(
                nn.Sequential(
                    nn.Conv2d(in_channels, channels, 3, bias=False, **factory),
                    OffsetBatchNorm(channels, **factory),
                    nn.ReLU(),
                )
            )
            height, width = conv_output_size(height, 3, 1, 0), conv_output_size(width, 3, 1, 0)
            if height < 1 or width < 1:
                raise ArgumentError(
                    f"input_size={list(self.input_size)!r} is too small for {convolutions} unpadded 3x3 "
                    f"convolutions: each side must be at least {2 * convolutions + 1}",
                    "input_size",
                )
            if index in self.branch_after:
                self.branches[str(index)] = HomogeneousVectorCapsules(height * width, channels, num_classes, **factory)
            in_channels = channels
        self.merge = OffsetBatchNorm(len(self.branch_after), **factory)  # the branches' logits, equal weights

    def forward_features(self, images: Tensor) -> dict[str, Tensor]:
        """What the class layer (:meth:`get_classifier`, the branches' class capsules) takes: each branch's
        capsules, one per position of the map it reads, for ``images`` (a non-empty batch, as :meth:`forward`
        takes it); ``get_classifier()[key]`` makes the class capsules of ``features[key]``.

        Shape:
            images ``(B, C, H, W)`` -> ``{str(n): (B, h_n * w_n, C_n)}`` for each convolution ``n`` a branch
            reads, ``C_n`` its channels.

        Examples::

            >>> model = HVCCapsNet()
            >>> features = model.forward_features(torch.rand(2, 1, 28, 28))
            >>> {key: tuple(capsules.shape) for key, capsules in features.items()}
            {'3': (2, 484, 64), '6': (2, 256, 112), '9': (2, 100, 160)}
            >>> model.get_classifier()["9"](features["9"]).shape
            torch.Size([2, 10, 160])
        """
        dtype = self.convs[0][0].weight.dtype
        x = image_batch(images, self.input_size, dtype=dtype, owner=type(self).__name__)
        features = {}
        for index, conv in enumerate(self.convs, start=1):
            x = conv(x)
            if index in self.branch_after:
                features[str(index)] = x.permute(0, 2, 3, 1).flatten(1, 2)  # (B, h*w, C): one capsule per position
        return features

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        """Class scores of ``images`` (a non-empty batch: :func:`~capsnets.validation.image_batch`); ``labels``
        are unused."""
        capsules = [self.branches[key](children) for key, children in self.forward_features(images).items()]
        logits = torch.stack([branch.norm(dim=-1) for branch in capsules], 1)  # (B, branches, K)
        return ModelOutput(self.merge(logits).sum(1), "logits", capsules[-1])  # (B, K), the last branch's (B, K, C)

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, num_classes={self.num_classes}, branches={self.branch_after}"


@register_model("hvc_capsnet", recipe={"lr": 1e-3, "lr_decay": 0.98})
def hvc_capsnet(
    *,
    num_classes: PositiveInt = 10,
    input_size: ImageSize = (1, 28, 28),
    device: Device | None = None,
    dtype: DType | None = None,
) -> HVCCapsNet:
    """Byerly et al. (2021), MNIST: branches of homogeneous vector capsules after convolutions 3, 6 and 9, no
    routing (see :class:`HVCCapsNet`); trains with the code's Adam 1e-3 decayed by 0.98 per epoch."""
    return HVCCapsNet(input_size=input_size, num_classes=num_classes, device=device, dtype=dtype)
