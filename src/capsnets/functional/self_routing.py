"""Self-routing: each child routes by a small routing network of its own, not by agreement.

Hahn, Pyeon & Kim (2019), "Self-Routing Capsule Networks", NeurIPS (its self-routing), and the authors' code
(coder3000/SR-CapsNet, ``modules.py``, ``SelfRouting2d.forward``). Child ``i`` with pose ``u_i`` and activation
``a_i`` computes its coupling logits from its own pose, ``b_ij = W_ij . u_i + beta_ij`` (``W``, ``beta``
learned, zero at the start as in the code), ``c_ij = softmax_j(b_ij)``; the parent activation is
``a_j = sum_i c_ij a_i / sum_i a_i`` and the parent pose the activation-weighted mean of its votes,
``p_j = sum_i c_ij a_i u_hat[j|i] / sum_i c_ij a_i``.

Vector capsules (deviation): a child's activation is its length ``|u_i|`` unless activations are given, and the
parent capsule is its pose rescaled to length ``a_j``, ``v_j = a_j p_j / |p_j|``, so that its length is its
activation, as every vector capsule's is. The paper keeps pose and activation apart.

Numerics (not in the paper; same values): a quotient whose denominator is zero (all the children inactive) is
zero, not NaN; float16/bfloat16 votes are routed in float32, and float32/half votes that need a gradient beyond
``2^32`` in float64 (:func:`~capsnets.functional.routing_common.widened`: the backward multiplies the gradient of
a parent's direction by the votes). The coupling logits are formed in float64 (where the device has it) from the
poses over a power of two ``>=`` their largest component and shifted by their maximum over parents, so ``W . u_i``
cannot overflow; the parent pose is formed a quarter of itself (a mean's roundings can exceed its largest vote);
the activations are divided by a power of two ``>=`` their largest per example (1 for activations within [0, 1])
before they are summed, and each parent pose by one ``>=`` its largest component before its length is taken, so
the output and its gradient are finite for every finite vote and pose.

Dimension legend: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` parent capsule dim,
``D_in`` child capsule dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.functional.routing_common import (
    BoundRouting,
    check_votes,
    largest_magnitude,
    normalized_gradients,
    power_of_two_above,
    saturating_softmax,
    widened,
    working,
)
from capsnets.functional.squash import safe_norm
from capsnets.validation import ArgumentError


@dataclass(frozen=True)
class SelfRouting:
    """Self-routing as a value to pass to a capsule layer; its routing weights ``W`` ``(I, J, D_in)`` and
    biases ``beta`` ``(I, J)`` are parameters of the layer it is given to (``build``), zeros at the start.

    The layer passes the children's poses (``poses=``, ``needs_poses`` is True); their activations are their
    lengths.

    Shape:
        ``(B, I, J, D)`` votes and ``(B, I, D_in)`` poses -> ``(B, J, D)``; with ``return_couplings=True`` also
        the couplings ``(B, I, J)``. Empty sizes as in :func:`self_routing`.

    Examples::

        >>> layer = LinearCapsules(32, 8, 10, 16, routing=SelfRouting())
        >>> layer(torch.randn(2, 32, 8)).shape, layer.routing.weight.shape
        (torch.Size([2, 10, 16]), torch.Size([32, 10, 8]))
    """

    needs_poses = True  # a class attribute, not a setting

    def __call__(
        self,
        u_hat: Tensor,
        *,
        poses: Tensor | None = None,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        activations: Tensor | None = None,
        return_couplings: bool = False,
    ):
        if weight is None or bias is None:
            raise ArgumentError(
                "SelfRouting learns a routing network per child: give it to a capsule layer "
                "(which builds it), or call .build(in_capsules, in_dim, out_capsules, out_dim)"
            )
        if poses is None:
            raise ArgumentError("SelfRouting needs the children's poses (poses=, shape (B, I, D_in))")
        return self_routing(u_hat, poses, weight, bias, activations=activations, return_couplings=return_couplings)

    def build(self, in_capsules: int, in_dim: int, out_capsules: int, out_dim: int, *, device=None, dtype=None):
        """The routing with its weights ``(in_capsules, out_capsules, in_dim)`` and biases ``(in_capsules,
        out_capsules)``, zeros (an ``nn.Module``)."""
        return BoundRouting(
            self,
            {
                "weight": torch.zeros(in_capsules, out_capsules, in_dim, device=device, dtype=dtype),
                "bias": torch.zeros(in_capsules, out_capsules, device=device, dtype=dtype),
            },
        )

    def to_config(self) -> dict:
        """The JSON-able spec of this routing (:func:`~capsnets.functional.routing_from_config` rebuilds it)."""
        return {"type": "self_routing"}


@normalized_gradients
def self_routing(
    u_hat: Tensor,
    poses: Tensor,
    weight: Tensor,
    bias: Tensor,
    *,
    activations: Tensor | None = None,
    return_couplings: bool = False,
):
    """Route votes to parents by each child's own routing network (Hahn et al. 2019).

    Args:
        u_hat: votes ``u_hat[j|i]`` of every child ``i`` for every parent ``j``.
        poses: the children's poses ``u_i``.
        weight, bias: the routing networks, ``b_ij = weight[i, j] . u_i + bias[i, j]``.
        activations: the children's activations ``a_i >= 0``; None: their lengths ``|u_i|``.
        return_couplings: also return the couplings ``c``.

    Shape:
        - u_hat: ``(B, I, J, D)``; poses: ``(B, I, D_in)``; weight: ``(I, J, D_in)``; bias: ``(I, J)``;
          activations: ``(B, I)``
        - ``J, D, D_in >= 1`` (else a ``ValueError`` names the empty size); ``I = 0`` gives parents with no
          input, ``B = 0`` empty results.
        - output: ``(B, J, D)``, of length ``a_j``; couplings ``(B, I, J)``, summing to 1 over ``J``.

    Examples::

        >>> u_hat, poses = torch.randn(2, 32, 10, 16), torch.randn(2, 32, 8)
        >>> self_routing(u_hat, poses, torch.zeros(32, 10, 8), torch.zeros(32, 10)).shape
        torch.Size([2, 10, 16])
    """
    check_votes(u_hat, "self_routing")
    batch, children, parents, dim = u_hat.shape
    in_dim = poses.shape[-1] if isinstance(poses, Tensor) and poses.dim() == 3 else None
    expected = {
        "poses": (batch, children, in_dim),
        "weight": (children, parents, in_dim),
        "bias": (children, parents),
        "activations": (batch, children),
    }
    for name, value in (("poses", poses), ("weight", weight), ("bias", bias), ("activations", activations)):
        if value is not None and (not isinstance(value, Tensor) or tuple(value.shape) != expected[name]):
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ArgumentError(
                f"self_routing expects {name} of shape {expected[name]} (B, I, J, D_in from u_hat "
                f"{tuple(u_hat.shape)} and poses), got {shape}"
            )
    if in_dim == 0:
        raise ArgumentError(
            f"self_routing needs at least one pose component per child (D_in >= 1); got poses of shape "
            f"{tuple(poses.shape)}: give the children poses of at least one component"
        )
    u = widened(u_hat)  # float64 for large votes: the backward multiplies the gradient by them twice
    pose = working(poses).to(u.dtype)
    couplings = saturating_softmax(_logits(pose, working(weight), working(bias)), dim=2)  # (B, I, J)
    act = safe_norm(pose) if activations is None else working(activations).to(u.dtype)  # (B, I)
    # the activations over a power of two >= their largest per example: the ratios below are the same
    act = act / power_of_two_above(largest_magnitude(act, 1, keepdim=True), 1.0)
    weighted = couplings * act.unsqueeze(-1)  # (B, I, J): c_ij a_i
    mass = weighted.sum(dim=1)  # (B, J)
    a_out = _ratio(mass, act.sum(dim=1, keepdim=True))  # (B, J)
    share = _ratio(weighted, mass.unsqueeze(1))  # (B, I, J), summing to 1 over children (or all zero)
    # (B, J, D): a mean of votes, a quarter of p_j (the mean's roundings may take it past max |u_hat|)
    pose_out = torch.einsum("bij,bijd->bjd", share, u * 0.25)
    # the direction of p_j from p_j over a power of two >= its largest component, with the epsilon of the votes'
    # dtype (the gradient at p_j = 0, a_j / sqrt(eps), fits in that dtype)
    pose_out = pose_out / power_of_two_above(pose_out.abs().amax(dim=-1, keepdim=True), 0.25)
    length = safe_norm(pose_out, keepdim=True, eps=torch.finfo(u_hat.dtype).eps ** 2)
    v = (pose_out / length * a_out.unsqueeze(-1)).to(u_hat.dtype)
    return (v, couplings.to(u_hat.dtype)) if return_couplings else v


def _logits(pose: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """The coupling logits ``b_ij = W_ij . u_i + beta_ij`` (B, I, J) less their maximum over parents, formed in
    float64 where the device has it and over a power of two ``p >= max |u_i|`` per child (1 for poses within
    [-1, 1]; exact), so that no product or sum overflows (float64 poses included), and returned in the poses'
    dtype: ``p`` is put back after the shift, where a product beyond the dtype is a logit of -inf."""
    dtype = pose.dtype
    wide = torch.float64 if pose.device.type != "mps" else dtype
    pose = pose.to(wide)
    p = power_of_two_above(largest_magnitude(pose, 2, keepdim=True), 1.0)  # (B, I, 1)
    logits = torch.einsum("bic,ijc->bij", pose / p, weight.to(wide)) + bias.to(wide) / p
    return ((logits - logits.detach().amax(dim=2, keepdim=True)) * p).to(dtype)


def _ratio(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator``, zero where the denominator is zero (with a zero gradient there)."""
    zero = denominator == 0
    return torch.where(zero, 0.0, numerator / torch.where(zero, 1.0, denominator))
