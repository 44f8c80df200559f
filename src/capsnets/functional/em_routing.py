"""EM routing between matrix capsules.

Hinton, Sabour & Frosst (2018), "Matrix capsules with EM routing", ICLR, Sec. 3, Procedure 1, in two
formulations (``docs/em_formulations.md`` compares them, with the IBM reproduction, line by line).

Dimension legend: ``B`` batch (for a convolutional capsule layer: batch * output positions, folded),
``I`` child capsules (the K*K*types capsules of a receptive field), ``J`` parent capsule types,
``H`` pose components (16 for a 4x4 pose matrix).

``formulation="paper"``, Procedure 1 as printed (one Gaussian cluster per parent over the H components):

- ``R = 1/J``; repeat ``iterations`` times:
  M-step: ``R' = R * a_i``; ``mu = sum_i R' V / sum_i R'``; ``sigma^2 = sum_i R' (V - mu)^2 / sum_i R'``;
  ``cost[j,h] = (beta_v[j] + log sigma[j,h]) * sum_i R'[i,j]``;
  ``a_j = logistic(lambda_t * (beta_a[j] - sum_h cost[j,h]))``.
  E-step (skipped after the last M-step): ``log p[i,j] = sum_h log N(V[i,j,h]; mu[j,h], sigma^2[j,h])``;
  ``R[i,:] = softmax_j(log a_j + log p[i,j])``.
- returns ``mu`` (the parents' poses) and ``a`` (their activations).

``formulation="official"``, the equations of the authors' released code (google-research/google-research,
``capsule_em/em_layers.py``, ``update_em_routing`` and ``update_conv_routing``). The same loop, except:

- the mass is guarded, ``m_j = sum_i R' + eps`` (1e-7 in convolutional layers, 1e-5 in the class layer),
  and used everywhere, the logit included;
- the centre keeps a tenth of the previous iteration's: ``mu = 0.9 sum_i R' V / m_j + 0.1 mu_prev``, with
  ``mu_prev = 0`` before the first iteration; the variance is taken about that centre, plus a floor 5e-4;
- the activation logit is ``lambda_t (m_j (-sum_h log sigma^2_h - beta_v H (1 + log 2 pi)) - 5000
  beta_a)``: the log variance is not halved, ``beta_v`` (the paper's ``beta_u``) scales the Gaussian's
  entropy constant, and ``beta_a`` enters with a factor -5000;
- ``lambda_t = final (1 - 0.95^(t+1))`` with ``final = 0.01``, divided by 4 in the class layer
  (:meth:`EMRouting.official`);
- in convolutional layers a child's assignments are normalised per parent type over the positions that
  see it (``assignment_scope="per_type"`` of :class:`~capsnets.layers.ConvMatrixCapsules`).

Inverse temperature (``inverse_temperature=None``): ``lambda_t = 0.01 (1 - 0.95^(t+1))`` for ``t = 0 ..
iterations-1`` in every layer, the schedule the authors gave on OpenReview
(https://openreview.net/forum?id=HJWLfGWRb) and the one the IBM reproduction uses
(github.com/IBM/matrix-capsules-with-em-routing, ``em_routing.py``, ``final_lambda=0.01``; that
reproduction also scales the cost by ``100 J / I``). Pass ``inverse_temperature`` for any other.

Numerical safety (everything that can be in log space is):
- a variance floor (``eps`` with the paper's formulation, 1e-6 by default; ``variance_floor`` with the
  official one) is added to every ``sigma^2``, so zero-variance clusters give a finite ``log sigma``;
- ``sum_i R'`` is guarded by ``eps`` in the denominators of ``mu`` and ``sigma^2``, so a parent that
  receives no mass (all activations zero) gets ``mu = 0``, not ``0/0``;
- ``log a_j`` is ``logsigmoid`` of the pre-activation and the assignments are a log-space softmax;
- half-precision inputs (and calls under ``torch.autocast``) are computed in float32 with autocast
  disabled inside; results are float32 for float16/bfloat16 inputs, the input dtype otherwise;
- (not in the paper) the votes of a routing problem whose largest ``|V|`` exceeds
  ``X = sqrt(finfo.max * floor / (32 H))`` (8e14 in float32 with the floor 1e-6 and H = 16), beyond which
  their squares over the floor would overflow the E-step, are divided by a power of two ``2^k`` that brings
  them within ``X``, and put back exactly (poses times ``2^k``, log variances plus ``2k log 2``); the floor
  stays the same in those units, so it is ``2^2k`` times larger in the votes' own (still a fixed fraction of
  ``X^2``). Every finite input then gives finite outputs, and votes up to ``X`` the values as before;
- (not in the paper) where a parent's mass ``sum_i R'`` is below ``1e-3``, ``mu`` and ``sigma^2`` are
  differentiated as if it were ``1e-3`` (the guarded equations' own slope there is ``1 / eps``), so the
  gradients of the activations stay bounded when they are all zero. Values are unchanged.

Convolutional layers fold output positions into ``B``, so by default each position's parents are routed
as their own problem. ``child_groups`` (:mod:`capsnets.functional.child_groups`) ties the copies of a
child seen by several positions together: its assignments are normalised over every parent of every
position that sees it (Gritzman 2019, arXiv 1907.00652, pitfall 3; the IBM reproduction), or per parent
type over those positions (the authors' code). The M-step is unchanged.

Deviations, off by default (paper formulation only): ``cost_normalization="mean_std"`` replaces ``sum_h
cost[j]`` by its standardisation across the J parents of each example, ``(c_j - mean_j c) / sqrt(var_j c
+ eps)``, as in Yang's reproduction (github.com/gyang274/capsulesEM); ``cost_normalization="mass"`` divides
the cost by ``I H / J``, a per-layer inverse temperature ``lambda J / (I H)`` (a reparameterisation:
tested as an identity). ``benchmarks/README.md`` records how fast each variant learns.

Gradients flow through every iteration (the procedure differentiated literally) unless
``detach_routing=True``, which computes the assignments of the non-final iterations without gradient.

Implementation (same values as the equations): votes are laid out once as ``(B, J, I, H)``, shifted by a
per-parent origin ``c`` (the activation-weighted mean vote, a constant: every quantity is computed by exact
algebra from ``V - c``, so nothing depends on ``c``), divided by the problem's power of two (above), and stored
once as ``xx = [V - c, (V - c)^2]`` ``(B, J, I, 2H)``. Each M-step is one batched product ``w @ xx`` giving
``sum_i w x`` and ``sum_i w x^2`` (the variance about any centre follows by exact algebra, clamped at 0 against
rounding), each E-step one product ``xx @ [-2 d / sigma^2, 1 / sigma^2]`` (as a row times ``xx^T``,
:func:`~capsnets.functional.products.matvec`): no ``(B, J, I, H)`` temporary per iteration. In eager
training :class:`_EMFunction` supplies the backward: ``d loss / d xx`` is a sum of outer products, formed
by one product of inner size ``2 * iterations - 1`` instead of one full-size tensor per use; under
``torch.compile`` (and without gradients) plain autograd runs through the same code.

Matrix capsule layers call :func:`em_routing_poses` (poses and transforms instead of votes). On the CPU it
uses the fused kernel of :mod:`capsnets.functional.em_kernel`: the products with ``xx`` are computed from the
poses without storing the votes, the iterations that need no gradient run whole in C++, and exact gradients
(without cost normalisation) come from :func:`_manual_backward`, the procedure's derivative written out by
hand, instead of an autograd replay. Elsewhere it forms the votes and calls :func:`em_routing`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from capsnets.functional.child_groups import ChildGroups, group_softmax
from capsnets.functional.em_kernel import fused_kernel
from capsnets.functional.products import matrix_votes, matvec

_LOG_2PI = math.log(2.0 * math.pi)
_COST_NORMALIZATIONS = (None, "mean_std", "mass")
_FORMULATIONS = ("paper", "official")
_BLEND = 0.9  # official: the weight of the new mean in the centre update
_BETA_A_SCALE = 5000.0  # official: beta_a's factor in the activation logit
_GRADIENT_MASS_FLOOR = 1e-3  # below this mass, mu and sigma^2 are differentiated as if at it (module docstring)
#: The released code's settings: variance floor, and mass guards of convolutional and class capsule layers.
OFFICIAL_VARIANCE_FLOOR = 5e-4
OFFICIAL_MASS_EPS = {"conv": 1e-7, "class": 1e-5}


def em_inverse_temperatures(iterations: int, final: float = 0.01, decay: float = 0.95) -> list[float]:
    """Default schedule ``lambda_t = final * (1 - decay ** (t + 1))``, ``t = 0 .. iterations - 1`` (see the
    module docstring).

    Examples::

        >>> [round(x, 6) for x in em_inverse_temperatures(3)]
        [0.0005, 0.000975, 0.001426]
    """
    return [final * (1.0 - decay ** (t + 1)) for t in range(iterations)]


@dataclass(frozen=True)
class EMRouting:
    """EM routing as a value to pass to a matrix capsule layer. Its defaults are the library's defaults of EM
    routing: layers and model builders that are given no routing use ``EMRouting()``.

    Args:
        iterations: EM iterations (>= 1; the paper uses 3). The last one is an M-step only.
        inverse_temperature: ``lambda``: ``None`` for the default schedule (module docstring), a number
            for every iteration, or a sequence of ``iterations`` numbers. Stored as the resolved schedule.
        eps: mass guard, and the paper formulation's variance floor (see :func:`em_routing`); None: the
            formulation's default, stored resolved.
        cost_normalization: ``None``, ``"mean_std"`` or ``"mass"`` (see :func:`em_routing`).
        detach_routing: compute the assignments of the non-final iterations without gradient (see
            :func:`em_routing`).
        formulation: ``"paper"`` or ``"official"`` (see :func:`em_routing`); :meth:`official` builds the
            released code's routing of a convolutional or class capsule layer.
        variance_floor: official formulation only (see :func:`em_routing`); None: its default, stored resolved.

    Shape:
        ``votes (B, I, J, H), activations (B, I), beta_v (J,), beta_a (J,) -> (B, J, H), (B, J)``

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
        eps, variance_floor = _resolve_formulation(self.formulation, self.eps, self.variance_floor)
        _check_settings(self.iterations, eps, self.cost_normalization, self.formulation, variance_floor)
        if not isinstance(self.detach_routing, bool):
            raise ValueError(f"detach_routing must be True or False, got {self.detach_routing!r}")
        iterations = int(self.iterations)
        resolved = {"iterations": iterations, "eps": float(eps), "variance_floor": variance_floor,
                    "inverse_temperature": tuple(_resolve_lambdas(self.inverse_temperature, iterations))}
        for name, value in resolved.items():  # frozen: the resolved settings, set once
            object.__setattr__(self, name, value)

    @property
    def inverse_temperatures(self) -> list[float]:
        """The inverse temperature of each iteration, ``lambda_0 .. lambda_{iterations-1}``."""
        return list(self.inverse_temperature)

    @classmethod
    def official(cls, iterations: int = iterations, *, layer: str = "conv", final_inverse_temperature: float = 0.01,
                 detach_routing: bool = detach_routing) -> "EMRouting":
        """The released code's routing for a ``"conv"`` or ``"class"`` capsule layer: the official
        formulation, ``lambda_t = final (1 - 0.95^(t+1))`` with ``final`` divided by 4 in the class layer,
        variance floor 5e-4, mass guard 1e-7 (conv) or 1e-5 (class)."""
        if layer not in OFFICIAL_MASS_EPS:
            raise ValueError(f"layer must be 'conv' or 'class', got {layer!r}")
        final = final_inverse_temperature / 4.0 if layer == "class" else final_inverse_temperature
        return cls(iterations, em_inverse_temperatures(int(iterations), final=final), eps=OFFICIAL_MASS_EPS[layer],
                   detach_routing=detach_routing, formulation="official")

    def __call__(self, votes, activations, beta_v, beta_a, return_assignments: bool = False,
                 child_groups: ChildGroups | None = None):
        return em_routing(
            votes, activations, beta_v, beta_a, self.iterations,
            inverse_temperature=self.inverse_temperature, return_assignments=return_assignments,
            eps=self.eps, cost_normalization=self.cost_normalization,
            detach_routing=self.detach_routing, child_groups=child_groups,
            formulation=self.formulation, variance_floor=self.variance_floor,
        )

    def route_poses(self, poses, weight, activations, beta_v, beta_a, coordinates=None, return_assignments: bool = False,
                    child_groups: ChildGroups | None = None):
        """This routing of the votes ``poses @ weight`` (:func:`em_routing_poses`: with the fused CPU kernel
        where it applies, so the votes are never stored)."""
        return em_routing_poses(
            poses, weight, activations, beta_v, beta_a, self.iterations, coordinates=coordinates,
            inverse_temperature=self.inverse_temperature, return_assignments=return_assignments,
            eps=self.eps, cost_normalization=self.cost_normalization,
            detach_routing=self.detach_routing, child_groups=child_groups,
            formulation=self.formulation, variance_floor=self.variance_floor,
        )

    def to_config(self) -> dict:
        """The JSON-able spec of this routing, every setting resolved
        (:func:`~capsnets.functional.routing_from_config` rebuilds it)."""
        return {"type": "em", "iterations": self.iterations, "inverse_temperature": list(self.inverse_temperature),
                "eps": self.eps, "cost_normalization": self.cost_normalization,
                "detach_routing": self.detach_routing, "formulation": self.formulation,
                "variance_floor": self.variance_floor}

    def __repr__(self) -> str:
        lams = ", ".join(f"{x:.3g}" for x in self.inverse_temperature)
        extra = (f", formulation='official', variance_floor={self.variance_floor}"
                 if self.formulation == "official" else f", cost_normalization={self.cost_normalization!r}")
        return (f"EMRouting(iterations={self.iterations}, inverse_temperature=[{lams}], eps={self.eps}"
                f"{extra}, detach_routing={self.detach_routing})")


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
    # Python numbers straight to the votes' dtype (via float32 they would lose digits that 5000 * beta_a shows)
    beta = torch.as_tensor(beta, device=like.device, dtype=None if isinstance(beta, Tensor) else like.dtype)
    if beta.numel() == 1:
        return beta.reshape(1).to(like.dtype)
    if beta.shape != (parents,):
        raise ValueError(
            f"{name} must have shape (J,) = ({parents},) (one per parent type) or be a scalar; "
            f"got shape {tuple(beta.shape)}"
        )
    return beta.to(like.dtype)


def _check_settings(iterations, eps, cost_normalization, formulation="paper", variance_floor=None) -> None:
    if int(iterations) != iterations or iterations < 1:
        raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a number > 0, got {eps!r}")
    if cost_normalization not in _COST_NORMALIZATIONS:
        raise ValueError(
            f"cost_normalization must be one of {_COST_NORMALIZATIONS}, got {cost_normalization!r}"
        )
    if formulation not in _FORMULATIONS:
        raise ValueError(f"formulation must be one of {_FORMULATIONS}, got {formulation!r}")
    if formulation == "official" and cost_normalization is not None:
        raise ValueError(f"cost_normalization applies to the paper's cost; formulation='official' has its own "
                         f"activation logit, so cost_normalization must be None (got {cost_normalization!r})")
    if variance_floor is not None and (formulation != "official" or not isinstance(variance_floor, (int, float))
                                       or not variance_floor > 0):
        raise ValueError(f"variance_floor must be None (paper: eps is the floor) or, with formulation='official', "
                         f"a number > 0; got {variance_floor!r} with formulation={formulation!r}")


def _resolve_formulation(formulation, eps, variance_floor):
    """``(eps, variance_floor)`` with the defaults of ``formulation`` filled in (floor None for the paper)."""
    if formulation == "official":
        return (OFFICIAL_MASS_EPS["class"] if eps is None else eps,
                OFFICIAL_VARIANCE_FLOOR if variance_floor is None else variance_floor)
    return (1e-6 if eps is None else eps), variance_floor


def _check_inputs(votes: Tensor, activations: Tensor, iterations, eps, cost_normalization, formulation,
                  variance_floor) -> None:
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
    _check_settings(iterations, eps, cost_normalization, formulation, variance_floor)


def _check_child_groups(child_groups, shape: tuple, of: str) -> None:
    if child_groups is not None and (not isinstance(child_groups, ChildGroups)
                                     or tuple(child_groups.index.shape) != shape):
        got = tuple(child_groups.index.shape) if isinstance(child_groups, ChildGroups) else type(child_groups).__name__
        raise ValueError(f"child_groups must be a ChildGroups whose index has the {of}' (B, I) = {shape}; got {got}")


class _Scale(NamedTuple):
    """The units of one batch of routing problems (module docstring): each problem's votes are handled
    divided by ``sigma``, a power of two (1 unless they are large enough for their squares to overflow)."""

    inv: Tensor  # (B, 1, 1, 1): 1 / sigma
    log_var: Tensor  # (B, 1, 1): 2 log sigma, which turns the log of a scaled variance into the real one
    floor: Tensor  # (B, 1, 1): the variance floor in scaled units


def _vote_scale(v: Tensor, floor: float) -> _Scale:
    """The :class:`_Scale` of votes ``v`` (B, J, I, H) with variance floor ``floor``."""
    with torch.no_grad():
        top = (torch.maximum(v.amax(dim=(1, 2, 3)), -v.amin(dim=(1, 2, 3))) if v.numel()  # (B,): the largest |V|
               else v.new_zeros(v.shape[0]))
    return _scale_from_top(top, v.shape[-1], floor)


def _scale_from_top(top: Tensor, height: int, floor: float) -> _Scale:
    """The :class:`_Scale` of problems whose largest ``|V|`` is ``top`` (B,), ``height`` pose components.

    With scaled votes ``|V| <= X`` (so ``|V - c|, |mu - c| <= 2 X``) and scaled variances at least
    ``32 H X^2 / max``, every term of the E-step's quadratic form is below ``max / (8 H)``: ``X`` is as large as
    keeps that bound at the given floor (so votes up to ``X`` are not scaled and the floor not raised).
    """
    info = torch.finfo(top.dtype)
    limit = min((info.max * floor / (32.0 * height)) ** 0.5, info.max**0.5 / 4.0)  # X
    with torch.no_grad():
        # the smallest power of two that brings every |V| within X (the log2 of 0 is -inf: sigma 1)
        sigma = torch.exp2(torch.ceil(torch.log2(top / limit))).clamp_min(1.0)
        inv = sigma.reciprocal()
        scaled_floor = (floor * inv.square()).clamp_min(32.0 * height * limit**2 / info.max)
        log_var = 2.0 * sigma.log()
    return _Scale(inv.view(-1, 1, 1, 1), log_var.view(-1, 1, 1), scaled_floor.view(-1, 1, 1))


def _shifted_votes(v: Tensor, a_in: Tensor, eps: float, inv: Tensor) -> tuple[Tensor, Tensor]:
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
    # Untracked (inference, or _EMFunction's forward): write both halves in place, no temporaries or cat.
    h = v.shape[-1]
    xx = v.new_empty(*v.shape[:-1], 2 * h)
    x = torch.addcmul(-c, v, inv, out=xx[..., :h])
    torch.mul(x, x, out=xx[..., h:])
    return c, xx


def _mass_weights(r_prime: Tensor, mass: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The M-step's weights ``w = R' / (mass + eps)`` (B, J, I) and their total ``s = mass / (mass + eps)``
    (B, J, 1). With gradients, a mass below ``_GRADIENT_MASS_FLOOR`` is differentiated as if it were there
    (the values are the guarded equations'; module docstring)."""
    guard = mass + eps
    w, s = r_prime / guard, mass * guard.reciprocal()
    if not torch.is_grad_enabled():
        return w, s
    floored = mass.clamp_min(_GRADIENT_MASS_FLOOR) + eps  # equal to guard (no change) above the floor
    w_floored, s_floored = r_prime / floored, mass * floored.reciprocal()
    return w_floored + (w - w_floored).detach(), s_floored + (s - s_floored).detach()


def _m_step(r_prime, c, contract, beta_v, beta_a, lam, eps, cost_normalization, scale, d_prev=None):
    """One M-step. r_prime (B, J, I), c (B, J, 1, H) -> mu - c, var (B, J, H) in the units of ``scale``
    (a :class:`_Scale`), the real log_var (B, J, H), pre (B, J).

    With ``x = V - c`` and normalised weights ``w`` (summing to ``s = mass / (mass + eps)``):
    ``mu = m1 + s c`` and ``sum_i w (V - mu)^2 = m2 - 2 d m1 + s d^2`` where ``m1 = sum_i w x``,
    ``m2 = sum_i w x^2`` and ``d = mu - c`` (exact algebra; rounding can only make it slightly negative).
    ``d_prev``: the previous centre minus ``c``, for the released code's formulation (module docstring): the
    centre ``0.9 * mean + 0.1 * previous`` and its activation logit.
    """
    mass = r_prime.sum(dim=2, keepdim=True)  # (B, J, 1): sum_i R'
    w, s = _mass_weights(r_prime, mass, eps)  # (B, J, I) normalised weights, guarded; (B, J, 1) sum_i w
    m1, m2 = contract("m", w.unsqueeze(2)).squeeze(2).chunk(2, dim=-1)  # (B, J, H) each
    d = m1 + (s - 1.0) * c.squeeze(2)  # (B, J, H): mu - c
    if d_prev is not None:
        d = _BLEND * d + (1.0 - _BLEND) * d_prev
        var = (m2 - 2.0 * d * m1 + s * d.square()).clamp_min(0.0) + scale.floor
        log_var = var.log() + scale.log_var
        height = d.shape[-1]
        win = (mass + eps).squeeze(-1) * (-log_var.sum(dim=-1) - beta_v * (height * (1.0 + _LOG_2PI)))
        return d, var, log_var, lam * (win - _BETA_A_SCALE * beta_a)
    var = (m2 - 2.0 * d * m1 + s * d.square()).clamp_min(0.0) + scale.floor  # sigma^2 with its floor
    log_var = var.log() + scale.log_var
    cost = ((beta_v.unsqueeze(-1) + 0.5 * log_var) * mass).sum(dim=-1)  # (B, J)
    if cost_normalization == "mass":  # per child and pose component of a uniform assignment: J / (I H)
        cost = cost * (cost.shape[1] / (r_prime.shape[-1] * d.shape[-1]))
    elif cost_normalization == "mean_std":
        mean = cost.mean(dim=1, keepdim=True)
        cost = (cost - mean) * torch.rsqrt((cost - mean).square().mean(dim=1, keepdim=True) + eps)
    pre = lam * (beta_a - cost)  # (B, J): a_j = sigmoid(pre)
    return d, var, log_var, pre


def _e_step(contract, d, var, log_var, pre, groups):
    """One E-step: new assignments (B, J, I), a softmax over J of log a_j + log p[i, j] (with ``groups``:
    over every parent of every copy of the child, :func:`~capsnets.functional.child_groups.group_softmax`).

    ``sum_h (V - mu)^2 / sigma^2 = sum_h x^2 / sigma^2 - 2 x d / sigma^2 + d^2 / sigma^2``: one matrix
    product with the stored ``[x, x^2]``, no (B, J, I, H) temporary (the same in any units of the votes).
    """
    inv = var.reciprocal()  # (B, J, H)
    coef = torch.cat([-2.0 * d * inv, inv], dim=-1).unsqueeze(-1)  # (B, J, 2H, 1)
    quad = contract("e", coef).squeeze(-1) + (d.square() * inv).sum(dim=-1, keepdim=True)  # (B, J, I)
    log_norm = log_var.sum(dim=-1, keepdim=True) + var.shape[-1] * _LOG_2PI  # (B, J, 1)
    logits = F.logsigmoid(pre).unsqueeze(-1) - 0.5 * (quad + log_norm)  # (B, J, I)
    return torch.softmax(logits, dim=1) if groups is None else group_softmax(logits, groups)


class _DenseVotes:
    """The votes as a stored ``xx = [x, x^2]`` (B, J, I, 2H): the two products of the procedure with it.

    ``m(w)``: weights (B, J, 1, I) -> ``w @ xx`` (B, J, 1, 2H); ``e(coef)``: coefficients (B, J, 2H, 1) ->
    ``xx @ coef`` (B, J, I, 1). :class:`_FusedVotes` computes the same products without storing ``xx``.
    """

    def __init__(self, xx: Tensor) -> None:
        self.xx = xx

    def m(self, w: Tensor) -> Tensor:
        return torch.matmul(w, self.xx)

    def e(self, coef: Tensor) -> Tensor:
        return matvec(self.xx, coef)

    def contract(self, kind: str, operand: Tensor) -> Tensor:
        return self.m(operand) if kind == "m" else self.e(operand)


class _FusedVotes(_DenseVotes):
    """The votes ``V[n, i, j] = M[n, i] W[i % Iw, j]`` (+ coordinates), never stored: each product with
    ``[x, x^2]``, ``x = V inv - c``, is computed from the poses by the fused kernel
    (:mod:`capsnets.functional.em_kernel`)."""

    def __init__(self, kernel, pose: Tensor, weight: Tensor, coord: Tensor, c: Tensor, inv: Tensor) -> None:
        self.kernel, self.pose, self.weight, self.coord = kernel, pose, weight, coord
        self.c, self.inv = c.squeeze(2).contiguous(), inv.reshape(-1).contiguous()  # (B, J, H), (B,)

    def m(self, w: Tensor) -> Tensor:
        args = (self.pose, self.weight, self.coord, self.c, self.inv, w.squeeze(2).contiguous())
        return self.kernel.m_product(*args).unsqueeze(2)

    def e(self, coef: Tensor) -> Tensor:
        args = (self.pose, self.weight, self.coord, self.c, self.inv, coef.squeeze(-1).contiguous())
        return self.kernel.e_product(*args).unsqueeze(-1)


def _initial_assignments(c, a_in, groups):
    """Uniform over each child's parents: ``1 / J``, or ``1 / (J * copies)`` with ``groups`` normalised over
    all parents (``"per_type"`` groups start at ``1 / J`` in every copy, as the released code does). (B, J, I)."""
    r = a_in.new_full((c.shape[0], c.shape[1], a_in.shape[-1]), 1.0 / c.shape[1])
    if groups is None or groups.normalize == "per_type":
        return r
    return r / groups.copies().unsqueeze(1).to(r.dtype)


def _route(c, contract, a_in, beta_v, beta_a, lambdas, eps, cost_normalization, detach_routing, groups,
           variance_floor, scale, head=None):
    """The procedure on shifted votes, seen only through ``contract``: poses, activations, assignments.

    ``variance_floor`` None: the paper's procedure (``eps`` is floor and guard); a number: the released
    code's formulation (module docstring). ``scale`` (a :class:`_Scale`): the units of ``c`` and of the
    votes behind ``contract``, and the variance floor in them. ``head``: ``(r, d)`` after every iteration
    but the last, computed without gradients elsewhere (:func:`_fused_head`); only the last M-step runs here."""
    r = _initial_assignments(c, a_in, groups)  # (B, J, I)
    d_prev = None if variance_floor is None else -c.squeeze(2)  # official: the centre starts at 0

    def m_step(r_, lam):
        nonlocal d_prev
        out = _m_step(r_ * a_in, c, contract, beta_v, beta_a, lam, eps, cost_normalization, scale, d_prev)
        if d_prev is not None:
            d_prev = out[0]
        return out

    if head is not None and len(lambdas) > 1:
        r, d_head = head
        d_prev = None if d_prev is None else d_head
        lambdas = lambdas[-1:]
    elif detach_routing and len(lambdas) > 1:
        with torch.no_grad():  # the assignments become constants: no graph for these iterations
            for lam in lambdas[:-1]:
                d, var, log_var, pre = m_step(r, lam)
                r = _e_step(contract, d, var, log_var, pre, groups)
        lambdas = lambdas[-1:]
    for t, lam in enumerate(lambdas):
        d, var, log_var, pre = m_step(r, lam)
        if t < len(lambdas) - 1:
            r = _e_step(contract, d, var, log_var, pre, groups)
    top = torch.finfo(d.dtype).max  # the poses in real units; clamped only against rounding at the very top
    mu = ((d + c.squeeze(2)) / scale.inv.squeeze(-1)).clamp(-top, top)
    return mu, torch.sigmoid(pre), r


class _Replay(torch.autograd.Function):
    """A product with the votes (``source``, a :class:`_DenseVotes`) replayed from its forward value; its
    gradient for the votes goes to ``sink`` as outer-product factors."""

    @staticmethod
    def forward(ctx, operand, value, source, kind, sink):
        ctx.save_for_backward(operand)
        ctx.source, ctx.kind, ctx.sink = source, kind, sink
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        # Detached: the saved operand carries this node in its graph, and ``sink`` is reachable from this
        # node's ctx, so keeping the attached tensor would make a cycle through the autograd graph that
        # Python's garbage collector cannot see (every training step's graph would stay in memory).
        operand = ctx.saved_tensors[0].detach()
        if ctx.kind == "m":  # value = operand @ xx: d xx = operand^T grad, an outer product (I) x (2H)
            ctx.sink.append((operand.transpose(-1, -2), grad))
            return ctx.source.e(grad.mT).mT, None, None, None, None  # grad @ xx^T
        ctx.sink.append((grad, operand.transpose(-1, -2)))  # value = xx @ operand: d xx = grad operand^T
        return ctx.source.m(grad.mT).mT, None, None, None, None  # xx^T @ grad


def _recording(ctx, source: _DenseVotes):
    """``contract`` on ``source`` that keeps every product's value in ``ctx.values`` for the backward."""
    ctx.values = []

    def record(kind, operand):
        ctx.values.append(source.contract(kind, operand))
        return ctx.values[-1]

    return record


def _replay(ctx, source: _DenseVotes, c, a_in, beta_v, beta_a, g_outs, head=None, live: bool = False):
    """The backward of the small-tensor part of :func:`_route`, replayed from the recorded products (or,
    with ``live``, from products computed again by ``source``: the forward did not record them all).

    Returns the gradients of ``(a_in, beta_v, beta_a)`` and the outer-product factors ``(left, right)``
    of ``d loss / d xx = cat(left, -1) @ cat(right, -2)``, ``left`` (B, J, I, K), ``right`` (B, J, K, 2H)."""
    replayed, sink = iter(ctx.values), []
    leaves = [t.detach().requires_grad_() for t in (a_in, beta_v, beta_a)]

    def value(kind, op):
        return source.contract(kind, op.detach()) if live else next(replayed)

    with torch.enable_grad():
        out = _route(c, lambda kind, op: _Replay.apply(op, value(kind, op), source, kind, sink), *leaves,
                     *ctx.settings, head=head)
        pairs = [(o, g) for o, g in zip(out, g_outs) if g is not None and o.requires_grad]
        grads = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
    if not sink:
        return grads, None, None
    return grads, torch.cat([lhs for lhs, _ in sink], dim=-1), torch.cat([rhs for _, rhs in sink], dim=-2)


class _EMFunction(torch.autograd.Function):
    """EM routing with a lean backward (same values and gradients as autograd through :func:`_route`).

    Every use of the votes is a product with ``xx``, so ``d loss / d xx`` is a sum of 2 * iterations - 1
    outer products. Autograd would materialise and add a full (B, J, I, 2H) tensor for each; here the
    backward replays the small-tensor part of the procedure from the saved product values, collects the
    outer-product factors and forms ``d xx`` with one matrix product of inner size 2 * iterations - 1.
    """

    @staticmethod
    def forward(ctx, v, a_in, beta_v, beta_a, lambdas, eps, cost_normalization, detach_routing, groups,
                variance_floor, scale):
        c, xx = _shifted_votes(v, a_in, eps, scale.inv)
        ctx.settings = (lambdas, eps, cost_normalization, detach_routing, groups, variance_floor, scale)
        out = _route(c, _recording(ctx, _DenseVotes(xx)), a_in, beta_v, beta_a, *ctx.settings)
        ctx.save_for_backward(c, xx, a_in, beta_v, beta_a)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_mu, g_a, g_r):
        c, xx, a_in, beta_v, beta_a = ctx.saved_tensors
        grads, left, right = _replay(ctx, _DenseVotes(xx), c, a_in, beta_v, beta_a, (g_mu, g_a, g_r))
        grad_v = None
        if left is not None and ctx.needs_input_grad[0]:
            inv = ctx.settings[-1].inv  # (B, 1, 1, 1): d x / d v
            g1, g2 = torch.matmul(left * inv, right).chunk(2, dim=-1)
            h = g1.shape[-1]
            grad_v = torch.addcmul(g1, xx[..., :h], g2, value=2.0)  # through xx = [x, x^2], x = (v - c) inv
        return (grad_v, *grads, None, None, None, None, None, None, None)


def _group_sum(x: Tensor, groups: ChildGroups | None, expand: bool = True) -> Tensor:
    """For each slot of ``x`` (B, J, I), the sum of ``x`` over the slots and parents its assignments are
    normalised over (the softmax's normaliser: over J, or :func:`group_softmax`'s groups). Where that sum is
    the same for every parent (no groups, or ``"all_parents"``), ``expand=False`` returns it as (B, 1, I)."""
    if groups is None:
        total = x.sum(dim=1, keepdim=True)
        return total.expand_as(x) if expand else total
    n, parents, i = x.shape
    if groups.normalize == "per_type":
        types = torch.arange(parents, device=x.device).view(1, parents, 1)
        flat = (groups.index.unsqueeze(1) * parents + types).reshape(-1)
        total = x.new_zeros(groups.count * parents).index_add_(0, flat, x.reshape(-1))
        return total.index_select(0, flat).view(n, parents, i)  # index_select: several times faster than [flat]
    flat = groups.index.reshape(-1)
    total = x.new_zeros(groups.count).index_add_(0, flat, x.sum(dim=1).reshape(-1))
    total = total.index_select(0, flat).view(n, 1, i)
    return total.expand_as(x) if expand else total


def _reduce_like(grad: Tensor, like: Tensor) -> Tensor:
    """``grad`` (B, J) summed to the shape of a ``beta`` (``(J,)`` or ``(1,)``)."""
    grad = grad.sum(dim=0)
    return grad.sum().reshape(1) if like.numel() == 1 else grad


def _manual_backward(saved, source, c, a_in, beta_v, beta_a, lambdas, eps, groups, variance_floor, scale,
                     g_mu, g_a, g_r):
    """The exact gradients of the procedure (without cost normalisation) kept by :func:`_fused_saving`, by hand
    (the derivative of each equation of the M- and E-steps in reverse order), all in the kernel: for each
    iteration, the per-parent algebra before its M-step (``mstep_parents``: the variance about the centre,
    the centre and the activation logit), the M-step's per-child work (``mstep_back``, with the product that
    needs the votes of ``source``), the child groups' sums (``group_sum``), the E-step's per-child work
    (``estep_back``) and the per-parent algebra after it (``estep_parents``: the log densities' parameters).
    No autograd graph of the procedure is built. Returns the gradients of ``a_in``, ``beta_v``, ``beta_a``
    and the votes' outer-product factors ``(left (K, B, J, I), right (B, J, K, 2H))``, both written in place
    by the kernel."""
    official = variance_floor is not None
    cc = c.squeeze(2).contiguous()  # (B, J, H)
    height = cc.shape[-1]
    last_pre = saved[-1]["pre"]
    # the state carried from step to step, updated in place by the kernel
    g_d = torch.zeros_like(cc) if g_mu is None else (g_mu / scale.inv.view(-1, 1, 1)).contiguous()
    g_pre = (torch.zeros_like(last_pre) if g_a is None
             else (g_a * torch.sigmoid(last_pre) * torch.sigmoid(-last_pre)).contiguous())
    g_var = torch.zeros_like(cc)  # from the E-step that used this iteration's parameters
    g_sum_log, g_bv, g_ba = (torch.zeros_like(last_pre) for _ in range(3))
    n, _, children = a_in.shape
    a_flat = a_in.reshape(n, children).contiguous()
    g_a_in = a_in.new_zeros(n, children)  # accumulated in place by the kernel
    no_extra = a_in.new_empty(0)
    g_r_extra = no_extra if g_r is None else g_r.contiguous()
    kernel, votes = source.kernel, (source.pose, source.weight, source.coord, source.c, source.inv)
    bv = beta_v.expand(cc.shape[1]).contiguous()
    left = a_in.new_empty(2 * len(lambdas) - 1, *saved[0]["r"].shape)  # (K, B, J, I)
    right = a_in.new_empty(*cc.shape[:2], len(left), 2 * height)  # (B, J, K, 2H)
    constants = (official, _GRADIENT_MASS_FLOOR, _BLEND, _BETA_A_SCALE)
    col = 0
    for t in range(len(lambdas) - 1, -1, -1):
        st = saved[t]
        coef, guard, floored, slope, base = kernel.mstep_parents(
            st["m"], st["d"], st["var"], st["log_var"], st["mass"], cc, bv, g_d, g_var, g_pre, g_sum_log, g_bv, g_ba,
            right, col, float(lambdas[t]), float(eps), *constants)
        # per child: g_w = [x, x^2] . coef; g_R' = g_w / floored + g_mass; d a_in += sum_j g_R' r;
        # left[col] = R' / guard (the M-step's weights); for the E-step before it g_r = g_R' a (+ the output
        # assignments' gradient, last step) and y = r g_r
        extra = g_r_extra if t == len(lambdas) - 1 else no_extra
        g_r_t, y = kernel.mstep_back(*votes, coef, st["r"], a_flat, guard, floored, slope, base, extra, left[col],
                                     g_a_in, t > 0)
        col += 1
        if t == 0:
            break
        # E-step t-1: r = softmax over each child's normalisation group of z, with
        # z = logsigmoid(pre) - 0.5 (sum_h (x - d)^2 / var + sum_h log_var + H log 2 pi);
        # gz = r (g_r - group sum of r g_r) goes to left[col], with sum_i gz [x, x^2] and sum_i gz
        if groups is None:
            total = y.sum(dim=1, keepdim=True)
        else:
            total = kernel.group_sum(y, groups.index.contiguous(), groups.count, groups.normalize == "per_type",
                                     groups.blocks)
        s12, s0 = kernel.estep_back(*votes, st["r"], g_r_t, total, left[col])
        prev = saved[t - 1]
        kernel.estep_parents(s12, s0, prev["d"], prev["var"], prev["pre"], g_d, g_var, g_pre, g_sum_log, right, col)
        col += 1
    grads = (g_a_in.view_as(a_in), _reduce_like(g_bv, beta_v), _reduce_like(g_ba, beta_a))
    return grads, left, right


class _FusedEMFunction(torch.autograd.Function):
    """:class:`_EMFunction` on votes that are never stored (:class:`_FusedVotes`): the fused kernel
    computes every product with them, and in the backward ``d pose`` and ``d weight`` straight from the
    outer-product factors, recomputing the votes it needs. The forward runs every iteration but the last in
    the kernel (``head``); with exact gradients the backward replays every iteration with products
    computed again (they are cheap without the vote tensor), with ``detach_routing`` only the last M-step."""

    @staticmethod
    def forward(ctx, pose, weight, a_in, beta_v, beta_a, coord, kernel, c, head, want_r, lambdas, eps,
                cost_normalization, detach_routing, groups, variance_floor, scale):
        ctx.want_r = want_r
        ctx.settings = (lambdas, eps, cost_normalization, detach_routing, groups, variance_floor, scale)
        ctx.source, ctx.head = _FusedVotes(kernel, pose, weight, coord, c, scale.inv), head
        ctx.saved = None
        if not detach_routing and cost_normalization is None:  # exact gradients by hand (_manual_backward)
            (mu, a_out, r), ctx.saved = _fused_saving(kernel, pose, weight, coord, c, a_in, beta_v, beta_a, lambdas,
                                                      eps, groups, variance_floor, scale)
        else:
            mu, a_out, r = _route(c, _recording(ctx, ctx.source), a_in, beta_v, beta_a, *ctx.settings, head=head)
        ctx.save_for_backward(c, a_in, beta_v, beta_a)
        # an output that ctx also holds (the head's or a saved iteration's assignments) would make a reference
        # cycle through this node: return a copy, where the caller wants them
        return mu, a_out, (r.clone() if want_r else r.new_empty(0))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_mu, g_a, g_r):
        c, a_in, beta_v, beta_a = ctx.saved_tensors
        source = ctx.source
        detached = ctx.settings[3]
        g_r = g_r if ctx.want_r else None
        if ctx.saved is not None:
            lambdas, eps, _, _, groups, variance_floor, scale = ctx.settings
            grads, left, right = _manual_backward(ctx.saved, source, c, a_in, beta_v, beta_a, lambdas, eps, groups,
                                                  variance_floor, scale, g_mu, g_a, g_r)
        else:
            grads, left, right = _replay(ctx, source, c, a_in, beta_v, beta_a, (g_mu, g_a, g_r),
                                         head=ctx.head if detached else None,
                                         live=ctx.head is not None and not detached)
            left = None if left is None else left.permute(3, 0, 1, 2)  # (B, J, I, K) -> (K, B, J, I)
        grad_pose = grad_weight = None
        if left is not None and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            grad_pose, grad_weight = source.kernel.votes_backward(
                source.pose, source.weight, source.coord, source.c, source.inv, left.contiguous(),
                right.contiguous())
        return (grad_pose, grad_weight, *grads, None, None, None, None, None, None, None, None, None, None, None, None)


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
    """Route child votes to parent matrix capsules by EM (Procedure 1 of Hinton et al. 2018).

    Args:
        votes: votes ``V[i, j] = M_i W_ij`` of every child for every parent, pose flattened to ``H``.
        activations: child activations ``a_i`` in ``[0, 1]``.
        beta_v: per-parent cost of describing a pose component by its variance (the paper's ``beta_u``),
            shape ``(J,)`` or scalar.
        beta_a: per-parent activation offset, shape ``(J,)`` or scalar.
        iterations: EM iterations (>= 1). The last one is an M-step only.
        inverse_temperature: ``lambda``: ``None`` for the default schedule (module docstring), a number
            for every iteration, or a sequence of ``iterations`` numbers.
        return_assignments: also return the assignments ``R`` used by the final M-step.
        eps: guard on ``sum_i R'``; with the paper's formulation also the variance floor (module
            docstring). None: ``1e-6`` (paper), ``1e-5`` (official; its class layer's guard).
        cost_normalization: ``None`` (the paper), ``"mean_std"`` (standardise the cost across parents) or
            ``"mass"`` (divide it by ``I H / J``: a per-layer inverse temperature; module docstring).
            Paper formulation only.
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
            authors' released code; module docstring).
        variance_floor: official formulation only: the floor added to every variance (None: ``5e-4``).

    Shape:
        - votes: ``(B, I, J, H)``; activations: ``(B, I)``; beta_v, beta_a: ``(J,)`` or ``()``.
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
    eps, variance_floor = _resolve_formulation(formulation, eps, variance_floor)
    _check_inputs(votes, activations, iterations, eps, cost_normalization, formulation, variance_floor)
    _check_child_groups(child_groups, tuple(votes.shape[:2]), "votes")
    lambdas = _resolve_lambdas(inverse_temperature, int(iterations))
    dtype = votes.dtype if votes.dtype in (torch.float32, torch.float64) else torch.float32
    with torch.autocast(device_type=votes.device.type, enabled=False):
        v = votes.to(dtype).permute(0, 2, 1, 3).contiguous()  # (B, J, I, H)
        a_in = activations.to(dtype).unsqueeze(1)  # (B, 1, I)
        beta_v = _check_beta(beta_v, "beta_v", v.shape[1], v)  # (J,) or (1,)
        beta_a = _check_beta(beta_a, "beta_a", v.shape[1], v)
        scale = _vote_scale(v, eps if variance_floor is None else variance_floor)
        settings = (lambdas, eps, cost_normalization, detach_routing, child_groups, variance_floor, scale)
        lean = torch.is_grad_enabled() and not torch.compiler.is_compiling() and any(
            t.requires_grad for t in (v, a_in, beta_v, beta_a))
        if lean:  # eager training: the lean backward of _EMFunction
            mu, a_out, r = _EMFunction.apply(v, a_in, beta_v, beta_a, *settings)
        else:  # inference, or traced by torch.compile: plain autograd through the same procedure
            c, xx = _shifted_votes(v, a_in, eps, scale.inv)  # (B, J, 1, H), (B, J, I, 2H)
            mu, a_out, r = _route(c, _DenseVotes(xx).contract, a_in, beta_v, beta_a, *settings)
    if return_assignments:
        return mu, a_out, r.transpose(1, 2)
    return mu, a_out


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

    For float32/float64 4x4 poses on the CPU, the fused kernel (:mod:`capsnets.functional.em_kernel`)
    computes every product with the votes from ``poses`` and ``weight`` and never stores them; elsewhere
    (or with ``CAPSNETS_EM_KERNEL=torch``) the votes are formed by :func:`~capsnets.functional.products.matrix_votes`
    and routed by :func:`em_routing`. Both give the same values and gradients up to rounding.

    Args:
        poses: child poses ``M``.
        weight: transforms ``W``; child ``i`` uses ``weight[i % Iw]`` (``Iw = I`` for a convolutional
            layer's receptive field; the child types for a class layer whose children are ordered
            (position, type) with the type last).
        activations, beta_v, beta_a, iterations: as in :func:`em_routing`.
        coordinates: values added to each child's votes' components 0 and 1 (coordinate addition), or None.
        The other keyword arguments: as in :func:`em_routing`.

    Shape:
        - poses: ``(B, I, P, P)``; weight: ``(Iw, J, P, P)``; activations: ``(B, I)``; coordinates: ``(I, 2)``.
        - output: as :func:`em_routing`'s, with ``H = P * P``.

    Examples::

        >>> poses, weight, acts = torch.randn(8, 72, 4, 4), torch.randn(72, 10, 4, 4), torch.rand(8, 72)
        >>> mu, a = em_routing_poses(poses, weight, acts, 0.0, 0.0, formulation="official")
        >>> mu.shape, a.shape
        (torch.Size([8, 10, 16]), torch.Size([8, 10]))
    """
    if not isinstance(poses, Tensor) or poses.dim() != 4 or poses.shape[-1] != poses.shape[-2]:
        got = tuple(poses.shape) if isinstance(poses, Tensor) else type(poses).__name__
        raise ValueError(f"poses must be a (B, I, P, P) tensor of square pose matrices; got {got}")
    batch, children, side = poses.shape[0], poses.shape[1], poses.shape[-1]
    if (not isinstance(weight, Tensor) or weight.dim() != 4 or tuple(weight.shape[-2:]) != (side, side)
            or weight.shape[0] < 1 or children % weight.shape[0]):
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must be an (Iw, J, {side}, {side}) tensor with I = {children} a multiple of Iw; "
                         f"got {got}")
    if coordinates is not None and (not isinstance(coordinates, Tensor) or tuple(coordinates.shape) != (children, 2)
                                    or side * side < 2):
        got = tuple(coordinates.shape) if isinstance(coordinates, Tensor) else type(coordinates).__name__
        raise ValueError(f"coordinates must be None or an (I, 2) = ({children}, 2) tensor; got {got}")
    kernel = fused_kernel(poses)
    if kernel is None or weight.dtype != poses.dtype or (coordinates is not None and coordinates.requires_grad):
        full = weight.repeat(children // weight.shape[0], 1, 1, 1) if weight.shape[0] != children else weight
        votes = matrix_votes(poses, full)  # (B, I, J, P*P)
        if coordinates is not None:
            coords = coordinates.to(votes.dtype).view(1, children, 1, 2)
            votes = torch.cat([votes[..., :2] + coords, votes[..., 2:]], dim=-1)
        return em_routing(votes, activations, beta_v, beta_a, iterations, inverse_temperature=inverse_temperature,
                          return_assignments=return_assignments, eps=eps, cost_normalization=cost_normalization,
                          detach_routing=detach_routing, child_groups=child_groups, formulation=formulation,
                          variance_floor=variance_floor)
    eps, variance_floor = _resolve_formulation(formulation, eps, variance_floor)
    _check_settings(iterations, eps, cost_normalization, formulation, variance_floor)
    if not isinstance(activations, Tensor) or tuple(activations.shape) != (batch, children):
        got = tuple(activations.shape) if isinstance(activations, Tensor) else type(activations).__name__
        raise ValueError(f"activations must have shape (B, I) = {(batch, children)} to match poses; got {got}")
    _check_child_groups(child_groups, (batch, children), "poses")
    lambdas = _resolve_lambdas(inverse_temperature, int(iterations))
    height = side * side
    with torch.autocast(device_type="cpu", enabled=False):
        pose = poses.reshape(batch, children, height).contiguous()
        w = weight.reshape(weight.shape[0], weight.shape[1], height).contiguous()
        coord = pose.new_empty(0) if coordinates is None else coordinates.to(pose.dtype).detach().contiguous()
        a_in = activations.to(pose.dtype).unsqueeze(1)  # (B, 1, I)
        beta_v = _check_beta(beta_v, "beta_v", w.shape[1], pose)
        beta_a = _check_beta(beta_a, "beta_a", w.shape[1], pose)
        with torch.no_grad():  # the origin c (the activation-weighted mean vote) and the scale: constants
            w0 = (a_in / (a_in.sum(dim=-1, keepdim=True) + eps)).squeeze(1).contiguous()
            mean, top = kernel.votes_stats(pose.detach(), w.detach(), coord, w0.detach())
            scale = _scale_from_top(top, height, eps if variance_floor is None else variance_floor)
            c = (mean * scale.inv.view(-1, 1, 1)).unsqueeze(2)  # (B, J, 1, H)
        settings = (lambdas, eps, cost_normalization, detach_routing, child_groups, variance_floor, scale)
        tracked = torch.is_grad_enabled() and any(t.requires_grad for t in (pose, w, a_in, beta_v, beta_a))
        # the iterations before the last, in the kernel (with exact gradients by hand, _FusedEMFunction runs the
        # whole procedure there itself)
        head = None
        if len(lambdas) > 1 and (not tracked or detach_routing or cost_normalization is not None):
            head = _fused_head(kernel, pose, w, coord, c, a_in, beta_v, beta_a, *settings)
        if tracked:
            mu, a_out, r = _FusedEMFunction.apply(pose, w, a_in, beta_v, beta_a, coord, kernel, c, head,
                                                  return_assignments, *settings)
        else:
            source = _FusedVotes(kernel, pose, w, coord, c, scale.inv)
            mu, a_out, r = _route(c, source.contract, a_in, beta_v, beta_a, *settings, head=head)
    if return_assignments:
        return mu, a_out, r.transpose(1, 2)
    return mu, a_out


def _kernel_route(kernel, pose, weight, coord, c, a_in, beta_v, beta_a, lambdas, eps, cost_normalization, groups,
                  variance_floor, scale, keep):
    """``kernel.route_head`` on the iterations of ``lambdas`` (the last one an M-step only with ``keep``)."""
    with torch.no_grad():
        parents = weight.shape[1]
        r0 = _initial_assignments(c, a_in, groups).contiguous()
        index = groups.index.contiguous() if groups is not None else pose.new_empty(0, dtype=torch.long)
        return kernel.route_head(
            pose, weight, coord, c.squeeze(2).contiguous(), scale.inv.reshape(-1).contiguous(),
            a_in.squeeze(1).contiguous(), beta_v.expand(parents).contiguous(), beta_a.expand(parents).contiguous(),
            scale.floor.reshape(-1).contiguous(), scale.log_var.reshape(-1).contiguous(), r0, index,
            [float(x) for x in lambdas], float(eps), variance_floor is not None,
            _COST_NORMALIZATIONS.index(cost_normalization), 1 if groups is not None and groups.normalize == "per_type"
            else 0, groups.count if groups is not None else 0, groups.blocks if groups is not None else 1, keep)


def _fused_head(kernel, pose, weight, coord, c, a_in, beta_v, beta_a, lambdas, eps, cost_normalization,
                detach_routing, groups, variance_floor, scale):
    """Every iteration but the last, without gradients, in the kernel: ``(r (B, J, I), d (B, J, H))``, the
    assignments of the last M-step and the last centre (minus ``c``, in the units of ``scale``)."""
    r, d = _kernel_route(kernel, pose, weight, coord, c, a_in, beta_v, beta_a, lambdas[:-1], eps, cost_normalization,
                         groups, variance_floor, scale, False)[:2]
    return r, d


def _fused_saving(kernel, pose, weight, coord, c, a_in, beta_v, beta_a, lambdas, eps, groups, variance_floor, scale):
    """The whole procedure with exact gradients (no cost normalisation) by the kernel: the outputs ``(mu, a,
    r)`` and, per iteration, what :func:`_manual_backward` needs (the assignments ``r``, the M-step product ``m``
    ``(B, J, 2H)``, the centre ``d``, ``var``, ``log_var``, ``pre`` and the mass ``sum_i r a`` ``(B, J)``)."""
    _, _, r, m, d, var, log_var, pre, mass = _kernel_route(kernel, pose, weight, coord, c, a_in, beta_v, beta_a,
                                                           lambdas, eps, None, groups, variance_floor, scale, True)
    saved = [{"r": r[t], "m": m[t], "d": d[t], "var": var[t], "log_var": log_var[t], "pre": pre[t], "mass": mass[t]}
             for t in range(len(lambdas))]
    top = torch.finfo(d.dtype).max
    mu = ((d[-1] + c.squeeze(2)) / scale.inv.squeeze(-1)).clamp(-top, top)
    return (mu, torch.sigmoid(pre[-1]), r[-1]), saved
