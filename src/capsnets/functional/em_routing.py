"""EM routing between matrix capsules.

Hinton, Sabour & Frosst (2018), "Matrix capsules with EM routing", ICLR, Procedure 1 (SPEC §2).

Dimension legend: ``B`` batch (for a convolutional capsule layer: batch * output positions, folded),
``I`` child capsules (the K*K*types capsules of a receptive field), ``J`` parent capsule types,
``H`` pose components (16 for a 4x4 pose matrix).

The procedure, as implemented (one Gaussian cluster per parent over the H vote components):

- ``R = 1/J``; repeat ``iterations`` times:
  M-step: ``R' = R * a_i``; ``mu = sum_i R' V / sum_i R'``; ``sigma^2 = sum_i R' (V - mu)^2 / sum_i R'``;
  ``cost[j,h] = (beta_v[j] + log sigma[j,h]) * sum_i R'[i,j]``;
  ``a_j = logistic(lambda_t * (beta_a[j] - sum_h cost[j,h]))``.
  E-step (skipped after the last M-step): ``log p[i,j] = sum_h log N(V[i,j,h]; mu[j,h], sigma^2[j,h])``;
  ``R[i,:] = softmax_j(log a_j + log p[i,j])``.
- returns ``mu`` (the parents' poses) and ``a`` (their activations).

Inverse temperature schedule (the paper gives none). The default is
``lambda_t = 0.01 * (1 - 0.95 ** (t + 1))`` for iteration ``t = 0 .. iterations-1``, the formula Hinton
gave on OpenReview (https://openreview.net/forum?id=HJWLfGWRb) and the one used by Gritzman's IBM
reproduction (github.com/IBM/matrix-capsules-with-em-routing, ``em_routing.py``, ``final_lambda=0.01``),
the only public reproduction we know of that reports the paper's smallNORB accuracy without changing the
cost. Other reproductions differ: Yang (github.com/gyang274/capsulesEM) ramps lambda linearly from 1 to
``min(iterations, 3)`` but also normalises the cost across parents (see ``cost_normalization``);
Lei Yang's PyTorch port (github.com/yl-1993/Matrix-Capsules-EM-PyTorch) uses a constant 1e-3.
Pass ``inverse_temperature`` to use any of them.

Numerical safety (everything that can be in log space is):
- a variance floor ``eps`` is added to every ``sigma^2`` (cost and E-step), so zero-variance clusters
  (identical votes, a single active child) give ``log sigma`` of ``0.5 log eps`` instead of ``-inf``;
  ``eps=1e-6`` is below the spread of unit-scale poses yet far above float32 rounding of squared
  differences of such poses, and bounds ``d log sigma / d sigma^2`` by ``1 / (2 eps)``;
- ``sum_i R'`` is guarded by the same ``eps`` in the denominators of ``mu`` and ``sigma^2``, so a parent
  that receives no mass (all activations zero) gets ``mu = 0`` with zero cost, not ``0/0``;
- ``log a_j`` is ``logsigmoid`` of the pre-activation (exact when ``a_j`` underflows to 0) and the
  assignments are a log-space softmax;
- half-precision inputs (and calls under ``torch.autocast``) are computed in float32 with autocast
  disabled inside; results are float32 for float16/bfloat16 inputs, the input dtype otherwise.

Known scale issue (a deviation, off by default): ``sum_h cost`` grows with the number of children
mass ``sum_i R'``, so the same beta and lambda saturate a class-capsule layer (hundreds of children)
while a 3x3 convolutional one (tens) stays near 0.5. ``cost_normalization="mean_std"`` replaces
``sum_h cost[j]`` by its standardisation across the J parents of each example, ``(c_j - mean_j c) /
sqrt(var_j c + eps)``, as in Yang's reproduction. The default ``None`` follows the equations exactly.

Implementation: votes are laid out once as ``(B, J, I, H)`` so every weighted sum over ``I`` is a
batched matrix product; per iteration the only ``(B, J, I, H)`` temporaries are ``V - mu`` and its
square, shared by the M-step variance and the following E-step (which needs ``(V - mu)^2`` for the same
``mu``). Gradients flow through every iteration (the procedure differentiated literally).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

_LOG_2PI = math.log(2.0 * math.pi)
_COST_NORMALIZATIONS = (None, "mean_std")


def em_inverse_temperatures(iterations: int, final: float = 0.01, decay: float = 0.95) -> list[float]:
    """Default schedule ``lambda_t = final * (1 - decay ** (t + 1))`` (see the module docstring)."""
    return [final * (1.0 - decay ** (t + 1)) for t in range(iterations)]


def _resolve_lambdas(inverse_temperature, iterations: int) -> list[float]:
    if inverse_temperature is None:
        return em_inverse_temperatures(iterations)
    if isinstance(inverse_temperature, Tensor) and inverse_temperature.dim() == 0:
        inverse_temperature = float(inverse_temperature)
    if isinstance(inverse_temperature, (int, float)):
        return [float(inverse_temperature)] * iterations
    lambdas = [float(x) for x in inverse_temperature]
    if len(lambdas) != iterations:
        raise ValueError(
            f"inverse_temperature must be None, a number or a sequence of length iterations={iterations}; "
            f"got a sequence of length {len(lambdas)}"
        )
    return lambdas


def _check_beta(beta, name: str, parents: int, like: Tensor) -> Tensor:
    beta = torch.as_tensor(beta, device=like.device)
    if beta.numel() == 1:
        return beta.reshape(1).to(like.dtype)
    if beta.shape != (parents,):
        raise ValueError(
            f"{name} must have shape (J,) = ({parents},) (one per parent type) or be a scalar; "
            f"got shape {tuple(beta.shape)}"
        )
    return beta.to(like.dtype)


def _check_inputs(votes: Tensor, activations: Tensor, iterations, eps, cost_normalization) -> None:
    if not isinstance(votes, Tensor) or votes.dim() != 4:
        shape = tuple(votes.shape) if isinstance(votes, Tensor) else type(votes).__name__
        raise ValueError(
            f"votes must be a 4-D tensor (B, I, J, H) (batch, children, parents, pose); got {shape}"
        )
    if not isinstance(activations, Tensor) or activations.shape != votes.shape[:2]:
        shape = tuple(activations.shape) if isinstance(activations, Tensor) else type(activations).__name__
        raise ValueError(
            f"activations must have shape (B, I) = {tuple(votes.shape[:2])} to match votes; got {shape}"
        )
    if int(iterations) != iterations or iterations < 1:
        raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    if cost_normalization not in _COST_NORMALIZATIONS:
        raise ValueError(
            f"cost_normalization must be one of {_COST_NORMALIZATIONS}, got {cost_normalization!r}"
        )


def _m_step(r_prime, v, beta_v, beta_a, lam, eps, cost_normalization):
    """One M-step. r_prime (B, J, I), v (B, J, I, H) -> mu (B, J, H), d2 (B, J, I, H), var, pre (B, J)."""
    mass = r_prime.sum(dim=2, keepdim=True)  # (B, J, 1): sum_i R'
    w = (r_prime / (mass + eps)).unsqueeze(2)  # (B, J, 1, I): normalised weights, guarded
    mu = torch.matmul(w, v)  # (B, J, 1, H)
    d2 = (v - mu).square()  # (B, J, I, H), reused by the E-step
    var = torch.matmul(w, d2).squeeze(2) + eps  # (B, J, H): sigma^2 with its floor
    log_var = var.log()
    cost = ((beta_v.unsqueeze(-1) + 0.5 * log_var) * mass).sum(dim=-1)  # (B, J)
    if cost_normalization == "mean_std":
        mean = cost.mean(dim=1, keepdim=True)
        cost = (cost - mean) * torch.rsqrt((cost - mean).square().mean(dim=1, keepdim=True) + eps)
    pre = lam * (beta_a - cost)  # (B, J): a_j = sigmoid(pre)
    return mu.squeeze(2), d2, var, log_var, pre


def _e_step(d2, var, log_var, pre):
    """One E-step: new assignments (B, J, I), a softmax over J of log a_j + log p[i, j]."""
    quad = torch.matmul(d2, var.reciprocal().unsqueeze(-1)).squeeze(-1)  # (B, J, I): sum_h d2 / sigma^2
    log_norm = log_var.sum(dim=-1, keepdim=True) + var.shape[-1] * _LOG_2PI  # (B, J, 1)
    logits = F.logsigmoid(pre).unsqueeze(-1) - 0.5 * (quad + log_norm)  # (B, J, I)
    return torch.softmax(logits, dim=1)


def _assignments(r, v, a_in, beta_v, beta_a, lambdas, eps, cost_normalization):
    """Assignments after one M-step and one E-step per entry of ``lambdas``."""
    for lam in lambdas:
        _, d2, var, log_var, pre = _m_step(r * a_in, v, beta_v, beta_a, lam, eps, cost_normalization)
        r = _e_step(d2, var, log_var, pre)
    return r


def em_routing(
    votes: Tensor,
    activations: Tensor,
    beta_v: Tensor | float,
    beta_a: Tensor | float,
    iterations: int = 3,
    *,
    inverse_temperature: float | Sequence[float] | None = None,
    return_assignments: bool = False,
    eps: float = 1e-6,
    cost_normalization: str | None = None,
    detach_assignments: bool = False,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """Route child votes to parent matrix capsules by EM (Procedure 1 of Hinton et al. 2018).

    Args:
        votes: votes ``V[i, j] = M_i W_ij`` of every child for every parent, pose flattened to ``H``.
        activations: child activations ``a_i`` in ``[0, 1]``.
        beta_v: per-parent cost of describing a pose component by its variance, shape ``(J,)`` or scalar.
        beta_a: per-parent activation offset, shape ``(J,)`` or scalar.
        iterations: EM iterations (>= 1; the paper uses 3). The last one is an M-step only.
        inverse_temperature: ``lambda``: ``None`` for the default schedule (module docstring), a number
            for every iteration, or a sequence of ``iterations`` numbers.
        return_assignments: also return the assignments ``R`` used by the final M-step.
        eps: variance floor added to ``sigma^2`` and guard on ``sum_i R'`` (module docstring).
        cost_normalization: ``None`` (the paper) or ``"mean_std"`` (standardise the cost across parents).
        detach_assignments: compute the assignments of the non-final iterations without gradient, so
            gradients flow only through the final M-step (the assignments act as constants, as the
            couplings do in dynamic routing's ``detach`` mode). Same forward values; a cheaper backward
            and no stored intermediates for those iterations. Off by default (exact gradients).

    Shape:
        - votes: ``(B, I, J, H)``; activations: ``(B, I)``; beta_v, beta_a: ``(J,)`` or ``()``.
        - output: poses ``(B, J, H)``, activations ``(B, J)`` in ``(0, 1)``; assignments ``(B, I, J)``,
          summing to 1 over ``J``. float32 for half-precision inputs, the input dtype otherwise.
    """
    _check_inputs(votes, activations, iterations, eps, cost_normalization)
    lambdas = _resolve_lambdas(inverse_temperature, int(iterations))
    dtype = votes.dtype if votes.dtype in (torch.float32, torch.float64) else torch.float32
    with torch.autocast(device_type=votes.device.type, enabled=False):
        v = votes.to(dtype).permute(0, 2, 1, 3).contiguous()  # (B, J, I, H)
        a_in = activations.to(dtype).unsqueeze(1)  # (B, 1, I)
        beta_v = _check_beta(beta_v, "beta_v", v.shape[1], v)  # (J,) or (1,)
        beta_a = _check_beta(beta_a, "beta_a", v.shape[1], v)
        r = v.new_full(v.shape[:3], 1.0 / v.shape[1])  # (B, J, I)
        if detach_assignments and len(lambdas) > 1:
            with torch.no_grad():  # the assignments become constants: no graph for these iterations
                r = _assignments(r, v, a_in, beta_v, beta_a, lambdas[:-1], eps, cost_normalization)
            lambdas = lambdas[-1:]
        for t, lam in enumerate(lambdas):
            mu, d2, var, log_var, pre = _m_step(r * a_in, v, beta_v, beta_a, lam, eps, cost_normalization)
            if t < len(lambdas) - 1:
                r = _e_step(d2, var, log_var, pre)
        a_out = torch.sigmoid(pre)
    if return_assignments:
        return mu, a_out, r.transpose(1, 2)
    return mu, a_out


class EMRouting:
    """EM routing as a value to pass to a matrix capsule layer.

    Args:
        iterations: EM iterations (>= 1).
        inverse_temperature: ``lambda`` schedule (see :func:`em_routing`).
        eps: variance floor and mass guard (see :func:`em_routing`).
        cost_normalization: ``None`` or ``"mean_std"`` (see :func:`em_routing`).
        detach_assignments: gradients only through the final M-step (see :func:`em_routing`).

    Shape:
        ``votes (B, I, J, H), activations (B, I), beta_v (J,), beta_a (J,) -> (B, J, H), (B, J)``
    """

    def __init__(
        self,
        iterations: int = 3,
        inverse_temperature: float | Sequence[float] | None = None,
        *,
        eps: float = 1e-6,
        cost_normalization: str | None = None,
        detach_assignments: bool = False,
    ) -> None:
        if int(iterations) != iterations or iterations < 1:
            raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        if cost_normalization not in _COST_NORMALIZATIONS:
            raise ValueError(
                f"cost_normalization must be one of {_COST_NORMALIZATIONS}, got {cost_normalization!r}"
            )
        self.iterations = int(iterations)
        self.inverse_temperatures = _resolve_lambdas(inverse_temperature, self.iterations)
        self.eps = eps
        self.cost_normalization = cost_normalization
        self.detach_assignments = bool(detach_assignments)

    def __call__(self, votes, activations, beta_v, beta_a, return_assignments: bool = False):
        return em_routing(
            votes, activations, beta_v, beta_a, self.iterations,
            inverse_temperature=self.inverse_temperatures, return_assignments=return_assignments,
            eps=self.eps, cost_normalization=self.cost_normalization,
            detach_assignments=self.detach_assignments,
        )

    def __repr__(self) -> str:
        lams = ", ".join(f"{x:.3g}" for x in self.inverse_temperatures)
        return (
            f"EMRouting(iterations={self.iterations}, inverse_temperature=[{lams}], eps={self.eps}, "
            f"cost_normalization={self.cost_normalization!r}, detach_assignments={self.detach_assignments})"
        )
