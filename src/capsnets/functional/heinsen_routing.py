"""Heinsen's routing: EM-like clustering of votes in which each child's use or neglect by a parent carries a
learned net benefit.

Heinsen (2019), "An Algorithm for Routing Capsules in All Domains", arXiv:1911.00792, Algorithm 1, and the
author's code (glassroom/heinsen_routing_2019_paper, ``heinsen_routing.py``, ``Routing.forward``, Gaussian
``p_model``). Children have scores (logits) ``a_i`` and votes ``V_ij`` for every parent ``j``; with
``f = sigmoid`` and routing probabilities ``R_ij`` (``1/J`` at the start), each iteration computes

- D-step: the data each child gives a parent to use, ``D_use_ij = f(a_i) R_ij``, and to ignore,
  ``D_ign_ij = f(a_i) - D_use_ij``;
- M-step: the parents' scores, the net benefit of using minus the cost of ignoring,
  ``a_j = sum_i beta_use_ij D_use_ij - sum_i beta_ign_ij D_ign_ij``, and a Gaussian of the votes weighted by
  ``D_use``: ``mu_j = sum_i D_use_ij V_ij / (sum_i D_use_ij + eps)``,
  ``sigma2_j = sum_i D_use_ij (V_ij - mu_j)^2 / (sum_i D_use_ij + eps) + eps`` (per component);
- E-step (between iterations): ``R_ij = softmax_j(log f(a_j) + log p(V_ij | mu_j, sigma2_j))``, the log
  density without its constant ``-D/2 log 2 pi``, which the softmax cancels.

``beta_use`` and ``beta_ign`` are learned, zeros at the start as in the code. The parents' scores are logits:
the paper trains its classifiers with cross-entropy on them.

Numerics (not in the paper): float16/bfloat16 votes are routed in float32, and float32/half votes beyond ``2^32``
in float64 (:func:`~capsnets.functional.routing_common.widened`: their variances, and the backward's products of
the gradient with the votes, overflow float32 there); same values. float64 votes whose squares could overflow
(beyond ``2^-8`` times the square root of its largest, about 5e151) are routed over a power of two
``q >=`` their largest magnitude per example, ``mu`` and the variances put back times ``q`` and ``q^2`` (``sigma2``
is inf where it is beyond the dtype); the E-step's variance floor ``eps`` stays the same in those units (``q^2``
times larger in the votes' own, as EM routing's, :mod:`capsnets.functional.em`), so every finite vote gives finite
scores, means and couplings.

Dimension legend: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` components of a vote (a
``d_cov x d_out`` matrix flattened).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from capsnets.functional.routing_common import (
    BoundRouting,
    check_votes,
    largest_magnitude,
    normalized_gradients,
    power_of_two_above,
    widened,
    working,
)
from capsnets.validation import ArgumentError, expect, routing_iterations


class HeinsenOutput(NamedTuple):
    """The parents :func:`heinsen_routing` returns: ``scores`` ``(B, J)`` (logits), ``mu`` and ``sigma2``
    ``(B, J, D)`` (the mean and variance of each parent's Gaussian), ``couplings`` ``(B, I, J)`` (the routing
    probabilities of the last M-step)."""

    scores: Tensor
    mu: Tensor
    sigma2: Tensor
    couplings: Tensor


@dataclass(frozen=True)
class HeinsenRouting:
    """Heinsen's routing as a value to pass to a layer; its ``beta_use`` and ``beta_ign`` ``(I, J)`` are
    parameters of the layer it is given to (``build``), zeros at the start.

    Args:
        iterations: M-steps (the author's default: 3), from 1 to 100.
        eps: added to each parent's data and variance (the code's 1e-5).

    Examples::

        >>> routing = HeinsenRouting().build(32, 16, 10, 16)
        >>> out = routing(torch.randn(2, 32, 10, 16), activations=torch.randn(2, 32))
        >>> out.scores.shape, out.mu.shape
        (torch.Size([2, 10]), torch.Size([2, 10, 16]))
        >>> HeinsenRouting().to_config()
        {'type': 'heinsen', 'iterations': 3, 'eps': 1e-05}
    """

    iterations: int = 3
    eps: float = 1e-5

    def __post_init__(self) -> None:
        object.__setattr__(self, "iterations", routing_iterations("iterations", self.iterations))
        expect(
            isinstance(self.eps, (int, float)) and not isinstance(self.eps, bool) and 0 < self.eps < 1,
            "eps",
            self.eps,
            "a number in (0, 1)",
        )

    def __call__(
        self,
        u_hat: Tensor,
        *,
        activations: Tensor | None = None,
        beta_use: Tensor | None = None,
        beta_ign: Tensor | None = None,
    ) -> HeinsenOutput:
        if beta_use is None or beta_ign is None:
            raise ArgumentError(
                "HeinsenRouting learns a net benefit per child and parent: give it to a layer (which builds it), "
                "or call .build(in_capsules, in_dim, out_capsules, out_dim)"
            )
        if activations is None:
            raise ArgumentError("HeinsenRouting needs the children's scores (activations=, logits of shape (B, I))")
        return heinsen_routing(u_hat, activations, beta_use, beta_ign, iterations=self.iterations, eps=self.eps)

    def build(self, in_capsules: int, in_dim: int, out_capsules: int, out_dim: int, *, device=None, dtype=None):
        """The routing with ``beta_use`` and ``beta_ign`` ``(in_capsules, out_capsules)``, zeros (an
        ``nn.Module``)."""
        return BoundRouting(
            self,
            {
                "beta_use": torch.zeros(in_capsules, out_capsules, device=device, dtype=dtype),
                "beta_ign": torch.zeros(in_capsules, out_capsules, device=device, dtype=dtype),
            },
        )

    def to_config(self) -> dict:
        """The JSON-able spec of this routing (:func:`~capsnets.functional.routing_from_config` rebuilds it)."""
        return {"type": "heinsen", "iterations": self.iterations, "eps": self.eps}


@normalized_gradients
def heinsen_routing(
    u_hat: Tensor,
    activations: Tensor,
    beta_use: Tensor,
    beta_ign: Tensor,
    *,
    iterations: int = 3,
    eps: float = 1e-5,
) -> HeinsenOutput:
    """Route votes to parents by Heinsen's algorithm (module docstring).

    Args:
        u_hat: the votes ``V_ij`` of every child ``i`` for every parent ``j``.
        activations: the children's scores ``a_i``, logits (any real number).
        beta_use, beta_ign: the net benefit of a parent's using a child's data and the cost of ignoring it;
            a first size of 1 shares them across the children.
        iterations: M-steps, from 1 to 100.
        eps: added to each parent's data and variance.

    Shape:
        - u_hat: ``(B, I, J, D)``, ``J, D >= 1`` (else a ``ValueError`` names the empty size); activations:
          ``(B, I)``; beta_use, beta_ign: ``(I, J)`` or ``(1, J)``.
        - output: :class:`HeinsenOutput`, scores ``(B, J)``, mu and sigma2 ``(B, J, D)``, couplings ``(B, I, J)``.

    Examples::

        >>> u_hat, scores = torch.randn(2, 32, 10, 16), torch.randn(2, 32)
        >>> out = heinsen_routing(u_hat, scores, torch.zeros(32, 10), torch.zeros(32, 10))
        >>> out.scores.shape, out.sigma2.shape, out.couplings.shape
        (torch.Size([2, 10]), torch.Size([2, 10, 16]), torch.Size([2, 32, 10]))
    """
    check_votes(u_hat, "heinsen_routing")
    routing_iterations("iterations", iterations)
    batch, children, parents, _ = u_hat.shape
    _check_shape("activations", activations, [(batch, children)], u_hat)
    for name, beta in (("beta_use", beta_use), ("beta_ign", beta_ign)):
        _check_shape(name, beta, [(children, parents), (1, parents)], u_hat)
    votes = (
        widened(u_hat, gradient_only=False).transpose(1, 2).contiguous()
    )  # (B, J, I, D): the products below batch over B and J
    dtype = votes.dtype
    # q: 1, or a power of two >= the votes' largest magnitude where their squares could overflow (module docstring)
    top = largest_magnitude(votes, (1, 2, 3)).view(batch, 1, 1, 1)
    q = torch.where(top > 2.0 ** (math.frexp(torch.finfo(dtype).max)[1] // 2 - 8), power_of_two_above(top, 1.0), 1.0)
    votes = votes / q
    present = torch.sigmoid(working(activations).to(dtype)).unsqueeze(1)  # (B, 1, I): f(a_i)
    use_benefit, ignore_cost = working(beta_use).to(dtype).T, working(beta_ign).to(dtype).T  # (J, I) or (J, 1)
    couplings = votes.new_full((batch, parents, children), 1.0 / parents)  # (B, J, I)
    scores, mu, variance, spread = _m_step(votes, present * couplings, present, use_benefit, ignore_cost, eps)
    for _ in range(iterations - 1):
        sigma2 = variance + eps
        # E-step: the routing probabilities from the last M-step's parents (its squared deviations reused)
        log_p = -(spread @ (0.5 / sigma2).unsqueeze(-1)).squeeze(-1) - 0.5 * sigma2.log().sum(-1, keepdim=True)
        couplings = torch.softmax(torch.nn.functional.logsigmoid(scores).unsqueeze(-1) + log_p, dim=1)
        scores, mu, variance, spread = _m_step(votes, present * couplings, present, use_benefit, ignore_cost, eps)
    out, q = u_hat.dtype, q.view(batch, 1, 1)
    sigma2 = (variance * q * q + eps).to(out)  # beyond the dtype's range: inf (the variance itself is)
    return HeinsenOutput(scores.to(out), (mu * q).to(out), sigma2, couplings.transpose(1, 2).to(out))


def _m_step(votes: Tensor, use: Tensor, present: Tensor, use_benefit: Tensor, ignore_cost: Tensor, eps: float):
    """The parents' scores ``(B, J)``, means and variances (without ``eps``) ``(B, J, D)``, and the votes' squared
    deviations from the means ``(B, J, I, D)``, from the votes ``(B, J, I, D)`` and the data to use, ``D_use``
    ``(B, J, I)``; the data to ignore is the rest of each child's ``f(a_i)`` (``present``, ``(B, 1, I)``)."""
    scores = (use_benefit * use).sum(2) - (ignore_cost * (present - use)).sum(2)
    data = (use.sum(2) + eps).unsqueeze(-1)  # (B, J, 1)
    mu = (use.unsqueeze(2) @ votes).squeeze(2) / data  # (B, J, 1, I) @ (B, J, I, D)
    spread = (votes - mu.unsqueeze(2)).square()
    variance = (use.unsqueeze(2) @ spread).squeeze(2) / data
    return scores, mu, variance, spread


def _check_shape(name: str, value, shapes: list[tuple[int, ...]], u_hat: Tensor) -> None:
    if not isinstance(value, Tensor) or tuple(value.shape) not in shapes:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ArgumentError(
            f"heinsen_routing expects {name} of shape {' or '.join(map(str, shapes))} (B, I, J from u_hat "
            f"{tuple(u_hat.shape)}), got {shape}"
        )
