"""The naive routings the benchmarks time the library's routings against.

Both are written the way public capsule implementations usually write them: vectorised, but with full
broadcasts every iteration and gradients through every iteration. ``benchmarks/throughput.py`` swaps them
into a model (``routing=``) to measure the speed-up of the production routing; the tests check that they
compute the same function as the production routing, so that the comparison is fair.

- :class:`NaiveDynamicRouting`: dynamic routing (Sabour, Frosst & Hinton 2017, Procedure 1) with
  ``(B, I, J, D)`` products every iteration.
- :class:`NaiveEMRouting`: EM routing (Hinton, Sabour & Frosst 2018, Procedure 1) with ``(B, I, J, H)``
  broadcasts of ``R``, ``V`` and ``mu`` every iteration and Gaussian densities computed with ``exp``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from capsnets.functional import EMRouting


class NaiveDynamicRouting:
    """Dynamic routing as public implementations usually write it (the benchmarks' baseline).

    Shape:
        ``(B, I, J, D) -> (B, J, D)``
    """

    def __init__(self, iterations: int = 3) -> None:
        self.iterations = iterations

    def __call__(self, u_hat: Tensor, *, return_couplings: bool = False):
        b = torch.zeros(*u_hat.shape[:3], 1, device=u_hat.device, dtype=u_hat.dtype)  # (B, I, J, 1)
        for r in range(self.iterations):
            c = torch.softmax(b, dim=2)
            s = (c * u_hat).sum(dim=1, keepdim=True)  # (B, 1, J, D)
            sq = (s * s).sum(dim=-1, keepdim=True)
            v = sq / (1.0 + sq) * s / torch.sqrt(sq + 1e-8)
            if r < self.iterations - 1:
                b = b + (u_hat * v).sum(dim=-1, keepdim=True)
        v = v.squeeze(1)
        return (v, c.squeeze(-1)) if return_couplings else v

    def __repr__(self) -> str:
        return f"NaiveDynamicRouting(iterations={self.iterations})"


class NaiveEMRouting:
    """EM routing as public implementations usually write it (the benchmarks' baseline for EM).

    Vectorised but naive: every iteration broadcasts ``R``, ``V`` and ``mu`` to ``(B, I, J, H)``; the
    Gaussian densities are computed with ``exp`` (a floor on ``sum_j a_j p_ij`` avoids division by
    zero; no log space, so far-off votes underflow to ``p = 0``); gradients flow through every
    iteration. Same lambda schedule and ``eps`` conventions as :func:`capsnets.functional.em_routing`,
    so it agrees with it wherever the densities neither underflow nor hit the floor.

    Shape:
        ``votes (B, I, J, H), activations (B, I), beta_v (J,), beta_a (J,) -> (B, J, H), (B, J)``
    """

    def __init__(self, iterations: int = 3, inverse_temperature=None, eps: float = 1e-6) -> None:
        self.iterations = iterations
        # the production routing's lambda schedule (and its checks of ``inverse_temperature``)
        self.inverse_temperatures = EMRouting(iterations, inverse_temperature).inverse_temperatures
        self.eps = eps

    def __call__(self, votes: Tensor, activations: Tensor, beta_v, beta_a, return_assignments: bool = False):
        eps, (batch, children, parents, _) = self.eps, votes.shape
        tiny = torch.finfo(votes.dtype).tiny  # the usual guard against 0 / 0
        a_in = activations.unsqueeze(-1)  # (B, I, 1)
        r = votes.new_full((batch, children, parents), 1.0 / parents)  # (B, I, J)
        for t, lam in enumerate(self.inverse_temperatures):
            # M-step
            rp = (r * a_in).unsqueeze(-1)  # (B, I, J, 1)
            mass = rp.sum(dim=1, keepdim=True)  # (B, 1, J, 1)
            mu = (rp * votes).sum(dim=1, keepdim=True) / (mass + eps)  # (B, 1, J, H)
            var = (rp * (votes - mu) ** 2).sum(dim=1, keepdim=True) / (mass + eps) + eps  # (B, 1, J, H)
            cost = ((beta_v.view(-1, 1) + torch.log(torch.sqrt(var))) * mass).sum(dim=-1)  # (B, 1, J)
            a_out = torch.sigmoid(lam * (beta_a - cost))  # (B, 1, J)
            if t == self.iterations - 1:
                break
            # E-step
            p = torch.exp(-((votes - mu) ** 2) / (2 * var)) / torch.sqrt(2 * math.pi * var)  # (B, I, J, H)
            ap = a_out * p.prod(dim=-1)  # (B, I, J)
            r = ap / ap.sum(dim=-1, keepdim=True).clamp_min(tiny)
        mu, a_out = mu.squeeze(1), a_out.squeeze(1)
        return (mu, a_out, r) if return_assignments else (mu, a_out)

    def __repr__(self) -> str:
        return f"NaiveEMRouting(iterations={self.iterations})"
