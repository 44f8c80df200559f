"""Capsule non-linearity and lengths that stay finite at zero.

Sabour, Frosst & Hinton (2017), "Dynamic Routing Between Capsules", Eq. 1:
``v = |s|^2 / (1 + |s|^2) * s / |s|``. Written as ``v = s * |s| / (1 + |s|^2)`` with a norm that has an
epsilon inside the square root, so both the value and the gradient are finite at ``s = 0`` (the raw
``s / |s|`` of many public versions is 0/0 there).
"""
from __future__ import annotations

import torch
from torch import Tensor


def _default_eps(dtype: torch.dtype) -> float:
    # eps^2 of the dtype: far below any length that matters (1.4e-14 for float32, 4.9e-32 for float64),
    # yet representable, so sqrt(0 + eps) is finite with a finite derivative.
    return torch.finfo(dtype).eps ** 2


def safe_norm(s: Tensor, dim: int = -1, keepdim: bool = False, eps: float | None = None) -> Tensor:
    """Euclidean norm ``sqrt(sum(s^2) + eps)``: finite value and finite gradient everywhere.

    Args:
        s: input tensor.
        dim: the capsule dimension.
        keepdim: keep ``dim`` with size 1.
        eps: added under the square root; default ``finfo(s.dtype).eps ** 2``.
    """
    if eps is None:
        eps = _default_eps(s.dtype)
    return torch.sqrt(s.pow(2).sum(dim=dim, keepdim=keepdim) + eps)


def capsule_length(s: Tensor, dim: int = -1, eps: float | None = None) -> Tensor:
    """Length of each capsule vector (the probability that its entity is present).

    Shape:
        ``(..., D)`` -> ``(...)`` for ``dim=-1``.
    """
    return safe_norm(s, dim=dim, keepdim=False, eps=eps)


def squash(s: Tensor, dim: int = -1, eps: float | None = None) -> Tensor:
    """Squash capsule vectors: keep the direction, map the length into ``[0, 1)``.

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
    """
    norm = safe_norm(s, dim=dim, keepdim=True, eps=eps)
    return s * (norm / (1.0 + norm.pow(2)))
