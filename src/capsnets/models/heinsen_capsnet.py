"""Heinsen's capsule classifier: a small convolutional stem, part capsules, and two layers of Heinsen's routing.

Heinsen (2019), "An Algorithm for Routing Capsules in All Domains", arXiv:1911.00792, Sec. 4.1 (smallNORB), and
the author's code (glassroom/heinsen_routing_2019_paper, ``models.py``, ``SmallNORBClassifier``, built there with
``n_parts=64, d_chns=64``): two coordinate channels are appended to the image; six 3x3 convolutions of
``channels`` each (strides 1, 2, 1, 2, 1, 2), each preceded by batch normalisation and followed by Swish (SiLU);
at every position of the map, ``parts`` part capsules, each with a score (batch norm and a 1x1 convolution; a
logit) and a 4x4 pose (the same, ``16 parts`` channels); Heinsen's routing
(:class:`~capsnets.layers.HeinsenCapsules`) from every part capsule to ``parts`` capsules, with weights shared
by the positions, then from those to the classes (both with the one ``routing`` the model is given: a
:class:`~capsnets.functional.HeinsenRouting`, its spec or ``"heinsen"``, e.g. ``{"type": "heinsen", "iterations":
2}``). The class scores are logits; the paper trains with cross-entropy. Convolutions start as the code's (Kaiming
normal, zero biases).

Deviation: the convolutions are padded by 1 (the code's are not, on 96x96 images), so that 32x32 images keep a
4x4 map of parts rather than a single position.

Dimension legend: ``B`` batch, ``P`` parts, ``K`` classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from capsnets.functional import as_routing, routing_config
from capsnets.layers import HeinsenCapsules
from capsnets.models.classifier import Classifier
from capsnets.models.output import ModelOutput
from capsnets.models.registry import register_model
from capsnets.validation import (
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


class HeinsenCapsNet(Classifier):
    """Heinsen's smallNORB classifier (module docstring).

    Args:
        input_size: ``(C, H, W)``.
        num_classes: classes ``K``.
        parts: part capsule types per position, and capsules of the middle layer ``P`` (the code's 64).
        channels: the convolutions' channels (the code's 64).
        routing: the routing of both capsule layers: a :class:`~capsnets.functional.HeinsenRouting`, its spec or
            ``"heinsen"`` (the author's 3 iterations); each layer learns its own net benefits.

    Shape:
        images ``(B, C, H, W)`` -> :class:`ModelOutput` with ``scores`` ``(B, K)`` (logits) and ``capsules``
        ``(B, K, 16)`` (the class poses' means).

    Examples::

        >>> model = HeinsenCapsNet()
        >>> out = model(torch.rand(2, 1, 32, 32))
        >>> out.scores.shape, out.capsules.shape, out.score_kind
        (torch.Size([2, 5]), torch.Size([2, 5, 16]), 'logits')
    """

    default_loss = "cross_entropy"
    #: The class layer: Heinsen's routing from the middle layer's capsules to the classes.
    classifier_name = "route_classes"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 32, 32),
        num_classes: int = 5,
        parts: int = 64,
        channels: int = 64,
        routing="heinsen",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        self.num_classes = positive_int("num_classes", num_classes)
        parts, channels = positive_int("parts", parts), positive_int("channels", channels)
        routing = as_routing(routing, None, types=("heinsen",))
        self.routing_spec = routing_config(routing, strict=False)
        device, dtype = placement(device, dtype)
        factory = {"device": device, "dtype": dtype}
        layers: list[nn.Module] = []
        in_channels = self.input_size[0] + 2  # the image and its two coordinate channels
        for stride in (1, 2) * 3:
            layers += [
                nn.BatchNorm2d(in_channels, **factory),
                nn.Conv2d(in_channels, channels, 3, stride, 1, **factory),
            ]
            layers.append(nn.SiLU())
            in_channels = channels
        self.convolve = nn.Sequential(*layers)
        self.part_scores = nn.Sequential(nn.BatchNorm2d(channels, **factory), nn.Conv2d(channels, parts, 1, **factory))
        self.part_poses = nn.Sequential(
            nn.BatchNorm2d(channels, **factory), nn.Conv2d(channels, parts * 16, 1, **factory)
        )
        self.route_parts = HeinsenCapsules(None, parts, 4, 4, 4, routing=routing, **factory)
        self.route_classes = HeinsenCapsules(parts, num_classes, 4, 4, 4, routing=routing, **factory)
        with torch.no_grad():
            for conv in (m for m in self.convolve if isinstance(m, nn.Conv2d)):
                nn.init.kaiming_normal_(conv.weight)
                nn.init.zeros_(conv.bias)

    def forward_features(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """What the class layer (:meth:`get_classifier`, ``route_classes``) routes: the scores and poses of the
        middle layer's ``P`` capsules for ``images`` (a non-empty batch, as :meth:`forward` takes it), in the
        order the class layer takes them.

        Shape:
            images ``(B, C, H, W)`` -> ``(scores, poses)``: ``(B, P)`` logits and ``(B, P, 4, 4)``.

        Examples::

            >>> model = HeinsenCapsNet()
            >>> scores, poses = model.forward_features(torch.rand(2, 1, 32, 32))
            >>> scores.shape, poses.shape, model.get_classifier()(scores, poses).scores.shape
            (torch.Size([2, 64]), torch.Size([2, 64, 4, 4]), torch.Size([2, 5]))
        """
        dtype = self.part_poses[1].weight.dtype
        x = image_batch(images, self.input_size, dtype=dtype, owner=type(self).__name__)
        batch, _, height, width = x.shape
        rows = torch.linspace(-1.0, 1.0, height, device=x.device, dtype=dtype).view(1, 1, height, 1)
        cols = torch.linspace(-1.0, 1.0, width, device=x.device, dtype=dtype).view(1, 1, 1, width)
        grid = torch.cat((rows.expand(batch, 1, height, width), cols.expand(batch, 1, height, width)), 1)
        x = self.convolve(torch.cat((x, grid), 1))  # (B, channels, h, w)
        scores = self.part_scores(x).flatten(1)  # (B, P*h*w), ordered part, row, column
        poses = self.part_poses(x)  # (B, P*16, h, w)
        poses = poses.view(batch, -1, 4, 4, *poses.shape[-2:]).permute(0, 1, 4, 5, 2, 3).reshape(batch, -1, 4, 4)
        parts = self.route_parts(scores, poses)
        return parts.scores, parts.mu

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        """Class scores of ``images`` (a non-empty batch: :func:`~capsnets.validation.image_batch`); ``labels``
        are unused."""
        classes = self.route_classes(*self.forward_features(images))
        return ModelOutput(classes.scores, "logits", classes.mu.flatten(2))

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, num_classes={self.num_classes}"


@register_model("heinsen_capsnet")
def heinsen_capsnet(
    *,
    num_classes: PositiveInt = 5,
    input_size: ImageSize = (1, 32, 32),
    parts: PositiveInt = 64,
    channels: PositiveInt = 64,
    routing: Routing = "heinsen",
    device: Device | None = None,
    dtype: DType | None = None,
) -> HeinsenCapsNet:
    """Heinsen's smallNORB classifier (2019): part capsules routed to ``parts`` capsules, then to the classes, by
    his routing (see :class:`HeinsenCapsNet`)."""
    return HeinsenCapsNet(
        input_size=input_size,
        num_classes=num_classes,
        parts=parts,
        channels=channels,
        routing=routing,
        device=device,
        dtype=dtype,
    )
