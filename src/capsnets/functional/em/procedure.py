"""EM routing in PyTorch: the reference execution path, differentiated by autograd.

It runs everywhere (CUDA, half precision under autocast, ``torch.compile``, export) and is the path the fused
CPU kernel (:mod:`capsnets.functional.em.kernel`) is tested against. The equations are those of
:mod:`capsnets.functional.em`; this module computes them as follows (same values).

Votes are laid out once as ``(B, J, I, H)``, shifted by a per-parent origin ``c`` (the activation-weighted
mean vote, a constant: every quantity is computed by exact algebra from ``V - c``, so nothing depends on
``c``), divided by the problem's power of two (:class:`Scale`), and stored once as ``xx = [V - c, (V - c)^2]``
``(B, J, I, 2H)``. Each M-step is one batched product ``w @ xx`` giving ``sum_i w x`` and ``sum_i w x^2`` (the
variance about any centre follows by exact algebra, clamped at 0 against rounding), each E-step one product
``xx @ [-2 d / sigma^2, 1 / sigma^2]`` (:func:`~capsnets.functional.products.matvec`): no ``(B, J, I, H)``
temporary per iteration.

The iterations (:func:`iterate`) see the votes only through those two products, the methods of a
:class:`VoteProducts`: :class:`StoredVotes` keeps ``xx``, and the Triton path
(:mod:`capsnets.functional.em.triton_path`) recomputes the votes from the poses inside each product instead.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from capsnets.functional.child_groups import ChildGroups, group_softmax
from capsnets.functional.em.spec import (
    BETA_A_SCALE,
    BLEND,
    GRADIENT_MASS_FLOOR,
    LOG_2PI,
    EMSettings,
    check_activations,
    check_beta,
    check_child_groups,
    checking,
    device_scale_limit,
    host_reads,
    routing_dtype,
    without_autocast,
)
from capsnets.functional.products import matvec
from capsnets.functional.routing_common import normalized_gradients

#: The sizes of EM votes ``(B, I, J, H)`` after the batch (:func:`~capsnets.functional.routing_common.check_votes`).
VOTE_SIZES = {2: ("J", "parent capsules"), 3: ("H", "pose components")}


class Scale(NamedTuple):
    """The units of one batch of routing problems (:mod:`capsnets.functional.em`): each problem's votes are
    handled divided by ``sigma``, a power of two (1 unless they are large enough for their squares to
    overflow)."""

    inv: Tensor  # (B, 1, 1, 1): 1 / sigma
    log_var: Tensor  # (B, 1, 1): 2 log sigma, which turns the log of a scaled variance into the real one
    floor: Tensor  # (B, 1, 1): the variance floor in scaled units


def vote_scale(v: Tensor, floor: float, wide: float | None = None) -> Scale:
    """The :class:`Scale` of votes ``v`` (B, J, I, H) with variance floor ``floor`` (``wide``: see
    :func:`scale_from_top`)."""
    with torch.no_grad():
        top = (
            torch.maximum(v.amax(dim=(1, 2, 3)), -v.amin(dim=(1, 2, 3)))
            if v.numel()  # (B,): the largest |V|
            else v.new_zeros(v.shape[0])
        )
    return scale_from_top(top, v.shape[-1], floor, wide)


def scale_from_top(top: Tensor, height: int, floor: float, wide: float | None = None) -> Scale:
    """The :class:`Scale` of problems whose largest ``|V|`` is ``top`` (B,), ``height`` pose components.

    With scaled votes ``|V| <= X`` (so ``|V - c|, |mu - c| <= 2 X``) and scaled variances at least
    ``32 H X^2 / max``, every term of the E-step's quadratic form is below ``max / (8 H)``: ``X`` is as large as
    keeps that bound at the given floor (so votes up to ``X`` are not scaled and the floor not raised).

    ``wide`` (float32 votes on CUDA): the device's stand-in for routing votes beyond ``wide`` in float64,
    which would need ``top`` on the host. ``X`` is at most ``wide``, and the floor keeps its value in the scaled
    units (so a problem scaled by ``2^k`` has a floor ``2^2k`` times larger in its votes' own): the scaled
    problem is then one of votes within ``wide``, whose gradients float32 holds.
    """
    info = torch.finfo(top.dtype)
    limit = min((info.max * floor / (32.0 * height)) ** 0.5, info.max**0.5 / 4.0)  # X
    if wide is not None:
        limit = min(limit, wide)
    with torch.no_grad():
        # the smallest power of two that brings every |V| within X (the log2 of 0 is -inf: sigma 1)
        sigma = torch.exp2(torch.ceil(torch.log2(top / limit))).clamp_min(1.0)
        inv = sigma.reciprocal()
        least = 32.0 * height * limit**2 / info.max
        scaled_floor = (
            (floor * inv.square()).clamp_min(least) if wide is None else inv.new_full(inv.shape, max(floor, least))
        )
        log_var = 2.0 * sigma.log()
    return Scale(inv.view(-1, 1, 1, 1), log_var.view(-1, 1, 1), scaled_floor.view(-1, 1, 1))


def shifted_votes(v: Tensor, a_in: Tensor, eps: float, inv: Tensor) -> tuple[Tensor, Tensor]:
    """Votes about a per-parent origin, and their squares, side by side, in the units of ``inv`` (B, 1, 1, 1).

    The origin ``c`` is the activation-weighted mean vote (the first M-step's ``mu`` up to the mass
    guard), taken as a constant: the procedure is invariant to the shift, so its gradient is exact.
    Returns ``c * inv`` (B, J, 1, H) and ``xx = [x, x^2]`` with ``x = (V - c) * inv`` (B, J, I, 2H).
    """
    with torch.no_grad():
        w0 = (a_in / (a_in.sum(dim=-1, keepdim=True) + eps)).unsqueeze(2)  # (B, 1, 1, I)
        c = torch.matmul(w0, v) * inv  # (B, J, 1, H)
    if (torch.is_grad_enabled() and v.requires_grad) or torch.compiler.is_compiling():
        x = torch.addcmul(-c, v, inv)  # v * inv - c
        return c, torch.cat([x, x * x], dim=-1)
    # untracked (inference): write both halves in place, no temporaries or cat
    h = v.shape[-1]
    xx = v.new_empty(*v.shape[:-1], 2 * h)
    x = torch.addcmul(-c, v, inv, out=xx[..., :h])
    torch.mul(x, x, out=xx[..., h:])
    return c, xx


class VoteProducts(Protocol):
    """The two products of EM routing with ``xx = [x, x^2]`` (B, J, I, 2H), the shifted and scaled votes."""

    def moments(self, w: Tensor) -> Tensor:
        """``sum_i w[b, j, i] xx[b, j, i, :]``: weights (B, J, I) -> (B, J, 2H)."""

    def quadratic(self, coef: Tensor) -> Tensor:
        """``sum_k xx[b, j, i, k] coef[b, j, k]``: coefficients (B, J, 2H) -> (B, J, I)."""


class StoredVotes(NamedTuple):
    """:class:`VoteProducts` of a stored ``xx`` (B, J, I, 2H) (:func:`shifted_votes`), differentiated by autograd."""

    xx: Tensor

    def moments(self, w: Tensor) -> Tensor:
        return torch.matmul(w.unsqueeze(2), self.xx).squeeze(2)

    def quadratic(self, coef: Tensor) -> Tensor:
        return matvec(self.xx, coef.unsqueeze(-1)).squeeze(-1)


def initial_assignments(c: Tensor, a_in: Tensor, groups: ChildGroups | None) -> Tensor:
    """Uniform over each child's parents: ``1 / J``, or ``1 / (J * copies)`` with ``groups`` normalised over
    all parents (``"per_type"`` groups start at ``1 / J`` in every copy, as the released code does). (B, J, I)."""
    r = a_in.new_full((c.shape[0], c.shape[1], a_in.shape[-1]), 1.0 / c.shape[1])
    if groups is None or groups.normalize == "per_type":
        return r
    return r / groups.copies().unsqueeze(1).to(r.dtype)


def _mass_weights(r_prime: Tensor, mass: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The M-step's weights ``w = R' / (mass + eps)`` (B, J, I) and their total ``s = mass / (mass + eps)``
    (B, J, 1). With gradients, a mass below ``GRADIENT_MASS_FLOOR`` is differentiated as if it were there
    (the values are the guarded equations'; :mod:`capsnets.functional.em`)."""
    guard = mass + eps
    w, s = r_prime / guard, mass * guard.reciprocal()
    if not torch.is_grad_enabled():
        return w, s
    floored = mass.clamp_min(GRADIENT_MASS_FLOOR) + eps  # equal to guard (no change) above the floor
    w_floored, s_floored = r_prime / floored, mass * floored.reciprocal()
    return w_floored + (w - w_floored).detach(), s_floored + (s - s_floored).detach()


def _m_step(
    r_prime: Tensor,
    c: Tensor,
    votes: VoteProducts,
    beta_v: Tensor,
    beta_a: Tensor,
    lam: float,
    settings: EMSettings,
    scale: Scale,
    d_prev: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One M-step. r_prime (B, J, I), c (B, J, 1, H) -> mu - c, var (B, J, H) in the units of ``scale``,
    the real log_var (B, J, H), pre (B, J).

    With ``x = V - c`` and normalised weights ``w`` (summing to ``s = mass / (mass + eps)``):
    ``mu = m1 + s c`` and ``sum_i w (V - mu)^2 = m2 - 2 d m1 + s d^2`` where ``m1 = sum_i w x``,
    ``m2 = sum_i w x^2`` and ``d = mu - c`` (exact algebra; rounding can only make it slightly negative).
    ``d_prev``: the previous centre minus ``c``, for the released code's formulation: the centre
    ``0.9 * mean + 0.1 * previous`` and its activation logit.
    """
    eps = settings.eps
    mass = r_prime.sum(dim=2, keepdim=True)  # (B, J, 1): sum_i R'
    w, s = _mass_weights(r_prime, mass, eps)  # (B, J, I) normalised weights, guarded; (B, J, 1) sum_i w
    m1, m2 = votes.moments(w).chunk(2, dim=-1)  # (B, J, H) each
    d = m1 + (s - 1.0) * c.squeeze(2)  # (B, J, H): mu - c
    if d_prev is not None:
        d = BLEND * d + (1.0 - BLEND) * d_prev
    var = (m2 - 2.0 * d * m1 + s * d.square()).clamp_min(0.0) + scale.floor  # sigma^2 with its floor
    log_var = var.log() + scale.log_var
    if settings.official:
        height = d.shape[-1]
        win = (mass + eps).squeeze(-1) * (-log_var.sum(dim=-1) - beta_v * (height * (1.0 + LOG_2PI)))
        return d, var, log_var, lam * (win - BETA_A_SCALE * beta_a)
    cost = ((beta_v.unsqueeze(-1) + 0.5 * log_var) * mass).sum(dim=-1)  # (B, J)
    if settings.cost_normalization == "mass":  # per child and pose component of a uniform assignment: J / (I H)
        cost = cost * (cost.shape[1] / (r_prime.shape[-1] * d.shape[-1]))
    elif settings.cost_normalization == "mean_std":
        mean = cost.mean(dim=1, keepdim=True)
        cost = (cost - mean) * torch.rsqrt((cost - mean).square().mean(dim=1, keepdim=True) + eps)
    return d, var, log_var, lam * (beta_a - cost)  # pre (B, J): a_j = sigmoid(pre)


def _e_step(
    votes: VoteProducts, d: Tensor, var: Tensor, log_var: Tensor, pre: Tensor, groups: ChildGroups | None
) -> Tensor:
    """One E-step: new assignments (B, J, I), a softmax over J of log a_j + log p[i, j] (with ``groups``:
    over every parent of every copy of the child, :func:`~capsnets.functional.child_groups.group_softmax`).

    ``sum_h (V - mu)^2 / sigma^2 = sum_h x^2 / sigma^2 - 2 x d / sigma^2 + d^2 / sigma^2``: one matrix
    product with ``[x, x^2]`` (``votes.quadratic``), no (B, J, I, H) temporary (the same in any units of the votes).
    """
    inv = var.reciprocal()  # (B, J, H)
    coef = torch.cat([-2.0 * d * inv, inv], dim=-1)  # (B, J, 2H)
    quad = votes.quadratic(coef) + (d.square() * inv).sum(dim=-1, keepdim=True)  # (B, J, I)
    log_norm = log_var.sum(dim=-1, keepdim=True) + var.shape[-1] * LOG_2PI  # (B, J, 1)
    logits = F.logsigmoid(pre).unsqueeze(-1) - 0.5 * (quad + log_norm)  # (B, J, I)
    return torch.softmax(logits, dim=1) if groups is None else group_softmax(logits, groups)


def route(
    v: Tensor,
    a_in: Tensor,
    beta_v: Tensor,
    beta_a: Tensor,
    settings: EMSettings,
    groups: ChildGroups | None = None,
    wide: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The procedure on votes ``v`` (B, J, I, H), activations ``a_in`` (B, 1, I) and ``beta_v``, ``beta_a``
    ``(J,)`` or ``(1,)``, all of one float dtype: poses (B, J, H), activations (B, J), assignments (B, J, I)
    (``wide``: :func:`scale_from_top`)."""
    scale = vote_scale(v, settings.variance_floor if settings.official else settings.eps, wide)
    c, xx = shifted_votes(v, a_in, settings.eps, scale.inv)  # (B, J, 1, H), (B, J, I, 2H)
    return iterate(StoredVotes(xx), c, scale, a_in, beta_v, beta_a, settings, groups)


def iterate(
    votes: VoteProducts,
    c: Tensor,
    scale: Scale,
    a_in: Tensor,
    beta_v: Tensor,
    beta_a: Tensor,
    settings: EMSettings,
    groups: ChildGroups | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The M- and E-steps on votes seen through ``votes``, shifted by ``c`` (B, J, 1, H) and in the units of
    ``scale``; the rest as :func:`route`."""
    r = initial_assignments(c, a_in, groups)  # (B, J, I)
    d_prev = -c.squeeze(2) if settings.official else None  # official: the centre starts at 0
    lambdas = settings.inverse_temperatures
    for t, lam in enumerate(lambdas):
        last = t == len(lambdas) - 1
        # detach_routing: the assignments of the non-final iterations become constants, with no graph
        with torch.no_grad() if settings.detach_routing and not last else contextlib.nullcontext():
            d, var, log_var, pre = _m_step(r * a_in, c, votes, beta_v, beta_a, lam, settings, scale, d_prev)
            if settings.official:
                d_prev = d
            if not last:
                r = _e_step(votes, d, var, log_var, pre, groups)
    top = torch.finfo(d.dtype).max  # the poses in real units; clamped only against rounding at the very top
    mu = ((d + c.squeeze(2)) / scale.inv.squeeze(-1)).clamp(-top, top)
    return mu, torch.sigmoid(pre), r


@normalized_gradients
def route_votes(
    votes: Tensor,
    activations: Tensor,
    beta_v,
    beta_a,
    settings: EMSettings,
    child_groups: ChildGroups | None = None,
    return_assignments: bool = False,
):
    """:func:`~capsnets.functional.em_routing` with its settings resolved (the votes' shapes checked by
    :func:`~capsnets.functional.routing_common.check_votes`)."""
    check_child_groups(child_groups, tuple(votes.shape[:2]), "votes")
    out = votes.dtype if votes.dtype in (torch.float32, torch.float64) else torch.float32
    dtype, wide = out, None
    if checking() and votes.numel():  # one check of the activations' range and of the votes' magnitude
        check_activations(activations)
        if host_reads(votes.device):
            with torch.no_grad():
                low, high = torch.aminmax(votes.detach())
            dtype = routing_dtype(votes.dtype, max(-float(low), float(high)), votes.device)
        else:
            wide = device_scale_limit(dtype)
    with without_autocast(votes.device.type):
        v = votes.to(dtype).permute(0, 2, 1, 3).contiguous()  # (B, J, I, H)
        a_in = activations.to(dtype).unsqueeze(1)  # (B, 1, I)
        beta_v = check_beta(beta_v, "beta_v", v.shape[1], v)  # (J,) or (1,)
        beta_a = check_beta(beta_a, "beta_a", v.shape[1], v)
        mu, a_out, r = route(v, a_in, beta_v, beta_a, settings, child_groups, wide)
        mu, a_out, r = mu.to(out), a_out.to(out), r.to(out)
    if return_assignments:
        return mu, a_out, r.transpose(1, 2)
    return mu, a_out
