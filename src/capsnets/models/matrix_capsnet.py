"""Matrix capsules with EM routing (Hinton, Sabour & Frosst 2018, ICLR, Sec. 4 and Fig. 1).

ReLU Conv1 (5x5, stride 2, A channels) -> PrimaryCaps (1x1, B types) -> ConvCaps1 (K=3, stride 2, C types)
-> ConvCaps2 (K=3, stride 1, D types) -> class capsules (shared W, coordinate addition), EM routing in
the last three layers. Registered variants:

- ``matrix_capsnet``: A=B=C=D=32 (316,394 parameters for 5 classes, 319,020 for 10);
- ``matrix_capsnet_small``: A=64, B=8, C=D=16 (67,154 parameters for 5 classes).

Inputs of 32x32 (smallNORB crops) use no padding in Conv1; smaller inputs (28x28 MNIST) get padding 2,
which gives the same 14x14 -> 6x6 -> 4x4 grids (SPEC). Class scores are the class capsule activations.
``detach_routing=True`` computes the assignments of the non-final EM iterations without gradient
(about 2.5x faster training on a CPU; see :func:`capsnets.functional.em_routing`).
``cost_normalization`` and ``inverse_temperature`` configure the default :class:`EMRouting` of all three
routed layers (like ``detach_routing``, they are unused when a ``routing`` object is passed);
``cost_normalization="mean_std", inverse_temperature=1.0`` (a deviation) learns much faster per step on
MNIST than the paper's cost (``benchmarks/em_learning.py``). ``assignment_scope="all_parents"`` normalises
each child's assignments over all the parents of the overlapping receptive fields in ConvCaps1 and ConvCaps2
(Gritzman 2019; :mod:`capsnets.functional.child_groups`) instead of per output position.
``class_routing_args`` gives the class capsule layer settings of its own (e.g. ``{"cost_normalization":
"mean_std", "inverse_temperature": 1.0}`` with the paper's routing below it: the layer where the
standardised cost's gain comes from, ``benchmarks/README.md``).
Deviation: the paper gives neither the initialisation nor the inverse-temperature schedule; see
:mod:`capsnets.layers.matrix` and :mod:`capsnets.functional.em_routing` for the ones used.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from capsnets.layers._checks import positive_int
from capsnets.layers.matrix import ClassMatrixCapsules, ConvMatrixCapsules, PrimaryMatrixCapsules
from capsnets.models.output import ModelOutput
from capsnets.models.registry import register_model


def _em_routing(iterations: int, routing, detach_routing: bool = False, cost_normalization=None,
                inverse_temperature=None):
    if routing is not None:  # a routing object carries its own settings (as in the vector CapsNet builders)
        return routing
    from capsnets.functional import EMRouting

    return EMRouting(iterations, inverse_temperature, detach_assignments=detach_routing,
                     cost_normalization=cost_normalization)


def _class_routing(class_routing_args, routing, **shared):
    """The class capsule layer's own :class:`EMRouting`: the builder's ``shared`` routing arguments
    (``routing_iterations``, ``detach_routing``, ``cost_normalization``, ``inverse_temperature``) overridden
    by ``class_routing_args``; None when that is None."""
    if class_routing_args is None:
        return None
    if routing is not None:
        raise ValueError("class_routing_args configures the default EMRouting; with a routing object, build "
                         "MatrixCapsNet(routing=..., class_routing=...) instead")
    if not isinstance(class_routing_args, dict) or set(class_routing_args) - set(shared):
        raise ValueError(f"class_routing_args must be a dict with keys from {sorted(shared)}, got "
                         f"{class_routing_args!r}")
    merged = {**shared, **class_routing_args}
    return _em_routing(merged.pop("routing_iterations"), None, **merged)


class MatrixCapsNet(nn.Module):
    """The EM-routing capsule network.

    Args:
        input_size: ``(C, H, W)``.
        num_classes: class capsules (the paper's E).
        conv_channels: A, channels of the ReLU convolution.
        primary_types: B, primary capsule types.
        conv_caps1_types: C, types of the first convolutional capsule layer.
        conv_caps2_types: D, types of the second.
        conv_padding: padding of Conv1; None: 2 for inputs smaller than 32 px, else 0.
        routing: routing callable shared by the three capsule layers (default ``EMRouting(3)``).
        class_routing: the class capsule layer's routing instead of ``routing`` (None: ``routing``).
        coordinate_addition: coordinate addition in the class capsules.
        checkpoint_chunks: activation checkpointing of the convolutional capsule layers in this many
            chunks (0: off); trades about one extra forward of votes and routing for memory.
        assignment_scope: ``"position"`` or ``"all_parents"``, for the two convolutional capsule layers
            (see :class:`~capsnets.layers.ConvMatrixCapsules`).

    Shape:
        images ``(B, C, H, W)`` -> :class:`ModelOutput` with ``scores`` = class activations ``(B, E)``
        and ``capsules`` = class poses flattened ``(B, E, 16)``.
    """

    default_loss = "spread"

    def __init__(self, *, input_size: Sequence[int] = (1, 32, 32), num_classes: int = 5, conv_channels: int = 32,
                 primary_types: int = 32, conv_caps1_types: int = 32, conv_caps2_types: int = 32,
                 conv_padding: int | None = None, routing=None, class_routing=None, coordinate_addition: bool = True,
                 pose_size: int = 4, checkpoint_chunks: int = 0, assignment_scope: str = "position",
                 device=None, dtype=None) -> None:
        super().__init__()
        if len(tuple(input_size)) != 3:
            raise ValueError(f"input_size must be (C, H, W), got {input_size!r}")
        self.input_size = tuple(int(s) for s in input_size)
        self.num_classes = positive_int("num_classes", num_classes)
        if conv_padding is None:
            conv_padding = 2 if min(self.input_size[1:]) < 32 else 0
        routing = routing if routing is not None else _em_routing(3, None)
        factory = {"device": device, "dtype": dtype, "pose_size": pose_size}
        self.conv = nn.Conv2d(self.input_size[0], conv_channels, 5, stride=2, padding=conv_padding,
                              device=device, dtype=dtype)
        self.primary = PrimaryMatrixCapsules(conv_channels, primary_types, **factory)
        conv_caps = {"routing": routing, "checkpoint_chunks": checkpoint_chunks, "assignment_scope": assignment_scope,
                     **factory}
        self.conv_caps1 = ConvMatrixCapsules(primary_types, conv_caps1_types, kernel_size=3, stride=2, **conv_caps)
        self.conv_caps2 = ConvMatrixCapsules(conv_caps1_types, conv_caps2_types, kernel_size=3, stride=1, **conv_caps)
        self.classes = ClassMatrixCapsules(conv_caps2_types, num_classes,
                                           routing=class_routing if class_routing is not None else routing,
                                           coordinate_addition=coordinate_addition, **factory)
        self._check_grid()

    def _check_grid(self) -> None:
        size = [(s + 2 * self.conv.padding[0] - 5) // 2 + 1 for s in self.input_size[1:]]
        size = [(s - 3) // 2 + 1 for s in size]
        size = [s - 2 for s in size]
        if min(size) < 1:
            raise ValueError(f"input_size {self.input_size} is too small for Conv1 (5x5/2), ConvCaps1 (3x3/2) and "
                             f"ConvCaps2 (3x3/1); use at least 28x28")

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        if images.dim() != 4 or tuple(images.shape[1:]) != self.input_size:
            raise ValueError(f"MatrixCapsNet expects images of shape (B, {', '.join(map(str, self.input_size))}), "
                             f"got {tuple(images.shape)}; set input_size when creating the model")
        caps = self.primary(torch.relu(self.conv(images)))  # (B, A, 14, 14) -> B types on 14x14
        caps = self.conv_caps2(self.conv_caps1(caps))  # C types on 6x6 -> D types on 4x4
        classes = self.classes(caps)  # (B, E, 1, 1, 4, 4)
        activation = classes.activation.flatten(1)  # (B, E)
        poses = classes.pose.reshape(images.shape[0], self.num_classes, -1)  # (B, E, 16)
        return ModelOutput(activation, "activation", poses)


def _build(num_classes, input_size, routing_iterations, routing, detach_routing, cost_normalization,
           inverse_temperature, coordinate_addition, checkpoint_chunks, assignment_scope, class_routing_args, device,
           dtype, **widths):
    class_routing = _class_routing(class_routing_args, routing, routing_iterations=routing_iterations,
                                   detach_routing=detach_routing, cost_normalization=cost_normalization,
                                   inverse_temperature=inverse_temperature)
    routing = _em_routing(routing_iterations, routing, detach_routing, cost_normalization, inverse_temperature)
    return MatrixCapsNet(input_size=input_size, num_classes=num_classes, routing=routing, class_routing=class_routing,
                         coordinate_addition=coordinate_addition, checkpoint_chunks=checkpoint_chunks,
                         assignment_scope=assignment_scope, device=device, dtype=dtype, **widths)


@register_model("matrix_capsnet")
def matrix_capsnet(*, num_classes=5, input_size=(1, 32, 32), routing_iterations=3, routing=None,
                   detach_routing=False, cost_normalization=None, inverse_temperature=None,
                   coordinate_addition=True, checkpoint_chunks=0, assignment_scope="position",
                   class_routing_args=None, device=None, dtype=None) -> MatrixCapsNet:
    """The paper's smallNORB model: A=B=C=D=32 (about 310K parameters)."""
    return _build(num_classes, input_size, routing_iterations, routing, detach_routing, cost_normalization,
                  inverse_temperature, coordinate_addition, checkpoint_chunks, assignment_scope, class_routing_args,
                  device, dtype, conv_channels=32, primary_types=32, conv_caps1_types=32, conv_caps2_types=32)


@register_model("matrix_capsnet_small")
def matrix_capsnet_small(*, num_classes=5, input_size=(1, 32, 32), routing_iterations=3, routing=None,
                         detach_routing=False, cost_normalization=None, inverse_temperature=None,
                         coordinate_addition=True, checkpoint_chunks=0, assignment_scope="position",
                         class_routing_args=None, device=None, dtype=None) -> MatrixCapsNet:
    """The paper's small model: A=64, B=8, C=D=16 (about 68K parameters)."""
    return _build(num_classes, input_size, routing_iterations, routing, detach_routing, cost_normalization,
                  inverse_temperature, coordinate_addition, checkpoint_chunks, assignment_scope, class_routing_args,
                  device, dtype, conv_channels=64, primary_types=8, conv_caps1_types=16, conv_caps2_types=16)
