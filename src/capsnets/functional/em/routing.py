"""The public face of EM routing: the routing as a value (:class:`EMRouting`), the routing of votes
(:func:`em_routing`, the PyTorch path) and of matrix capsules' poses (:func:`em_routing_poses`, which picks the
execution path: the fused CPU kernel where it applies, the PyTorch path elsewhere)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass

import torch
from torch import Tensor

from capsnets.functional.child_groups import ChildGroups
from capsnets.functional.em import recomputed, triton_path
from capsnets.functional.em.kernel import fused_kernel, route_fused
from capsnets.functional.em.procedure import VOTE_SIZES, route_votes
from capsnets.functional.em.spec import (
    OFFICIAL_MASS_EPS,
    EMSettings,
    checking,
    em_inverse_temperatures,
    host_reads,
    routing_dtype,
)
from capsnets.functional.products import matrix_votes
from capsnets.functional.routing_common import check_capsule_sizes, check_votes, normalized_gradients
from capsnets.validation import ArgumentError


@dataclass(frozen=True)
class EMRouting:
    """EM routing as a value to pass to a matrix capsule layer. Its defaults are the library's defaults of EM
    routing: layers and model builders that are given no routing use ``EMRouting()``.

    Args:
        iterations: EM iterations (>= 1; the paper uses 3). The last one is an M-step only.
        inverse_temperature: ``lambda``: ``None`` for the default schedule
            (:func:`~capsnets.functional.em_inverse_temperatures`), a number for every iteration, or a sequence
            of ``iterations`` numbers. Stored as the resolved schedule.
        eps: mass guard, and the paper formulation's variance floor (see :func:`em_routing`); None: the
            formulation's default, stored resolved.
        cost_normalization: ``None``, ``"mean_std"`` or ``"mass"`` (see :func:`em_routing`).
        detach_routing: compute the assignments of the non-final iterations without gradient (see
            :func:`em_routing`).
        formulation: ``"paper"`` or ``"official"`` (see :func:`em_routing`); :meth:`official` builds the
            released code's routing of a convolutional or class capsule layer.
        variance_floor: official formulation only (see :func:`em_routing`); None: its default, stored resolved.

    Shape:
        ``votes (B, I, J, H), activations (B, I), beta_v (J,), beta_a (J,) -> (B, J, H), (B, J)``; empty sizes and
        the activations' range as in :func:`em_routing`.

    Examples::

        >>> layer = ConvMatrixCapsules(8, 16, routing=EMRouting(3, detach_routing=True))
        >>> conv, cls = EMRouting.official(layer="conv"), EMRouting.official(layer="class")
        >>> spec = EMRouting(2, 0.5).to_config()
        >>> spec["type"], spec["inverse_temperature"], spec["eps"]
        ('em', [0.5, 0.5], 1e-06)
    """

    iterations: int = 3
    inverse_temperature: float | Sequence[float] | None = None
    _: KW_ONLY
    eps: float | None = None
    cost_normalization: str | None = None
    detach_routing: bool = False
    formulation: str = "paper"
    variance_floor: float | None = None

    #: takes ``child_groups`` (a convolutional layer's ``assignment_scope`` other than "position" needs it)
    supports_child_groups = True

    def __post_init__(self) -> None:
        settings = EMSettings.resolve(
            self.iterations,
            self.inverse_temperature,
            eps=self.eps,
            cost_normalization=self.cost_normalization,
            detach_routing=self.detach_routing,
            formulation=self.formulation,
            variance_floor=self.variance_floor,
        )
        resolved = {
            "iterations": settings.iterations,
            "eps": settings.eps,
            "variance_floor": settings.variance_floor,
            "inverse_temperature": settings.inverse_temperatures,
        }
        for name, value in resolved.items():  # frozen: the resolved settings, set once
            object.__setattr__(self, name, value)

    @property
    def settings(self) -> EMSettings:
        """The settings both execution paths take."""
        return EMSettings(
            self.inverse_temperature, self.eps, self.cost_normalization, self.detach_routing, self.variance_floor
        )

    @property
    def inverse_temperatures(self) -> list[float]:
        """The inverse temperature of each iteration, ``lambda_0 .. lambda_{iterations-1}``."""
        return list(self.inverse_temperature)

    @classmethod
    def official(
        cls,
        iterations: int = iterations,
        *,
        layer: str = "conv",
        final_inverse_temperature: float = 0.01,
        detach_routing: bool = detach_routing,
    ) -> EMRouting:
        """The released code's routing for a ``"conv"`` or ``"class"`` capsule layer: the official
        formulation, ``lambda_t = final (1 - 0.95^(t+1))`` with ``final`` divided by 4 in the class layer,
        variance floor 5e-4, mass guard 1e-7 (conv) or 1e-5 (class)."""
        if layer not in OFFICIAL_MASS_EPS:
            raise ArgumentError(f"layer must be 'conv' or 'class', got {layer!r}")
        final = final_inverse_temperature / 4.0 if layer == "class" else final_inverse_temperature
        return cls(
            iterations,
            em_inverse_temperatures(int(iterations), final=final),
            eps=OFFICIAL_MASS_EPS[layer],
            detach_routing=detach_routing,
            formulation="official",
        )

    def __call__(
        self,
        votes,
        activations,
        beta_v,
        beta_a,
        return_assignments: bool = False,
        child_groups: ChildGroups | None = None,
    ):
        check_votes(votes, "EM routing", "votes", VOTE_SIZES, activations)
        return route_votes(votes, activations, beta_v, beta_a, self.settings, child_groups, return_assignments)

    def route_poses(
        self,
        poses,
        weight,
        activations,
        beta_v,
        beta_a,
        coordinates=None,
        return_assignments: bool = False,
        child_groups: ChildGroups | None = None,
    ):
        """This routing of the votes ``poses @ weight`` (:func:`em_routing_poses`: with the fused CPU kernel
        where it applies, so the votes are never stored)."""
        return _route_poses(
            poses, weight, activations, beta_v, beta_a, self.settings, coordinates, child_groups, return_assignments
        )

    def to_config(self) -> dict:
        """The JSON-able spec of this routing, every setting resolved
        (:func:`~capsnets.functional.routing_from_config` rebuilds it)."""
        return {
            "type": "em",
            "iterations": self.iterations,
            "inverse_temperature": list(self.inverse_temperature),
            "eps": self.eps,
            "cost_normalization": self.cost_normalization,
            "detach_routing": self.detach_routing,
            "formulation": self.formulation,
            "variance_floor": self.variance_floor,
        }

    def __repr__(self) -> str:
        lams = ", ".join(f"{x:.3g}" for x in self.inverse_temperature)
        extra = (
            f", formulation='official', variance_floor={self.variance_floor}"
            if self.formulation == "official"
            else f", cost_normalization={self.cost_normalization!r}"
        )
        return (
            f"EMRouting(iterations={self.iterations}, inverse_temperature=[{lams}], eps={self.eps}"
            f"{extra}, detach_routing={self.detach_routing})"
        )


def em_routing(
    votes: Tensor,
    activations: Tensor,
    beta_v: Tensor | float,
    beta_a: Tensor | float,
    iterations: int = EMRouting.iterations,
    *,
    inverse_temperature: float | Sequence[float] | None = None,
    return_assignments: bool = False,
    eps: float | None = None,
    cost_normalization: str | None = None,
    detach_routing: bool = EMRouting.detach_routing,
    child_groups: ChildGroups | None = None,
    formulation: str = EMRouting.formulation,
    variance_floor: float | None = None,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """Route child votes to parent matrix capsules by EM (Procedure 1 of Hinton et al. 2018;
    :mod:`capsnets.functional.em`).

    Args:
        votes: votes ``V[i, j] = M_i W_ij`` of every child for every parent, pose flattened to ``H``.
        activations: child activations ``a_i`` in ``[0, 1]``.
        beta_v: per-parent cost of describing a pose component by its variance (the paper's ``beta_u``),
            shape ``(J,)`` or scalar.
        beta_a: per-parent activation offset, shape ``(J,)`` or scalar.
        iterations: EM iterations (>= 1). The last one is an M-step only.
        inverse_temperature: ``lambda``: ``None`` for the default schedule
            (:func:`~capsnets.functional.em_inverse_temperatures`), a number for every iteration, or a
            sequence of ``iterations`` numbers.
        return_assignments: also return the assignments ``R`` used by the final M-step.
        eps: guard on ``sum_i R'``; with the paper's formulation also the variance floor. None: ``1e-6``
            (paper), ``1e-5`` (official; its class layer's guard).
        cost_normalization: ``None`` (the paper), ``"mean_std"`` (standardise the cost across parents) or
            ``"mass"`` (divide it by ``I H / J``: a per-layer inverse temperature). Paper formulation only.
        detach_routing: compute the assignments of the non-final iterations without gradient, so
            gradients flow only through the final M-step (the assignments act as constants, as the
            couplings do in dynamic routing's ``detach_routing`` mode). Same forward values; a cheaper backward
            and no stored intermediates for those iterations. Off by default (exact gradients).
        child_groups: for the routing problems of a convolutional capsule layer (batch and output
            positions folded into ``B``), which child slots are copies of one child
            (:func:`~capsnets.functional.child_groups.grid_child_groups`): each child's assignments are
            then normalised over the parents of every problem that holds it (over all of them, or per
            parent type: ``ChildGroups.normalize``). ``None``: each slot is its own child (the softmax
            over ``J``).
        formulation: ``"paper"`` (Procedure 1 as printed) or ``"official"`` (the equations of the
            authors' released code).
        variance_floor: official formulation only: the floor added to every variance (None: ``5e-4``).

    Shape:
        - votes: ``(B, I, J, H)``; activations: ``(B, I)`` in ``[0, 1]``; beta_v, beta_a: ``(J,)`` or ``()``.
          ``J, H >= 1`` (else a ``ValueError`` names the empty size); ``I = 0`` gives parents with no input,
          ``B = 0`` empty results.
          Activations outside ``[0, 1]`` (or NaN) get a ``ValueError``.
        - output: poses ``(B, J, H)``, activations ``(B, J)`` in ``(0, 1)``; assignments ``(B, I, J)``,
          summing to 1 over ``J`` (with ``child_groups``: over the parents of all the child's slots).
          float32 for half-precision inputs, the input dtype otherwise.

    Examples::

        >>> votes, acts = torch.randn(8, 72, 10, 16), torch.rand(8, 72)
        >>> poses, activations = em_routing(votes, acts, torch.zeros(10), torch.zeros(10))
        >>> poses.shape, activations.shape
        (torch.Size([8, 10, 16]), torch.Size([8, 10]))
        >>> poses, activations = em_routing(votes, acts, 2.0, 1.0, formulation="official",
        ...                                 inverse_temperature=em_inverse_temperatures(3, final=0.0025))
    """
    check_votes(votes, "EM routing", "votes", VOTE_SIZES, activations)
    settings = EMSettings.resolve(
        iterations,
        inverse_temperature,
        eps=eps,
        cost_normalization=cost_normalization,
        detach_routing=detach_routing,
        formulation=formulation,
        variance_floor=variance_floor,
    )
    return route_votes(votes, activations, beta_v, beta_a, settings, child_groups, return_assignments)


def em_routing_poses(
    poses: Tensor,
    weight: Tensor,
    activations: Tensor,
    beta_v: Tensor | float,
    beta_a: Tensor | float,
    iterations: int = EMRouting.iterations,
    *,
    coordinates: Tensor | None = None,
    inverse_temperature: float | Sequence[float] | None = None,
    return_assignments: bool = False,
    eps: float | None = None,
    cost_normalization: str | None = None,
    detach_routing: bool = EMRouting.detach_routing,
    child_groups: ChildGroups | None = None,
    formulation: str = EMRouting.formulation,
    variance_floor: float | None = None,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """:func:`em_routing` of the votes ``V[n, i, j] = M[n, i] @ W[i % Iw, j]`` of matrix capsules, plus
    ``coordinates`` on the first two pose components.

    For float32/float64 4x4 poses on the CPU, the fused kernel (:mod:`capsnets.functional.em.kernel`)
    computes every product with the votes from ``poses`` and ``weight`` and never stores them; on CUDA, with
    Triton installed, Triton kernels do the same (:mod:`capsnets.functional.em.triton_path`); elsewhere (or
    with ``CAPSNETS_EM_KERNEL=torch``) the votes are formed by :func:`~capsnets.functional.products.matrix_votes`
    and routed by :func:`em_routing`. All give the same values and gradients up to rounding.

    Args:
        poses: child poses ``M``.
        weight: transforms ``W``; child ``i`` uses ``weight[i % Iw]`` (``Iw = I`` for a convolutional
            layer's receptive field; the child types for a class layer whose children are ordered
            (position, type) with the type last).
        activations, beta_v, beta_a, iterations: as in :func:`em_routing`.
        coordinates: values added to each child's votes' components 0 and 1 (coordinate addition), or None.

    The other keyword arguments are as in :func:`em_routing`.

    Shape:
        - poses: ``(B, I, P, P)``; weight: ``(Iw, J, P, P)``; activations: ``(B, I)``; coordinates: ``(I, 2)``.
          The sizes and the activations' range are checked as in :func:`em_routing`.
        - output: as :func:`em_routing`'s, with ``H = P * P``.

    Examples::

        >>> poses, weight, acts = torch.randn(8, 72, 4, 4), torch.randn(72, 10, 4, 4), torch.rand(8, 72)
        >>> mu, a = em_routing_poses(poses, weight, acts, 0.0, 0.0, formulation="official")
        >>> mu.shape, a.shape
        (torch.Size([8, 10, 16]), torch.Size([8, 10]))
    """
    _check_poses(poses, weight, coordinates)
    settings = EMSettings.resolve(
        iterations,
        inverse_temperature,
        eps=eps,
        cost_normalization=cost_normalization,
        detach_routing=detach_routing,
        formulation=formulation,
        variance_floor=variance_floor,
    )
    return _route_poses(
        poses,
        weight,
        activations,
        beta_v,
        beta_a,
        settings,
        coordinates,
        child_groups,
        return_assignments,
        checked=True,
    )


def _check_poses(poses, weight, coordinates) -> None:
    if not isinstance(poses, Tensor) or poses.dim() != 4 or poses.shape[-1] != poses.shape[-2]:
        got = tuple(poses.shape) if isinstance(poses, Tensor) else type(poses).__name__
        raise ArgumentError(f"poses must be a (B, I, P, P) tensor of square pose matrices; got {got}")
    children, side = poses.shape[1], poses.shape[-1]
    if (
        not isinstance(weight, Tensor)
        or weight.dim() != 4
        or tuple(weight.shape[-2:]) != (side, side)
        or weight.shape[0] < 1
        or children % weight.shape[0]
    ):
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ArgumentError(
            f"weight must be an (Iw, J, {side}, {side}) tensor with I = {children} a multiple of Iw; got {got}"
        )
    # the votes' sizes, as em_routing checks them (on every path: the kernels never form the votes)
    votes_shape = (poses.shape[0], children, weight.shape[1], side * side)
    check_capsule_sizes(votes_shape, "EM routing", "the votes of poses and weight", VOTE_SIZES)
    if coordinates is not None and (
        not isinstance(coordinates, Tensor) or tuple(coordinates.shape) != (children, 2) or side * side < 2
    ):
        got = tuple(coordinates.shape) if isinstance(coordinates, Tensor) else type(coordinates).__name__
        raise ArgumentError(f"coordinates must be None or an (I, 2) = ({children}, 2) tensor; got {got}")


@normalized_gradients
def _route_poses(
    poses,
    weight,
    activations,
    beta_v,
    beta_a,
    settings: EMSettings,
    coordinates=None,
    child_groups: ChildGroups | None = None,
    return_assignments: bool = False,
    checked: bool = False,
):
    """:func:`em_routing_poses` with its settings resolved: the Triton kernels where
    :func:`~capsnets.functional.em.triton_path.applies` (CUDA), the CPU kernel where :func:`fused_kernel` gives
    one (and the coordinates need no gradient), else the votes routed by the PyTorch path."""
    if not checked:
        _check_poses(poses, weight, coordinates)
    if triton_path.applies(poses, weight, coordinates):
        return triton_path.route_poses(
            poses, weight, activations, beta_v, beta_a, settings, coordinates, child_groups, return_assignments
        )
    children, side = poses.shape[1], poses.shape[-1]
    kernel = fused_kernel(poses)
    if kernel is None or weight.dtype != poses.dtype or (coordinates is not None and coordinates.requires_grad):
        full = weight.repeat(children // weight.shape[0], 1, 1, 1) if weight.shape[0] != children else weight
        out = None  # votes too large for float32 gradients (the em module docstring): formed in float64 too, so the
        # transforms' gradient (the poses times the votes') does not overflow either
        if (
            checking()
            and host_reads(poses.device)  # elsewhere the routing's scale stands in for float64
            and torch.is_grad_enabled()
            and (poses.requires_grad or full.requires_grad)
            and poses.numel()
            and full.numel()
        ):
            with torch.no_grad():
                top = side * float(poses.detach().abs().amax()) * float(full.detach().abs().amax())
            if poses.dtype != torch.float64 and routing_dtype(poses.dtype, top, poses.device) == torch.float64:
                out = poses.dtype if poses.dtype == torch.float32 else torch.float32
                poses, full = poses.double(), full.double()
        votes = matrix_votes(poses, full)  # (B, I, J, P*P)
        if coordinates is not None:
            coords = coordinates.to(votes.dtype).view(1, children, 1, 2)
            votes = torch.cat([votes[..., :2] + coords, votes[..., 2:]], dim=-1)
        check_votes(votes, "EM routing", "votes", VOTE_SIZES, activations)
        routed = route_votes(votes, activations, beta_v, beta_a, settings, child_groups, return_assignments)
        return routed if out is None else tuple(t.to(out) for t in routed)
    return recomputed.route_poses(
        kernel.votes_stats, functools.partial(route_fused, kernel, want_r=return_assignments), poses, weight,
        activations, beta_v, beta_a, settings, coordinates, child_groups, return_assignments,
    )  # fmt: skip
