"""A router zoo: one convolutional backbone, one head chosen by name, so that the head is the only difference.

Hahn, Pyeon & Kim (2019), "Self-Routing Capsule Networks", NeurIPS, Sec. 4 (smallNORB: capsule layers appended to
a 7-layer CNN, compared with CNN heads), and the authors' code (coder3000/SR-CapsNet, ``models/convnet.py``,
``ConvNet``, with its defaults ``planes=16``, ``num_caps=32``, ``caps_size=16``, ``depth=1``). The backbone: six
3x3 convolutions (no bias) of ``w, 2w, 2w, 4w, 4w, 8w`` channels with strides ``1, 2, 1, 2, 1, 2``, each with
batch norm and ReLU (a 4x4 map for 32x32 images). The heads (``head``):

- capsule heads: a 3x3 convolution and batch norm make ``capsule_types`` primary capsules of ``capsule_dim`` at
  every position, then class capsules of ``capsule_dim`` by one routing: ``"dynamic"``
  (:class:`~capsnets.functional.DynamicRouting`), ``"self_attention"`` (Mazzia et al. 2021), ``"uniform"``,
  ``"inverted_attention"`` (Tsai et al. 2020: classes read from the poses by a linear layer shared by the
  classes, the code's ``final_fc``), ``"self_routing"`` (Hahn et al. 2019), each through
  :class:`~capsnets.layers.LinearCapsules`, and ``"em"`` (Hinton et al. 2018: the primary capsules as 4x4
  pose matrices with activations, class capsules by :class:`~capsnets.layers.ConvMatrixCapsules` whose kernel
  covers the whole map, as the code's ``EmRouting2d``). Vector primary capsules are squashed; those of ``"em"``
  and ``"self_routing"`` have activations of their own, ``sigmoid(BN(conv))``, as in the code. ``"heinsen"``
  (Heinsen 2019, "An Algorithm for Routing Capsules in All Domains": the primary capsules as 4x4 poses with
  scores ``BN(conv)``, logits, routed to the classes by :class:`~capsnets.layers.HeinsenCapsules`) and
  ``"hvc"`` (Byerly, Kalganova & Dear 2021, "No Routing Needed Between Capsules": no routing; class capsules
  by :class:`~capsnets.layers.HomogeneousVectorCapsules`, each class's logit its capsule's length).
- CNN heads: ``"avg_pool"`` and ``"max_pool"`` (pooling over the map, then a linear layer) and
  ``"fully_connected"`` (a 3x3 convolution to ``capsule_types * capsule_dim`` channels, batch norm, ReLU, then
  a linear layer over the whole map).

Each head has the loss its paper trains it with (``model.default_loss``): the margin loss on capsule lengths
(dynamic, self-attention, uniform), the spread loss on activations (EM), cross-entropy on logits (the CNN
heads, inverted attention, self-routing, whose logits are the log class activations: the paper's NLL loss,
Heinsen's routing, whose class scores are logits, and homogeneous vector capsules, whose lengths are).
Convolutions and linear layers start as the code's ``weights_init`` (Kaiming uniform); the vector class
capsules' transformations normal with standard deviation 0.1, as the code's dynamic routing head. With the
defaults and 5 classes, the dynamic, EM, pooling and fully connected heads have the parameter counts of the
code's (1,389,872; 812,410; 144,309; 775,477). Deviation: the code's self-routing class layer has activations
only; here its class capsules also have poses of ``capsule_dim`` (655,360 more parameters), as every vector head's.

Dimension legend: ``B`` batch, ``F`` backbone channels (``8w``), ``h``/``w`` its map, ``T`` capsule types,
``D`` capsule dim, ``K`` classes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from capsnets.functional import (
    DynamicRouting,
    EMRouting,
    HeinsenRouting,
    InvertedAttentionRouting,
    SelfAttentionRouting,
    SelfRouting,
    UniformRouting,
    as_routing,
    capsule_length,
    routing_config,
    squash,
)
from capsnets.layers import (
    ConvMatrixCapsules,
    HeinsenCapsules,
    HomogeneousVectorCapsules,
    LinearCapsules,
    MatrixCapsules,
)
from capsnets.models.classifier import Classifier
from capsnets.models.output import ModelOutput
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
    image_batch,
    image_size,
    placement,
    positive_int,
)

#: The routings of the capsule heads, by head name.
ROUTINGS = {
    "dynamic": DynamicRouting,
    "em": EMRouting,
    "self_attention": SelfAttentionRouting,
    "inverted_attention": InvertedAttentionRouting,
    "self_routing": SelfRouting,
    "uniform": UniformRouting,
    "heinsen": HeinsenRouting,
}
#: The capsule heads: one per routing, and homogeneous vector capsules, which do not route.
CAPSULE_HEADS = (*ROUTINGS, "hvc")
#: Every head: the capsule heads, then the CNN heads.
HEADS = (*CAPSULE_HEADS, "avg_pool", "max_pool", "fully_connected")
#: The loss each head is trained with (``model.default_loss``).
HEAD_LOSSES = {
    "dynamic": "margin",
    "self_attention": "margin",
    "uniform": "margin",
    "em": "spread",
    "inverted_attention": "cross_entropy",
    "self_routing": "cross_entropy",
    "heinsen": "cross_entropy",
    "hvc": "cross_entropy",
    "avg_pool": "cross_entropy",
    "max_pool": "cross_entropy",
    "fully_connected": "cross_entropy",
}


def _conv_bn(in_channels: int, out_channels: int, factory: dict, stride: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False, **factory),
        nn.BatchNorm2d(out_channels, **factory),
    ]


class ConvBackbone(nn.Module):
    """Hahn et al.'s 6-convolution backbone: 3x3 convolutions of ``w, 2w, 2w, 4w, 4w, 8w`` channels, strides
    ``1, 2, 1, 2, 1, 2``, padding 1, each followed by batch norm and ReLU.

    Shape:
        ``(B, C, H, W) -> (B, 8w, h, w)``, each side ``ceil(S / 8)``.

    Examples::

        >>> ConvBackbone(1, 16)(torch.rand(2, 1, 32, 32)).shape
        torch.Size([2, 128, 4, 4])
    """

    def __init__(self, in_channels: int, width: int, *, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        widths = [width * m for m in (1, 2, 2, 4, 4, 8)]
        layers: list[nn.Module] = []
        for index, out_channels in enumerate(widths):
            layers += [*_conv_bn(in_channels, out_channels, factory, stride=1 + index % 2), nn.ReLU()]
            in_channels = out_channels
        self.layers = nn.Sequential(*layers)
        self.out_channels = widths[-1]

    @staticmethod
    def output_grid(height: int, width: int) -> tuple[int, int]:
        """The ``(h, w)`` of the output map for an ``H x W`` input."""
        for _ in range(3):
            height, width = (conv_output_size(s, 3, 2, 1) for s in (height, width))
        return height, width

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class CapsuleHead(nn.Module):
    """Primary capsules on the backbone's map -> class capsules by one routing (see the module docstring).

    Args:
        in_channels: channels ``F`` of the map; grid: its ``(h, w)``.
        num_classes: class capsules ``K``.
        kind: one of :data:`CAPSULE_HEADS`.
        capsule_types, capsule_dim: primary capsule types ``T`` and the dim ``D`` of every capsule (a square for
            ``"em"`` and ``"heinsen"``: their poses are ``sqrt(D) x sqrt(D)`` matrices).
        routing: the routing object, of the type ``routing`` names (its defaults where this is None).

    Shape:
        ``(B, F, h, w)`` -> :class:`ModelOutput` with ``scores`` ``(B, K)`` and ``capsules`` ``(B, K, D)``.
    """

    def __init__(
        self,
        in_channels: int,
        grid: tuple[int, int],
        num_classes: int,
        kind: str,
        *,
        capsule_types: int = 32,
        capsule_dim: int = 16,
        routing=None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.kind, self.types, self.dim = kind, capsule_types, capsule_dim
        factory = {"device": device, "dtype": dtype}
        if routing is None and kind in ROUTINGS:
            routing = ROUTINGS[kind]()
        self.pose = nn.Sequential(*_conv_bn(in_channels, capsule_types * capsule_dim, factory))
        self.activation = None
        if kind in ("em", "self_routing"):
            self.activation = nn.Sequential(*_conv_bn(in_channels, capsule_types, factory), nn.Sigmoid())
        elif kind == "heinsen":  # scores are logits: the routing applies the sigmoid
            self.activation = nn.Sequential(*_conv_bn(in_channels, capsule_types, factory))
        side = math.isqrt(capsule_dim)
        if kind in ("em", "heinsen") and (side * side != capsule_dim or (kind == "em" and grid[0] != grid[1])):
            raise ArgumentError(
                f"head {kind!r} needs a square capsule_dim (4x4 poses: 16){' and a square map' if kind == 'em' else ''}; "
                f"got capsule_dim={capsule_dim} and a {grid[0]}x{grid[1]} map"
            )
        children = capsule_types * grid[0] * grid[1]
        if kind == "em":
            self.class_capsules = ConvMatrixCapsules(
                capsule_types, num_classes, kernel_size=grid[0], pose_size=side, routing=routing, **factory
            )
        elif kind == "heinsen":
            self.class_capsules = HeinsenCapsules(children, num_classes, side, side, side, routing=routing, **factory)
        elif kind == "hvc":
            self.class_capsules = HomogeneousVectorCapsules(children, capsule_dim, num_classes, **factory)
        else:
            self.class_capsules = LinearCapsules(
                children,
                capsule_dim,
                num_classes,
                capsule_dim,
                routing=routing,
                init_std=0.1,
                **factory,
            )
        self.score = nn.Linear(capsule_dim, 1, **factory) if kind == "inverted_attention" else None

    def forward(self, features: Tensor) -> ModelOutput:
        return self.classify(self.forward_features(features))

    def forward_features(self, features: Tensor) -> Tensor | MatrixCapsules | tuple[Tensor, Tensor]:
        """The primary capsules of the backbone's map ``(B, F, h, w)``, as ``class_capsules`` takes them
        (``N = T * h * w`` capsules, ordered type, row, column): ``(B, N, D)`` squashed (``"dynamic"``,
        ``"self_attention"``, ``"uniform"``, ``"inverted_attention"``) or not (``"hvc"``); for ``"self_routing"``
        ``(poses, activations)``, ``(B, N, D)`` and ``(B, N)``, which its routing takes
        (``routing(predictions(poses), poses=poses, activations=activations)``); for ``"heinsen"``
        ``(scores, poses)``, ``(B, N)`` logits and ``(B, N, P, P)``; for ``"em"`` a
        :class:`~capsnets.layers.MatrixCapsules` of ``T`` types on the ``h x w`` map (``P x P`` poses)."""
        batch, _, height, width = features.shape
        pose = self.pose(features).view(batch, self.types, self.dim, height, width)  # (B, T, D, h, w)
        side = math.isqrt(self.dim)
        if self.kind == "em":
            pose = pose.view(batch, self.types, side, side, height, width).permute(0, 1, 4, 5, 2, 3)  # (B,T,h,w,P,P)
            return MatrixCapsules(pose, self.activation(features))
        pose = pose.permute(0, 1, 3, 4, 2).reshape(batch, -1, self.dim)  # (B, T*h*w, D)
        if self.kind == "heinsen":
            return self.activation(features).flatten(1), pose.view(batch, -1, side, side)
        if self.kind == "self_routing":  # the children's activations are their own, not their lengths
            return pose, self.activation(features).flatten(1)  # (B, T*h*w), ordered as the poses
        return pose if self.kind == "hvc" else squash(pose)

    def classify(self, children: Tensor | MatrixCapsules | tuple[Tensor, Tensor]) -> ModelOutput:
        """The class scores and capsules from the primary capsules (:meth:`forward_features`)."""
        if self.kind == "em":
            classes = self.class_capsules(children)  # (B, K, 1, 1, P, P)
            return ModelOutput(classes.activation.flatten(1), "activation", classes.pose.flatten(2))
        if self.kind == "heinsen":
            out = self.class_capsules(*children)
            return ModelOutput(out.scores, "logits", out.mu.flatten(2))  # (B, K) logits, (B, K, D)
        if self.kind == "hvc":
            capsules = self.class_capsules(children)  # (B, K, D), no routing
            return ModelOutput(capsule_length(capsules), "logits", capsules)
        if self.kind == "self_routing":
            pose, active = children
            capsules = self.class_capsules.routing(
                self.class_capsules.predictions(pose), poses=pose, activations=active
            )
            logits = torch.log(capsule_length(capsules).clamp_min(torch.finfo(capsules.dtype).tiny))
            return ModelOutput(logits, "logits", capsules)  # (B, K): the log class activations
        capsules = self.class_capsules(children)  # (B, K, D)
        if self.score is not None:
            return ModelOutput(self.score(capsules).squeeze(-1), "logits", capsules)
        return ModelOutput(capsule_length(capsules), "length", capsules)


class CNNHead(nn.Module):
    """A CNN head: ``"avg_pool"``/``"max_pool"`` (pool the map, a linear layer) or ``"fully_connected"`` (a 3x3
    convolution to ``hidden_channels``, batch norm, ReLU, a linear layer over the map).

    Shape:
        ``(B, F, h, w)`` -> :class:`ModelOutput` with ``scores`` ``(B, K)`` (logits).
    """

    def __init__(
        self,
        in_channels: int,
        grid: tuple[int, int],
        num_classes: int,
        kind: str,
        *,
        hidden_channels: int = 512,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        if kind == "fully_connected":
            self.features = nn.Sequential(*_conv_bn(in_channels, hidden_channels, factory), nn.ReLU(), nn.Flatten())
            fan_in = hidden_channels * grid[0] * grid[1]
        else:
            pool = nn.AdaptiveAvgPool2d(1) if kind == "avg_pool" else nn.AdaptiveMaxPool2d(1)
            self.features, fan_in = nn.Sequential(pool, nn.Flatten()), in_channels
        self.linear = nn.Linear(fan_in, num_classes, **factory)

    def forward(self, features: Tensor) -> ModelOutput:
        return ModelOutput(self.linear(self.forward_features(features)), "logits")

    def forward_features(self, features: Tensor) -> Tensor:
        """What ``linear`` takes: the pooled map ``(B, F)``, or the flattened convolution ``(B, hidden * h * w)``
        (``"fully_connected"``)."""
        return self.features(features)


class RoutingZoo(Classifier):
    """One backbone (:class:`ConvBackbone`) and one head by name (module docstring).

    Args:
        input_size: ``(C, H, W)``.
        num_classes: classes ``K``.
        head: one of :data:`HEADS`.
        width: the backbone's first width ``w`` (the code's ``planes``).
        capsule_types, capsule_dim: primary capsules per position and the dim of every capsule; the
            ``"fully_connected"`` head's convolution has ``capsule_types * capsule_dim`` channels.
        routing: the capsule head's routing: an object of the head's type, its spec, or its settings alone
            (``{"iterations": 2}``); None: the routing of ``head`` with its defaults. The CNN heads take none.

    Shape:
        images ``(B, C, H, W)`` -> :class:`ModelOutput` with ``scores`` ``(B, K)``: capsule lengths, activations
        (``"em"``) or logits (``score_kind`` says which); ``capsules`` ``(B, K, D)`` for capsule heads.

    Examples::

        >>> model = RoutingZoo(head="self_routing")
        >>> out = model(torch.rand(2, 1, 32, 32))
        >>> out.scores.shape, out.capsules.shape, model.default_loss
        (torch.Size([2, 5]), torch.Size([2, 5, 16]), 'cross_entropy')
        >>> RoutingZoo(head="em", input_size=(1, 28, 28), num_classes=10)(torch.rand(2, 1, 28, 28)).scores.shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 32, 32),
        num_classes: int = 5,
        head: str = "dynamic",
        width: int = 16,
        capsule_types: int = 32,
        capsule_dim: int = 16,
        routing=None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        choice("head", head, HEADS)
        self.num_classes = positive_int("num_classes", num_classes)
        self.head_name, self.default_loss = head, HEAD_LOSSES[head]
        routing = _head_routing(head, routing)
        self.routing_spec = None if routing is None else routing_config(routing, strict=False)
        device, dtype = placement(device, dtype)
        factory = {"device": device, "dtype": dtype}
        self.backbone = _init_as_hahn(ConvBackbone(self.input_size[0], positive_int("width", width), **factory))
        grid = ConvBackbone.output_grid(*self.input_size[1:])
        capsule_types = positive_int("capsule_types", capsule_types)
        capsule_dim = positive_int("capsule_dim", capsule_dim)
        if head in CAPSULE_HEADS:  # built after the backbone is initialised: one seed, one backbone for every head
            self.head = CapsuleHead(
                self.backbone.out_channels,
                grid,
                num_classes,
                head,
                capsule_types=capsule_types,
                capsule_dim=capsule_dim,
                routing=routing,
                **factory,
            )
        else:
            self.head = CNNHead(
                self.backbone.out_channels,
                grid,
                num_classes,
                head,
                hidden_channels=capsule_types * capsule_dim,
                **factory,
            )
        _init_as_hahn(self.head)

    @property
    def classifier_name(self) -> str:
        """The head's class layer: ``head.class_capsules`` for a capsule head, ``head.linear`` for a CNN head."""
        return "head.class_capsules" if isinstance(self.head, CapsuleHead) else "head.linear"

    def forward_features(self, images: Tensor) -> Tensor | MatrixCapsules | tuple[Tensor, Tensor]:
        """What the head's class layer (:meth:`get_classifier`) takes for ``images`` (as :meth:`forward` takes
        them), by head.

        Shape:
            images ``(B, C, H, W)`` -> for the capsule heads, the primary capsules on the backbone's ``h x w`` map
            (:meth:`CapsuleHead.forward_features`: ``(B, T * h * w, D)``; ``(poses, activations)`` for
            ``"self_routing"``, ``(scores, poses)`` for ``"heinsen"``, a :class:`~capsnets.layers.MatrixCapsules`
            for ``"em"``); for the CNN heads, ``(B, F)`` pooled (``"avg_pool"``, ``"max_pool"``) or
            ``(B, T * D * h * w)`` (``"fully_connected"``).

        Examples::

            >>> model = RoutingZoo(head="dynamic")
            >>> capsules = model.forward_features(torch.rand(2, 1, 32, 32))
            >>> capsules.shape, model.get_classifier()(capsules).shape
            (torch.Size([2, 512, 16]), torch.Size([2, 5, 16]))
        """
        return self.head.forward_features(self.backbone(self._images(images)))

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        """Class scores of ``images`` (a non-empty batch; uint8 images are scaled to ``[0, 1]``, floating-point ones
        cast to the parameters' dtype: :func:`~capsnets.validation.image_batch`); ``labels`` are unused."""
        return self.head(self.backbone(self._images(images)))  # (B, F, h, w) -> scores (B, K)

    def _images(self, images: Tensor) -> Tensor:
        dtype = self.backbone.layers[0].weight.dtype
        return image_batch(images, self.input_size, dtype=dtype, owner=type(self).__name__)

    def extra_repr(self) -> str:
        return f"head={self.head_name!r}, input_size={self.input_size}, num_classes={self.num_classes}"


def _head_routing(head: str, routing):
    """The routing object of a capsule ``head`` from ``routing`` (an object, its spec, its settings alone, or
    None); None for a head that does not route (the CNN heads and ``"hvc"``)."""
    if head not in ROUTINGS:
        if routing is not None:
            raise ArgumentError(
                f"routing={routing!r} is for the routing heads ({', '.join(map(repr, ROUTINGS))}); "
                f"head {head!r} has no routing: leave it out",
                "routing",
            )
        return None
    if isinstance(routing, Mapping) and "type" not in routing:
        routing = {"type": head, **routing}
    routing = as_routing(routing, ROUTINGS[head], types=(head,))
    return routing


@torch.no_grad()
def _init_as_hahn(module: nn.Module) -> nn.Module:
    """``module`` with the code's ``weights_init``: Kaiming uniform (gain sqrt(2)) for convolutions and linear
    layers."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_uniform_(layer.weight)
    return module


@register_model("routing_zoo")
def routing_zoo(
    *,
    head: Literal[
        "dynamic",
        "em",
        "self_attention",
        "inverted_attention",
        "self_routing",
        "uniform",
        "heinsen",
        "hvc",
        "avg_pool",
        "max_pool",
        "fully_connected",
    ] = "dynamic",
    num_classes: PositiveInt = 5,
    input_size: ImageSize = (1, 32, 32),
    width: PositiveInt = 16,
    capsule_types: PositiveInt = 32,
    capsule_dim: PositiveInt = 16,
    routing: Routing | None = None,
    device: Device | None = None,
    dtype: DType | None = None,
) -> RoutingZoo:
    """Hahn et al.'s smallNORB comparison: one backbone, the head by name (``head``: a routing or a CNN head);
    ``routing``: the capsule head's routing settings (None: its defaults; see :class:`RoutingZoo`)."""
    return RoutingZoo(
        input_size=input_size,
        num_classes=num_classes,
        head=head,
        width=width,
        capsule_types=capsule_types,
        capsule_dim=capsule_dim,
        routing=routing,
        device=device,
        dtype=dtype,
    )
