"""Capsule non-linearity and lengths that stay finite for every finite input.

Sabour, Frosst & Hinton (2017), "Dynamic Routing Between Capsules", Eq. 1:
``v = |s|^2 / (1 + |s|^2) * s / |s|``. Written as ``v = s * |s| / (1 + |s|^2)`` with a norm that has an
epsilon inside the square root, so both the value and the gradient are finite at ``s = 0`` (the raw
``s / |s|`` of many public versions is 0/0 there).

Numerics (not in the paper; same values): ``|s|^2`` overflows long before ``s`` does (float32 lengths above
about 1e19, float16 above 256), so the squared length is accumulated in a wider dtype (float64, or float32 where
that cannot overflow), or (float64 inputs, devices without float64, code traced by ``torch.compile``) computed
from each capsule divided by its largest component, the scale put back analytically. Every finite ``s`` then has
a finite squash and a finite gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from capsnets.validation import ArgumentError


def _default_eps(dtype: torch.dtype) -> float:
    # eps^2 of the dtype: far below any length that matters (1.4e-14 for float32, 4.9e-32 for float64),
    # yet representable, so sqrt(0 + eps) is finite with a finite derivative.
    return torch.finfo(dtype).eps ** 2


def _wide(s: Tensor) -> bool:
    """Whether the squared lengths of ``s`` are accumulated wide (else: the capsules are scaled first)."""
    return s.dtype != torch.float64 and s.device.type != "mps"


def _scaled(s: Tensor, dim: int, eps: float, unit: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """The capsules ``s / unit`` scaled so that squaring cannot overflow.

    Returns ``(t, kappa, q)``: ``t = k s`` with ``k`` (detached: any ``k`` gives the same results) 4 over each
    capsule's largest component, at least ``unit``, so that ``|t| <= 4`` componentwise and ``k`` is a normal
    number even for the largest inputs; ``kappa = k unit`` and ``q = |t|^2 + eps kappa^2``, so the safe length
    of ``s / unit`` is ``sqrt(q) / kappa``. ``kappa`` and ``q`` keep ``dim`` with size 1.
    """
    with torch.no_grad():
        k = (0.25 * s.abs().amax(dim, keepdim=True).clamp_min(unit)).reciprocal()
    t, kappa = s * k, k * unit
    return t, kappa, t.square().sum(dim, keepdim=True) + eps * kappa.square()


def _wide_length(s: Tensor, dim: int, eps: float, unit: float = 1.0) -> tuple[Tensor, Tensor]:
    """``(n, q)``: ``q = |s|^2 + eps unit^2`` and ``n = sqrt(q)``, ``unit`` times the safe length of ``s / unit``
    (``dim`` kept), with the squares summed wide enough not to overflow: in float32 for float16 capsules and,
    where no sum reaches 2^126 there, for float32/bfloat16 ones on the CPU (whose host check costs nothing);
    in float64 otherwise."""
    if s.dtype == torch.float16 or (
        s.device.type == "cpu" and s.dtype != torch.float64 and not torch.compiler.is_compiling()
    ):
        norm = torch.linalg.vector_norm(s, 2, dim, keepdim=True, dtype=torch.float32)
        if s.dtype == torch.float16 or norm.numel() == 0 or float(norm.detach().amax()) < 2.0**63:  # (NaN fails)
            q = norm.square() + eps * unit**2
            return q.sqrt(), q
    q = torch.linalg.vector_norm(s, 2, dim, keepdim=True, dtype=torch.float64).square() + eps * unit**2
    return q.sqrt(), q


def _wide_factor(s: Tensor, dim: int, eps: float, unit: float) -> tuple[Tensor, Tensor]:
    """``(n, f)`` with ``n`` from :func:`_wide_length` and ``squash(s / unit) = s f``; ``f`` is float64 for
    float64 capsules, float32 otherwise (in float16/bfloat16 it is subnormal for long capsules)."""
    n, q = _wide_length(s, dim, eps, unit)
    f = n / (q + unit**2)
    dtype = torch.float64 if s.dtype == torch.float64 else torch.float32
    return n, f if f.dtype == dtype else f.to(dtype)


class _WideSquash(torch.autograd.Function):
    """``squash(s / unit)`` with the squared length accumulated wide (:func:`_wide_length`), and a backward
    that forms ``s . grad`` from ``s / |s|``, so that it cannot overflow either (autograd's would, through
    ``s * f``)."""

    @staticmethod
    def forward(ctx, s, dim, eps, unit):
        n, f = _wide_factor(s, dim, eps, unit)
        ctx.save_for_backward(s, n, f)
        ctx.dim, ctx.unit = dim, unit
        return (s * f).to(s.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        s, n, f = ctx.saved_tensors
        # d v / d s = f I + f'(n) s s^T / n = f I + n f'(n) s_hat s_hat^T with s_hat = s / n, |s_hat| <= 1
        inv_n = torch.where(n > 0, n.reciprocal(), 0.0)  # n = 0 only for s = 0 with eps = 0
        s_hat = s * inv_n.to(f.dtype)
        along = (s_hat * grad).sum(ctx.dim, keepdim=True)
        f_n = f.to(n.dtype)
        slope = (ctx.unit**2 * inv_n - n) * f_n * f_n  # n f'(n) = n (unit^2 - n^2) / (unit^2 + n^2)^2
        return torch.addcmul(grad * f, s_hat, (slope * along).to(f.dtype)).to(s.dtype), None, None, None


def _squash(s: Tensor, dim: int = -1, eps: float | None = None, unit: float = 1.0) -> Tensor:
    """``squash(s / unit)``, computed from ``s`` (a routing's weighted sums, kept scaled by ``unit``)."""
    if eps is None:
        eps = _default_eps(s.dtype)
    if _wide(s) and not torch.compiler.is_compiling():  # traced: plain autograd through the scaled form
        if torch.is_grad_enabled() and s.requires_grad:
            return _WideSquash.apply(s, dim, eps, unit)
        v = s * _wide_factor(s, dim, eps, unit)[1]
        return v if v.dtype == s.dtype else v.to(s.dtype)
    t, kappa, q = _scaled(s, dim, eps, unit)
    # v = (s / unit) |s / unit| / (1 + |s / unit|^2), with |s / unit| = sqrt(q) / kappa and s / unit = t / kappa
    return t * (q.sqrt() / (kappa.square() + q))


def safe_norm(s: Tensor, dim: int = -1, keepdim: bool = False, eps: float | None = None) -> Tensor:
    """Euclidean norm ``sqrt(sum(s^2) + eps)``: finite value and finite gradient everywhere.

    Computed without forming ``s^2`` in the input's precision (see the module docstring), so it does not
    overflow; a norm beyond the dtype's largest value saturates there.

    Args:
        s: input tensor.
        dim: the capsule dimension.
        keepdim: keep ``dim`` with size 1.
        eps: added under the square root; default ``finfo(s.dtype).eps ** 2``.

    Examples::

        >>> safe_norm(torch.tensor([[3.0, 4.0], [3e30, 4e30]]))
        tensor([5.0000e+00, 5.0000e+30])
    """
    if eps is None:
        eps = _default_eps(s.dtype)
    if _wide(s):
        norm = _wide_length(s, dim, eps)[0]
    else:
        _, kappa, q = _scaled(s, dim, eps)
        norm = q.sqrt() / kappa
    norm = norm.clamp_max(torch.finfo(s.dtype).max).to(s.dtype)
    return norm if keepdim else norm.squeeze(dim)


def capsule_length(s: Tensor, dim: int = -1, eps: float | None = None) -> Tensor:
    """Length of each capsule vector (the probability that its entity is present); see :func:`safe_norm`.

    Shape:
        ``(..., D)`` -> ``(...)`` for ``dim=-1``.
    """
    return safe_norm(s, dim=dim, keepdim=False, eps=eps)


def squash(s: Tensor, dim: int = -1, eps: float | None = None) -> Tensor:
    """Squash capsule vectors: keep the direction, map the length into ``[0, 1)``.

    Finite, with a finite gradient, for every finite ``s`` in every floating dtype (module docstring).

    Args:
        s: capsule pre-activations.
        dim: the capsule dimension.
        eps: see :func:`safe_norm`.

    Shape:
        any; output has the shape of ``s``.

    Examples:
        >>> v = squash(torch.tensor([[3.0, 4.0]]))   # |s| = 5 -> |v| = 25 / 26
        >>> torch.allclose(capsule_length(v), torch.tensor([25 / 26]))
        True
        >>> squash(torch.tensor([[3e30, 4e30]]))
        tensor([[0.6000, 0.8000]])
    """
    if not s.is_floating_point():
        raise ArgumentError(f"squash takes a floating-point tensor, got {s.dtype}; convert it first (s.float())", "s")
    return _squash(s, dim, eps)
