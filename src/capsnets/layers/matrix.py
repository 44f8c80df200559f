"""Matrix capsule layers (Hinton, Sabour & Frosst 2018, "Matrix capsules with EM routing", Sec. 3-4).

- :class:`MatrixCapsules`: the pose matrices and activations of a grid of capsules, kept together with their
  layout named (instead of ``types * (P*P + 1)`` channels sliced by hand).
- :class:`PrimaryMatrixCapsules`: a 1x1 convolution to ``T`` capsule types, each a 4x4 pose (linear)
  and an activation (sigmoid).
- :class:`ConvMatrixCapsules`: votes ``V = M W`` with one 4x4 ``W`` per (kernel position, child type,
  parent type), shared across positions; the children of each parent are the ``K*K*T`` capsules of its
  receptive field; the routing (e.g. :class:`~capsnets.functional.EMRouting`) is passed in. A child in
  overlapping receptive fields is normalised per position (the default) or over all its parents
  (``assignment_scope="all_parents"``, Gritzman 2019; see :mod:`capsnets.functional.child_groups`).
- :class:`ClassMatrixCapsules`: one ``W`` per (child type, class) shared across positions, with
  coordinate addition: the scaled (row, column) of each child's position, ``(r + 0.5) / H`` and
  ``(c + 0.5) / W``, are added to the first two vote components (the paper leaves the scaling open).

Dimension legend: ``B`` batch, ``T``/``U`` child/parent types, ``K`` kernel, ``P`` pose side (4),
``I``/``J`` children/parents of one routing problem.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from capsnets.functional import EMRouting, as_routing
from capsnets.functional.child_groups import ChildGroups, grid_child_groups
from capsnets.functional.em import kernel as em_kernel
from capsnets.functional.patches import gather_patches, patch_grid, patch_index
from capsnets.functional.products import matrix_votes
from capsnets.validation import ArgumentError, choice, flag, non_negative_int, positive_int

#: How a convolutional capsule layer normalises the assignments of a child seen by several positions.
ASSIGNMENT_SCOPES = ("position", "all_parents", "per_type")
#: The standard deviation of the Gaussian noise added to the identity that starts every pose weight (the paper
#: gives no initialisation): each vote starts close to its child's pose. The value comes from a sweep of MNIST
#: training runs (``docs/results/em-recipes.md``).
POSE_INIT_NOISE = 0.02


@dataclass(frozen=True)
class MatrixCapsules:
    """A grid of matrix capsules.

    Attributes:
        pose: ``(B, T, H, W, P, P)`` pose matrices.
        activation: ``(B, T, H, W)`` presence probabilities in ``[0, 1]``.

    A layer of class capsules (no grid) uses ``H = W = 1``.
    """

    pose: Tensor
    activation: Tensor

    def __post_init__(self) -> None:
        pose, act = self.pose, self.activation
        if pose.dim() != 6 or pose.shape[-1] != pose.shape[-2]:
            raise ArgumentError(f"pose must be (B, T, H, W, P, P), got shape {tuple(pose.shape)}")
        if act.shape != pose.shape[:4]:
            raise ArgumentError(
                f"activation must be (B, T, H, W) = {tuple(pose.shape[:4])} to match the pose, got {tuple(act.shape)}"
            )

    @property
    def batch(self) -> int:
        return self.pose.shape[0]

    @property
    def types(self) -> int:
        return self.pose.shape[1]

    @property
    def grid(self) -> tuple[int, int]:
        return self.pose.shape[2], self.pose.shape[3]

    @property
    def pose_size(self) -> int:
        return self.pose.shape[-1]

    def to(self, *args, **kwargs) -> MatrixCapsules:
        return MatrixCapsules(self.pose.to(*args, **kwargs), self.activation.to(*args, **kwargs))

    def flat(self) -> tuple[Tensor, Tensor]:
        """Every capsule as a row: poses ``(B, T*H*W, P*P)`` and activations ``(B, T*H*W)``."""
        batch = self.batch
        return self.pose.reshape(batch, -1, self.pose_size**2), self.activation.reshape(batch, -1)

    def __repr__(self) -> str:
        b, t, h, w = self.activation.shape
        return f"MatrixCapsules(batch={b}, types={t}, grid={h}x{w}, pose={self.pose_size}x{self.pose_size})"


def _pose_weight(*shape: int, side: int, device, dtype) -> nn.Parameter:
    eye = torch.eye(side, device=device, dtype=dtype)
    return nn.Parameter(eye + POSE_INIT_NOISE * torch.randn(*shape, side, side, device=device, dtype=dtype))


class PrimaryMatrixCapsules(nn.Module):
    """Feature maps -> a grid of matrix capsules.

    Args:
        in_channels: channels of the input feature map.
        num_types: capsule types ``T``.
        pose_size: side ``P`` of the pose matrix (4).
        kernel_size: kernel of the pose and activation convolutions (1 in the paper).
        bias: whether the two convolutions have biases (the authors' released code has none).
        activation_offset: added to the activation logits before the sigmoid (the released code: -1).

    Shape:
        - input: ``(B, in_channels, H, W)``
        - output: :class:`MatrixCapsules` with pose ``(B, T, H, W, P, P)``, activation ``(B, T, H, W)``.

    Examples::

        >>> caps = PrimaryMatrixCapsules(32, 8)(torch.randn(2, 32, 14, 14))
        >>> caps.pose.shape, caps.activation.shape
        (torch.Size([2, 8, 14, 14, 4, 4]), torch.Size([2, 8, 14, 14]))
    """

    def __init__(
        self,
        in_channels: int,
        num_types: int,
        *,
        pose_size: int = 4,
        kernel_size: int = 1,
        bias: bool = True,
        activation_offset: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.in_channels = positive_int("in_channels", in_channels)
        self.num_types = positive_int("num_types", num_types)
        self.pose_size = positive_int("pose_size", pose_size)
        self.kernel_size = positive_int("kernel_size", kernel_size)
        self.activation_offset = float(activation_offset)
        factory = {"device": device, "dtype": dtype, "bias": bool(bias)}
        self.pose = nn.Conv2d(in_channels, num_types * pose_size**2, kernel_size, padding=kernel_size // 2, **factory)
        self.activation = nn.Conv2d(in_channels, num_types, kernel_size, padding=kernel_size // 2, **factory)

    def forward(self, x: Tensor) -> MatrixCapsules:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ArgumentError(f"PrimaryMatrixCapsules expects (B, {self.in_channels}, H, W), got {tuple(x.shape)}")
        batch, _, height, width = x.shape
        side = self.pose_size
        pose = self.pose(x).view(batch, self.num_types, side, side, height, width).permute(0, 1, 4, 5, 2, 3)
        logits = self.activation(x)
        if self.activation_offset:
            logits = logits + self.activation_offset
        return MatrixCapsules(pose, torch.sigmoid(logits))

    def extra_repr(self) -> str:
        offset = f", activation_offset={self.activation_offset}" if self.activation_offset else ""
        return f"in_channels={self.in_channels}, num_types={self.num_types}, pose_size={self.pose_size}{offset}"


class ConvMatrixCapsules(nn.Module):
    """Convolutional matrix capsules with routing over each receptive field.

    Args:
        in_types: child capsule types ``T``.
        out_types: parent capsule types ``U``.
        kernel_size, stride, padding: convolution geometry over the capsule grid.
        routing: callable ``(votes (N, I, J, P*P), activations (N, I), beta_v (J,), beta_a (J,)) ->
            (poses (N, J, P*P), activations (N, J))``, or its spec (a dict); None: ``EMRouting()``.
        pose_size: pose side ``P``.
        checkpoint_chunks: if > 0, when training, compute votes and routing in this many chunks of
            output positions under activation checkpointing: backward keeps only the receptive-field
            patches and recomputes one chunk at a time (same values and gradients, less memory, about
            one extra forward of votes and routing).
        assignment_scope: over which parents a child's assignments are normalised when receptive fields
            overlap: ``"position"`` (each output position's routing problem on its own: a child has one set
            of assignments per position that sees it, each summing to 1 over the parent types there),
            ``"all_parents"`` (one set over every parent type at every position that sees it, so parents
            at different positions compete for the child: Gritzman 2019, pitfall 3) or ``"per_type"``
            (for each parent type, one set over the positions that see the child: the authors' released
            code). The last two need a routing that takes ``child_groups``, as
            :class:`~capsnets.functional.EMRouting` does, and ``checkpoint_chunks`` 0, since the positions
            are no longer independent problems.

    Shape:
        - input: :class:`MatrixCapsules` ``(B, T, H, W, P, P)``
        - output: :class:`MatrixCapsules` ``(B, U, H', W', P, P)``; with ``return_couplings``, also the
          assignments ``(B, T, K, K, U, H', W')``: child type, kernel row, kernel column, parent type, output
          position. With ``assignment_scope="position"`` they sum to 1 over ``U``; with ``"all_parents"`` a
          child's assignments sum to 1 over every position that sees it, with ``"per_type"`` for each ``U`` over
          those positions.
        - ``weight``: ``(T, K, K, U, P, P)``; ``beta_v``, ``beta_a``: ``(U,)``

    Examples::

        >>> layer = ConvMatrixCapsules(8, 16, kernel_size=3, stride=2, routing=EMRouting(2))
        >>> parents, assignments = layer(PrimaryMatrixCapsules(32, 8)(torch.randn(2, 32, 14, 14)), return_couplings=True)
        >>> parents.pose.shape, assignments.shape
        (torch.Size([2, 16, 6, 6, 4, 4]), torch.Size([2, 8, 3, 3, 16, 6, 6]))
    """

    def __init__(
        self,
        in_types: int,
        out_types: int,
        *,
        kernel_size: int = 3,
        stride: int = 1,
        padding: int = 0,
        routing=None,
        pose_size: int = 4,
        checkpoint_chunks: int = 0,
        assignment_scope: str = "position",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.in_types = positive_int("in_types", in_types)
        self.out_types = positive_int("out_types", out_types)
        self.checkpoint_chunks = non_negative_int("checkpoint_chunks", checkpoint_chunks)
        self.kernel_size = positive_int("kernel_size", kernel_size)
        self.stride = positive_int("stride", stride)
        self.padding = non_negative_int("padding", padding)
        self.pose_size = positive_int("pose_size", pose_size)
        self.routing = as_routing(routing, EMRouting)
        self.assignment_scope = _check_scope(assignment_scope, self.routing, self.checkpoint_chunks)
        factory = {"device": device, "dtype": dtype}
        self.weight = _pose_weight(in_types, kernel_size, kernel_size, out_types, side=pose_size, **factory)
        self.beta_v = nn.Parameter(torch.zeros(out_types, **factory))
        self.beta_a = nn.Parameter(torch.zeros(out_types, **factory))

    def forward(self, caps: MatrixCapsules, *, return_couplings: bool = False):
        """The parent capsules of ``caps``.

        Args:
            caps: the child capsules.
            return_couplings: also return the routing's final assignments of the children of every receptive field
                to the parent types at its output position (see Shape). A routing other than :class:`EMRouting`
                must then take ``return_assignments=True`` and return them third.

        Returns:
            the parents, or ``(parents, assignments)`` with ``return_couplings``.
        """
        if caps.types != self.in_types or caps.pose_size != self.pose_size:
            raise ArgumentError(
                f"ConvMatrixCapsules expects {self.in_types} types of {self.pose_size}x{self.pose_size} "
                f"poses, got {caps!r}"
            )
        batch, side, kernel = caps.batch, self.pose_size, self.kernel_size
        height, width = caps.grid
        out_h, out_w = patch_grid(height, width, kernel, self.stride, self.padding)
        index = patch_index(caps.types, height, width, kernel, self.stride, self.padding, caps.pose.device)
        # poses (N = B*H'*W', I = T*K*K, P*P) and activations (N, I): a gather each, so that the routing gets
        # contiguous poses; compiled, one gather of both (with a gather each, inductor (torch 2.13) dropped the
        # activations' gradient in a compiled training step)
        pose = caps.pose.reshape(batch, -1, side * side)
        fused = em_kernel.fused_kernel(caps.pose) if isinstance(self.routing, EMRouting) else None
        if torch.compiler.is_compiling():
            feats = torch.cat([pose, caps.activation.reshape(batch, -1, 1)], dim=-1)
            patches = gather_patches(feats, index, self.padding)
            poses, acts = patches[..., :-1], patches[..., -1]
        elif fused is not None:  # the fused kernel routes them: its gathers, whose backward is no index_add
            poses = em_kernel.gather_patches(fused, pose, index)
            acts = em_kernel.gather_patches(fused, caps.activation.reshape(batch, -1), index)
        else:
            poses = gather_patches(pose, index, self.padding)
            acts = gather_patches(caps.activation.reshape(batch, -1), index, self.padding)
        if self.assignment_scope != "position":  # one routing problem over the whole grid
            groups = grid_child_groups(
                batch,
                caps.types,
                height,
                width,
                kernel,
                self.stride,
                self.padding,
                device=poses.device,
                normalize=self.assignment_scope,
            )
            routed = self._route(poses, acts, groups, return_couplings)
        elif self.checkpoint_chunks and torch.is_grad_enabled():
            # Keep only the patches for backward; votes and routing are recomputed chunk by chunk.
            chunks = [
                checkpoint(self._route, p, a, None, return_couplings, use_reentrant=False)
                for p, a in zip(poses.chunk(self.checkpoint_chunks), acts.chunk(self.checkpoint_chunks))
            ]
            routed = [torch.cat(parts) for parts in zip(*chunks)]
        else:
            routed = self._route(poses, acts, None, return_couplings)
        out_pose = routed[0].view(batch, out_h, out_w, self.out_types, side, side).permute(0, 3, 1, 2, 4, 5)
        out_act = routed[1].view(batch, out_h, out_w, self.out_types).permute(0, 3, 1, 2)
        parents = MatrixCapsules(out_pose, out_act)
        if not return_couplings:
            return parents
        # (B*H'*W', T*K*K, U) -> (B, H', W', T, K, K, U) -> (B, T, K, K, U, H', W')
        assignments = routed[2].view(batch, out_h, out_w, caps.types, kernel, kernel, self.out_types)
        return parents, assignments.permute(0, 3, 4, 5, 6, 1, 2)

    def _route(self, poses: Tensor, acts: Tensor, groups: ChildGroups | None = None, assignments: bool = False):
        """Votes and routing for a block of output positions: ``(N, I, P*P), (N, I) -> (N, U, P*P), (N, U)``, and
        with ``assignments`` the final assignments ``(N, I, U)``."""
        side, children = self.pose_size, poses.shape[1]
        poses = poses.reshape(-1, children, side, side)
        weight = self.weight.reshape(children, self.out_types, side, side)
        extra = {"child_groups": groups} if groups is not None else {}
        if assignments:
            extra["return_assignments"] = True
        if isinstance(self.routing, EMRouting):  # the fused CPU kernel where it applies: no stored votes
            return self.routing.route_poses(poses, weight, acts, self.beta_v, self.beta_a, **extra)
        return self.routing(matrix_votes(poses, weight), acts, self.beta_v, self.beta_a, **extra)

    def extra_repr(self) -> str:
        chunks = f", checkpoint_chunks={self.checkpoint_chunks}" if self.checkpoint_chunks else ""
        scope = f", assignment_scope={self.assignment_scope!r}" if self.assignment_scope != "position" else ""
        return (
            f"in_types={self.in_types}, out_types={self.out_types}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, routing={self.routing!r}{chunks}{scope}"
        )


def _check_scope(scope: str, routing, checkpoint_chunks: int) -> str:
    choice("assignment_scope", scope, ASSIGNMENT_SCOPES)
    if scope != "position" and not getattr(routing, "supports_child_groups", False):
        raise ArgumentError(
            f"assignment_scope={scope!r} needs a routing that takes child_groups (EMRouting does); got {routing!r}"
        )
    if scope != "position" and checkpoint_chunks:
        raise ArgumentError(
            f"assignment_scope={scope!r} routes all output positions together, so "
            f"checkpoint_chunks must be 0; got {checkpoint_chunks}"
        )
    return scope


class ClassMatrixCapsules(nn.Module):
    """Class capsules from a grid of matrix capsules: ``W`` shared across positions, coordinate addition.

    Args:
        in_types: child capsule types ``T``.
        num_classes: class capsules ``J``.
        routing: see :class:`ConvMatrixCapsules`.
        coordinate_addition: add the coordinates of each child's position to its votes' first two
            components.
        pose_size: pose side ``P``.
        coordinates: ``(H, W, 2)`` fixed values to add at each grid position (e.g. the receptive-field
            centres in pixels / 100 with the column first, as in the authors' released code); None: the
            scaled (row, column) ``((r + 0.5) / H, (c + 0.5) / W)`` of the input grid.

    Shape:
        - input: :class:`MatrixCapsules` ``(B, T, H, W, P, P)``
        - output: :class:`MatrixCapsules` ``(B, J, 1, 1, P, P)``; with ``return_couplings``, also the assignments
          ``(B, T, H, W, J)``, summing to 1 over ``J``
        - ``weight``: ``(T, J, P, P)``

    Examples::

        >>> caps = MatrixCapsules(torch.randn(2, 16, 4, 4, 4, 4), torch.rand(2, 16, 4, 4))
        >>> classes, assignments = ClassMatrixCapsules(16, 5)(caps, return_couplings=True)
        >>> classes.activation.shape, assignments.shape
        (torch.Size([2, 5, 1, 1]), torch.Size([2, 16, 4, 4, 5]))
    """

    def __init__(
        self,
        in_types: int,
        num_classes: int,
        *,
        routing=None,
        coordinate_addition: bool = True,
        pose_size: int = 4,
        coordinates: Tensor | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.in_types = positive_int("in_types", in_types)
        self.num_classes = positive_int("num_classes", num_classes)
        self.pose_size = positive_int("pose_size", pose_size)
        self.coordinate_addition = flag("coordinate_addition", coordinate_addition)
        if pose_size**2 < 2 and self.coordinate_addition:
            raise ArgumentError("coordinate_addition needs at least 2 pose components", "coordinate_addition")
        self.routing = as_routing(routing, EMRouting)
        factory = {"device": device, "dtype": dtype}
        self.weight = _pose_weight(in_types, num_classes, side=pose_size, **factory)
        self.beta_v = nn.Parameter(torch.zeros(num_classes, **factory))
        self.beta_a = nn.Parameter(torch.zeros(num_classes, **factory))
        if coordinates is not None:
            coordinates = torch.as_tensor(coordinates, dtype=dtype or torch.get_default_dtype(), device=device)
            if coordinates.dim() != 3 or coordinates.shape[-1] != 2:
                raise ArgumentError(f"coordinates must be an (H, W, 2) tensor, got shape {tuple(coordinates.shape)}")
        self.register_buffer("fixed_coordinates", coordinates, persistent=False)

    def coordinates(self, height: int, width: int, device=None, dtype=None) -> Tensor:
        """The values added at every grid position, ``(H, W, 2)``: the fixed ``coordinates`` if given,
        else the scaled ``(row, column)`` in ``(0, 1)``."""
        if self.fixed_coordinates is not None:
            if tuple(self.fixed_coordinates.shape[:2]) != (height, width):
                raise ArgumentError(
                    f"ClassMatrixCapsules has coordinates for a {tuple(self.fixed_coordinates.shape[:2])} "
                    f"grid, got a ({height}, {width}) grid"
                )
            return self.fixed_coordinates.to(device=device, dtype=dtype)
        rows = (torch.arange(height, device=device, dtype=dtype) + 0.5) / height
        cols = (torch.arange(width, device=device, dtype=dtype) + 0.5) / width
        return torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1)

    def forward(self, caps: MatrixCapsules, *, return_couplings: bool = False):
        """The class capsules of ``caps``.

        Args:
            caps: the child capsules.
            return_couplings: also return the routing's final assignments of every child to the classes (see
                Shape; a routing other than :class:`EMRouting` as in :meth:`ConvMatrixCapsules.forward`).

        Returns:
            the classes, or ``(classes, assignments)`` with ``return_couplings``.
        """
        if caps.types != self.in_types or caps.pose_size != self.pose_size:
            raise ArgumentError(
                f"ClassMatrixCapsules expects {self.in_types} types of {self.pose_size}x{self.pose_size} "
                f"poses, got {caps!r}"
            )
        batch, side = caps.batch, self.pose_size
        height, width = caps.grid
        pose = caps.pose.permute(0, 2, 3, 1, 4, 5).reshape(batch, -1, side, side)  # (B, H*W*T, P, P)
        activation = caps.activation.permute(0, 2, 3, 1).reshape(batch, -1)  # (B, H*W*T)
        coords = None
        if self.coordinate_addition:
            coords = self.coordinates(height, width, pose.device, pose.dtype)  # (H, W, 2)
            coords = coords.unsqueeze(2).expand(-1, -1, self.in_types, -1).reshape(-1, 2)  # (H*W*T, 2)
        extra = {"return_assignments": True} if return_couplings else {}
        if isinstance(self.routing, EMRouting):  # the fused CPU kernel where it applies: no stored votes
            routed = self.routing.route_poses(
                pose, self.weight, activation, self.beta_v, self.beta_a, coordinates=coords, **extra
            )
        else:
            weight = self.weight.unsqueeze(0).expand(height * width, -1, -1, -1, -1)
            votes = matrix_votes(pose, weight.reshape(-1, self.num_classes, side, side))  # (B, H*W*T, J, P*P)
            if coords is not None:
                votes = torch.cat([votes[..., :2] + coords.view(1, -1, 1, 2), votes[..., 2:]], dim=-1)
            routed = self.routing(votes, activation, self.beta_v, self.beta_a, **extra)
        classes = MatrixCapsules(
            routed[0].view(batch, self.num_classes, 1, 1, side, side), routed[1].view(batch, self.num_classes, 1, 1)
        )
        if not return_couplings:
            return classes
        # children ordered (row, column, type): (B, H*W*T, J) -> (B, T, H, W, J)
        return classes, routed[2].view(batch, height, width, self.in_types, self.num_classes).permute(0, 3, 1, 2, 4)

    def extra_repr(self) -> str:
        return (
            f"in_types={self.in_types}, num_classes={self.num_classes}, "
            f"coordinate_addition={self.coordinate_addition}, routing={self.routing!r}"
        )
