"""Matrix capsules with EM routing (Hinton, Sabour & Frosst 2018, ICLR, Sec. 4 and Fig. 1).

ReLU Conv1 (5x5, stride 2, A channels) -> PrimaryCaps (1x1, B types) -> ConvCaps1 (K=3, stride 2, C types)
-> ConvCaps2 (K=3, stride 1, D types) -> class capsules (shared W, coordinate addition), EM routing in
the last three layers. Registered variants:

- ``matrix_capsnet``: A=B=C=D=32 (316,394 parameters for 5 classes; 315,850 with the official formulation, whose
  primary capsules have no biases);
- ``matrix_capsnet_small``: A=64, B=8, C=D=16 (67,154 for 5 classes; 67,018).

Two formulations (the ``formulation`` of the routing, ``docs/em_formulations.md`` compares them line by line):

- ``"official"``: the authors' released code (google-research/google-research,
  ``capsule_em``): its EM equations (:meth:`capsnets.functional.EMRouting.official`), per-type
  normalisation of the assignments in the convolutional capsule layers (``assignment_scope="per_type"``),
  its initialisation (truncated normals; ``beta_a``, ``beta_v`` 0.5 / 0.5 in the convolutional and 1 / 2
  in the class capsule layer), primary capsules without biases and with ``sigmoid(x - 1)`` activations,
  and coordinate addition of the receptive-field centres in pixels / 100 (column, then row).
- ``"paper"`` (the default): Procedure 1 as printed, with this library's choices where the text is silent: the
  inverse temperature of :func:`~capsnets.functional.em_inverse_temperatures` in every layer, pose
  weights started at the identity plus noise (``capsnets.layers.matrix.POSE_INIT_NOISE``), ``beta`` at 0,
  coordinates ``(r + 0.5) / H``; it alone takes the deviations ``cost_normalization`` and ``inverse_temperature``.

Inputs of 32x32 (smallNORB crops) use no padding in Conv1; smaller inputs (28x28 MNIST) get padding 2,
which gives the same 14x14 -> 6x6 -> 4x4 grids. Class scores are the class capsule activations.
The networks and their builders take one argument for the routing, ``routing``: an EM spec, e.g.
``{"type": "em", "iterations": 2, "formulation": "official", "detach_routing": True}`` (``detach_routing``: the
assignments of the non-final iterations without gradient, a cheaper backward), whose ``"class_layer"`` key changes
settings of the class capsule layer's routing only, e.g. ``{"type": "em", "iterations": 3, "class_layer":
{"iterations": 1}}``; settings a spec leaves out take its formulation's defaults per layer (the released code's
for ``"official"``: :func:`~capsnets.functional.layerwise_em_routing`). An
:class:`~capsnets.functional.EMRouting` routes every layer; a
:class:`~capsnets.functional.LayerwiseEMRouting` the convolutional and class layers apart. The
routing's formulation (that of the convolutional layers) chooses the rest of the network's formulation.
Deviation in both formulations: the released code's convolutional routing groups a child's copies as if every
layer had stride 1, which in ConvCaps1 (stride 2) mixes different children; here the copies are grouped by the
layer's real stride.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Literal

import torch
from torch import Tensor, nn

from capsnets.functional import layerwise_em_routing, routing_config
from capsnets.layers.matrix import (
    ASSIGNMENT_SCOPES,
    ClassMatrixCapsules,
    ConvMatrixCapsules,
    MatrixCapsules,
    PrimaryMatrixCapsules,
)
from capsnets.models.classifier import Classifier
from capsnets.models.output import ModelOutput
from capsnets.models.registry import register_model
from capsnets.validation import (
    ArgumentError,
    Device,
    DType,
    ImageSize,
    NonNegativeInt,
    PositiveInt,
    Routing,
    choice,
    flag,
    image_batch,
    image_size,
    non_negative_int,
    placement,
    positive_int,
)

#: The routing of the networks and their builders by default: the paper's formulation with 2 EM iterations, the
#: setting that learns fastest on MNIST in both formulations (``docs/results/em-recipes.md``); the paper's 3
#: iterations are ``routing="em"``.
DEFAULT_ROUTING: Mapping[str, object] = MappingProxyType({"type": "em", "iterations": 2})
#: The networks' training recipe (:func:`~capsnets.models.training_recipe`), after yl-1993/Matrix-Capsules-EM-PyTorch's
#: (``train.py``, ``loss/spread_loss.py``: Adam with weight decay 2e-7, no shifts, the spread loss's margin from 0.2
#: to 0.9 over 10 epochs), with the learning rate annealed along a cosine over the run from 6e-3, so that a run of
#: any length ends annealed (``docs/results/em-recipes.md``). ``lr_decay`` is yl-1993's 0.96 per 20,000 steps at
#: MNIST's 1,875 steps an epoch, for a run that picks the exponential schedule (one trained to a target, with no
#: planned length).
RECIPE: Mapping[str, object] = MappingProxyType(
    {
        "lr": 6e-3,
        "lr_schedule": "cosine",
        "lr_decay": 0.996,
        "weight_decay": 2e-7,
        "max_shift": 0,
        "loss": "spread",
        "loss_args": {"margin_start": 0.2, "margin_end": 0.9, "ramp_epochs": 10},
    }
)

#: The images the network takes through its capsule layers at a time in inference on the CPU (a larger batch is split
#: and the results joined): the patches, votes and assignments of 16 images stay within a core's cache, where those
#: of 32 or more do not (``docs/results/em-kernel/report.md``). Each image's capsules are computed alone either way.
CPU_IMAGES_AT_A_TIME = 16


def _trunc_normal_(tensor: Tensor, std: float) -> None:
    """Normal with standard deviation ``std`` truncated at two of them (TensorFlow's truncated normal)."""
    nn.init.trunc_normal_(tensor, 0.0, std, -2.0 * std, 2.0 * std)


def receptive_field_centres(size: int, layers: Sequence[tuple[int, int, int]]) -> Tensor:
    """Centre of each output position's receptive field after ``layers`` of ``(kernel, stride, padding)``, in
    input pixels counted from ``-size // 2`` (the released code's position grid, before its ``/ 100``).

    Shape:
        ``(S,)`` for the output length ``S`` of the last layer.

    Examples::

        >>> receptive_field_centres(32, [(5, 2, 0), (3, 2, 0), (3, 1, 0)]).tolist()  # Conv1, ConvCaps1, ConvCaps2
        [-8.0, -4.0, 0.0, 4.0]
    """
    offset, step, length = float((-size) // 2), 1.0, size  # centre(o) = offset + step * o
    for kernel, stride, padding in layers:
        offset, step = offset + step * (kernel - 1 - 2 * padding) / 2.0, step * stride
        length = (length + 2 * padding - kernel) // stride + 1
    return offset + step * torch.arange(length, dtype=torch.float64)


class MatrixCapsNet(Classifier):
    """The EM-routing capsule network.

    Args:
        input_size: ``(C, H, W)``.
        num_classes: class capsules (the paper's E).
        conv_channels: A, channels of the ReLU convolution.
        primary_types: B, primary capsule types.
        conv_caps1_types: C, types of the first convolutional capsule layer.
        conv_caps2_types: D, types of the second.
        conv_padding: padding of Conv1; None: 2 for inputs smaller than 32 px, else 0.
        routing: the EM routing of the three capsule layers (module docstring): an EM spec, whose
            ``"class_layer"`` holds the settings of the class capsule layer that differ, and whose settings left out
            take the defaults of its ``formulation`` per layer (the released code's for ``"official"``); ``"em"``
            (3 iterations); an :class:`~capsnets.functional.EMRouting` for every layer; or a
            :class:`~capsnets.functional.LayerwiseEMRouting`. By default the paper's formulation
            with 2 iterations. Its formulation, ``"paper"`` or ``"official"``, also chooses the initialisation,
            the primary capsules and the coordinate addition (module docstring).
        coordinate_addition: coordinate addition in the class capsules.
        checkpoint_chunks: activation checkpointing of the convolutional capsule layers in this many
            chunks (0: off); trades about one extra forward of votes and routing for memory.
        assignment_scope: ``"position"``, ``"all_parents"`` or ``"per_type"``, for the two convolutional
            capsule layers (see :class:`~capsnets.layers.ConvMatrixCapsules`); None: ``"per_type"`` with the
            official formulation, else ``"position"``.

    Shape:
        images ``(B, C, H, W)`` -> :class:`ModelOutput` with ``scores`` = class activations ``(B, E)``
        and ``capsules`` = class poses flattened ``(B, E, 16)``.

    Examples::

        >>> model = MatrixCapsNet(conv_channels=64, primary_types=8, conv_caps1_types=16, conv_caps2_types=16)
        >>> model(torch.rand(2, 1, 32, 32)).scores.shape
        torch.Size([2, 5])
        >>> paper = MatrixCapsNet(routing=EMRouting(2, detach_routing=True))
        >>> official = MatrixCapsNet(routing={"type": "em", "iterations": 2, "formulation": "official"})
        >>> official.formulation, official.class_capsules.routing == EMRouting.official(2, layer="class")
        ('official', True)
        >>> spec = {"type": "em", "iterations": 3, "class_layer": {"iterations": 1}}
        >>> MatrixCapsNet(routing=spec).class_capsules.routing.iterations
        1
    """

    default_loss = "spread"

    def __init__(
        self,
        *,
        input_size: Sequence[int] = (1, 32, 32),
        num_classes: int = 5,
        conv_channels: int = 32,
        primary_types: int = 32,
        conv_caps1_types: int = 32,
        conv_caps2_types: int = 32,
        conv_padding: int | None = None,
        routing=DEFAULT_ROUTING,
        coordinate_addition: bool = True,
        pose_size: int = 4,
        checkpoint_chunks: int = 0,
        assignment_scope: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.input_size = image_size("input_size", input_size)
        self.num_classes = positive_int("num_classes", num_classes)
        if conv_padding is None:
            conv_padding = 2 if min(self.input_size[1:]) < 32 else 0
        routing = layerwise_em_routing(routing)
        self.routing_spec = routing_config(routing, strict=False)
        self.formulation = routing.formulation
        official = self.formulation == "official"
        if assignment_scope is None:
            assignment_scope = "per_type" if official else "position"
        choice("assignment_scope", assignment_scope, ASSIGNMENT_SCOPES)
        flag("coordinate_addition", coordinate_addition)
        non_negative_int("checkpoint_chunks", checkpoint_chunks)
        device, dtype = placement(device, dtype)
        factory = {"device": device, "dtype": dtype, "pose_size": pose_size}
        self.conv = nn.Conv2d(
            self.input_size[0], conv_channels, 5, stride=2, padding=conv_padding, device=device, dtype=dtype
        )
        self.primary = PrimaryMatrixCapsules(
            conv_channels, primary_types, bias=not official, activation_offset=-1.0 if official else 0.0, **factory
        )
        conv_caps = {
            "routing": routing.conv,
            "checkpoint_chunks": checkpoint_chunks,
            "assignment_scope": assignment_scope,
            **factory,
        }
        self.conv_caps1 = ConvMatrixCapsules(primary_types, conv_caps1_types, kernel_size=3, stride=2, **conv_caps)
        self.conv_caps2 = ConvMatrixCapsules(conv_caps1_types, conv_caps2_types, kernel_size=3, stride=1, **conv_caps)
        self._check_grid()
        coordinates = self._official_coordinates() if official else None
        self.class_capsules = ClassMatrixCapsules(
            conv_caps2_types,
            num_classes,
            routing=routing.class_layer,
            coordinate_addition=coordinate_addition,
            coordinates=coordinates,
            **factory,
        )
        if official:
            self._official_init()

    def _layer_geometry(self) -> list[tuple[int, int, int]]:
        """``(kernel, stride, padding)`` of Conv1, ConvCaps1 and ConvCaps2 (PrimaryCaps is 1x1)."""
        return [(5, 2, self.conv.padding[0])] + [
            (layer.kernel_size, layer.stride, layer.padding) for layer in (self.conv_caps1, self.conv_caps2)
        ]

    def _official_coordinates(self) -> Tensor:
        """The released code's coordinate addition (``simple_model.conv_pos``, ``connector_capsule_mat``):
        the receptive-field centre of each ConvCaps2 position in input pixels / 100, the column into the
        first pose entry and the row into the second. ``(H, W, 2)``."""
        rows = receptive_field_centres(self.input_size[1], self._layer_geometry()) / 100.0
        cols = receptive_field_centres(self.input_size[2], self._layer_geometry()) / 100.0
        grid_rows, grid_cols = torch.meshgrid(rows, cols, indexing="ij")
        return torch.stack([grid_cols, grid_rows], dim=-1).to(torch.get_default_dtype())

    @torch.no_grad()
    def _official_init(self) -> None:
        """The released code's initialisation (``capsule_em``: ``utils.weight_variable`` draws truncated
        normals): Conv1 std 0.05 with biases 0.1; primary poses std 0.5 and activations std 3.0; convolutional
        capsule weights std 0.3 with ``beta_a = beta_v = 0.5``; class weights std 0.01 with ``beta_a = 1``
        and ``beta_v = 2``."""
        _trunc_normal_(self.conv.weight, 0.05)
        self.conv.bias.fill_(0.1)
        _trunc_normal_(self.primary.pose.weight, 0.5)
        _trunc_normal_(self.primary.activation.weight, 3.0)
        for layer in (self.conv_caps1, self.conv_caps2):
            _trunc_normal_(layer.weight, 0.3)
            layer.beta_a.fill_(0.5)
            layer.beta_v.fill_(0.5)
        _trunc_normal_(self.class_capsules.weight, 0.01)
        self.class_capsules.beta_a.fill_(1.0)
        self.class_capsules.beta_v.fill_(2.0)

    def _check_grid(self) -> None:
        size = [(s + 2 * self.conv.padding[0] - 5) // 2 + 1 for s in self.input_size[1:]]
        size = [(s - 3) // 2 + 1 for s in size]
        size = [s - 2 for s in size]
        if min(size) < 1:
            raise ArgumentError(
                f"input_size {self.input_size} is too small for Conv1 (5x5/2), ConvCaps1 (3x3/2) and "
                f"ConvCaps2 (3x3/1); use at least 28x28"
            )

    def conv_capsules(self, images: Tensor) -> MatrixCapsules:
        """The capsules of ConvCaps2 for ``images`` (a non-empty batch; uint8 images are scaled to ``[0, 1]``,
        floating-point ones cast to the parameters' dtype: :func:`~capsnets.validation.image_batch`): the children
        the class capsule layer routes, ``(B, D, h, w)`` of them. In inference on the CPU (without gradients, outside a
        compiled or exported graph), a batch of more than ``CPU_IMAGES_AT_A_TIME`` images goes through in slices
        of that many."""
        images = image_batch(images, self.input_size, dtype=self.conv.weight.dtype, owner="MatrixCapsNet")
        if (
            images.device.type != "cpu"
            or torch.is_grad_enabled()  # training: no faster in slices
            or torch.compiler.is_compiling()  # a traced graph keeps the batch whole (and its size symbolic)
            or images.shape[0] <= CPU_IMAGES_AT_A_TIME
        ):
            return self._conv_capsules(images)
        parts = [self._conv_capsules(chunk) for chunk in images.split(CPU_IMAGES_AT_A_TIME)]
        return MatrixCapsules(torch.cat([p.pose for p in parts]), torch.cat([p.activation for p in parts]))

    def _conv_capsules(self, images: Tensor) -> MatrixCapsules:
        caps = self.primary(torch.relu(self.conv(images)))  # (B, A, 14, 14) -> B types on 14x14
        return self.conv_caps2(self.conv_caps1(caps))  # C types on 6x6 -> D types on 4x4

    def forward_features(self, images: Tensor) -> MatrixCapsules:
        """What the class capsule layer (:meth:`get_classifier`) routes: the capsules of ConvCaps2
        (:meth:`conv_capsules`), poses and activations together.

        Shape:
            images ``(B, C, H, W)`` -> :class:`~capsnets.layers.MatrixCapsules` with ``pose``
            ``(B, D, h, w, P, P)`` and ``activation`` ``(B, D, h, w)``, ``D`` the types of ConvCaps2 on its
            ``h x w`` grid (4x4 for 32x32 images), ``P`` the pose size (4).

        Examples::

            >>> model = capsnets.create_model("matrix_capsnet_small")
            >>> caps = model.forward_features(torch.rand(2, 1, 32, 32))
            >>> caps.pose.shape, model.get_classifier()(caps).activation.shape
            (torch.Size([2, 16, 4, 4, 4, 4]), torch.Size([2, 5, 1, 1]))
        """
        return self.conv_capsules(images)

    def forward(self, images: Tensor, labels: Tensor | None = None) -> ModelOutput:
        """Class activations and poses of ``images`` (as :meth:`conv_capsules` takes them)."""
        classes = self.class_capsules(self.forward_features(images))  # (B, E, 1, 1, 4, 4)
        activation = classes.activation.flatten(1)  # (B, E)
        poses = classes.pose.reshape(classes.batch, self.num_classes, -1)  # (B, E, 16)
        return ModelOutput(activation, "activation", poses)


_WIDTHS = {
    "matrix_capsnet": {"conv_channels": 32, "primary_types": 32, "conv_caps1_types": 32, "conv_caps2_types": 32},
    "matrix_capsnet_small": {"conv_channels": 64, "primary_types": 8, "conv_caps1_types": 16, "conv_caps2_types": 16},
}


@register_model("matrix_capsnet", recipe=RECIPE)
def matrix_capsnet(
    *,
    num_classes: PositiveInt = 5,
    input_size: ImageSize = (1, 32, 32),
    routing: Routing = DEFAULT_ROUTING,
    coordinate_addition: bool = True,
    checkpoint_chunks: NonNegativeInt = 0,
    assignment_scope: Literal["position", "all_parents", "per_type"] | None = None,
    device: Device | None = None,
    dtype: DType | None = None,
) -> MatrixCapsNet:
    """The paper's smallNORB model: A=B=C=D=32 (about 310K parameters)."""
    return MatrixCapsNet(
        **_WIDTHS["matrix_capsnet"],
        num_classes=num_classes,
        input_size=input_size,
        routing=routing,
        coordinate_addition=coordinate_addition,
        checkpoint_chunks=checkpoint_chunks,
        assignment_scope=assignment_scope,
        device=device,
        dtype=dtype,
    )


@register_model("matrix_capsnet_small", recipe=RECIPE)
def matrix_capsnet_small(
    *,
    num_classes: PositiveInt = 5,
    input_size: ImageSize = (1, 32, 32),
    routing: Routing = DEFAULT_ROUTING,
    coordinate_addition: bool = True,
    checkpoint_chunks: NonNegativeInt = 0,
    assignment_scope: Literal["position", "all_parents", "per_type"] | None = None,
    device: Device | None = None,
    dtype: DType | None = None,
) -> MatrixCapsNet:
    """The paper's small model: A=64, B=8, C=D=16 (about 68K parameters)."""
    return MatrixCapsNet(
        **_WIDTHS["matrix_capsnet_small"],
        num_classes=num_classes,
        input_size=input_size,
        routing=routing,
        coordinate_addition=coordinate_addition,
        checkpoint_chunks=checkpoint_chunks,
        assignment_scope=assignment_scope,
        device=device,
        dtype=dtype,
    )
