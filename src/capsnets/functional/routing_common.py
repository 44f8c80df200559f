"""What the non-iterative and attention routings share: checks of their votes and settings, the dtype they
compute in, the two squash functions they may end with, a softmax whose gradient stays finite, and binding a
routing to its layer's sizes.

Dimension legend: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` parent capsule dim,
``D_in`` child capsule dim.

The squash of Efficient-CapsNet (Mazzia, Salvetti & Chiaberge 2021, "Efficient-CapsNet: Capsule Network with
Self-Attention Routing", Scientific Reports; EscVM/Efficient-CapsNet, ``utils/layers.py``, ``Squash``)
is ``(1 - 1/exp(|s|)) s / |s|``: :func:`efficient_squash`. Where that code adds ``1e-20`` to ``|s|`` and to
``exp(|s|)``, here the length has an epsilon under its square root (as :func:`~capsnets.functional.squash`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from capsnets.functional.squash import _default_eps, _scaled, _squash, safe_norm

#: The squash functions a routing may end with, by the name its spec records.
SQUASHES = ("sabour", "efficient")


#: The sizes of a routing's votes ``(B, I, J, D)`` that must be at least 1: the parents and their components. An
#: empty batch is routed to an empty result, and no children to parents with no input (what zero votes give).
CAPSULE_SIZES = {2: ("J", "parent capsules"), 3: ("D", "components per capsule")}


def check_capsule_sizes(shape, owner: str, name: str = "u_hat", sizes=CAPSULE_SIZES) -> None:
    """Raise a ``ValueError`` naming the first size of ``shape`` in ``sizes`` (by position) that is zero: a
    routing needs a parent for each child's couplings to sum to 1 over, and capsules of at least one component
    (a length, a LayerNorm or a Gaussian of none is 0/0)."""
    for position, (letter, what) in sizes.items():
        if shape[position] == 0:
            raise ValueError(
                f"{owner} needs at least one of the {what} ({letter} >= 1); got {name} of shape {tuple(shape)}: "
                f"give the layer at least one {what[:-1] if what.endswith('s') else what}"
            )


def check_votes(u_hat: Tensor, owner: str) -> None:
    """Raise a ``ValueError`` unless ``u_hat`` is a floating-point ``(B, I, J, D)`` tensor with ``J, D >= 1``."""
    if not isinstance(u_hat, Tensor) or u_hat.dim() != 4:
        shape = tuple(u_hat.shape) if isinstance(u_hat, Tensor) else type(u_hat).__name__
        raise ValueError(
            f"{owner} expects u_hat of shape (B, I, J, D) (batch, children, parents, parent dim); got {shape}"
        )
    if not u_hat.is_floating_point():
        raise ValueError(f"{owner} expects floating-point votes, got {u_hat.dtype}")
    check_capsule_sizes(u_hat.shape, owner)


class _SaturatingSoftmax(torch.autograd.Function):
    """``softmax(x, dim)`` whose backward gives a zero gradient to every entry of probability zero, whatever
    the gradient of that entry is (autograd's ``p (g - sum p g)`` is ``0 * inf = NaN`` there when ``g``
    overflows: the couplings of huge votes saturate at 0 and 1 while the gradient of a coupling grows with
    the votes)."""

    @staticmethod
    def forward(ctx, x, dim):
        p = torch.softmax(x, dim=dim)
        ctx.save_for_backward(p)
        ctx.dim = dim
        return p

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        live = p > 0
        pg = torch.where(live, p * grad, 0.0)
        return torch.where(live, pg - p * pg.sum(ctx.dim, keepdim=True), 0.0), None


def saturating_softmax(x: Tensor, dim: int) -> Tensor:
    """``torch.softmax(x, dim)``, with the backward of :class:`_SaturatingSoftmax` where autograd records it
    (a plain softmax while tracing or compiling: same values)."""
    if torch.is_grad_enabled() and x.requires_grad and not torch.compiler.is_compiling() and not torch.jit.is_tracing():
        return _SaturatingSoftmax.apply(x, dim)
    return torch.softmax(x, dim=dim)


def working(t: Tensor) -> Tensor:
    """``t`` in the dtype the routings compute in: float32 for float16/bfloat16 (too narrow for their sums)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def sum_unit(count: int) -> float:
    """``2^-k`` with ``2^k >= count``: sums of ``count`` terms, each times it, stay within the largest term."""
    return 2.0 ** -math.ceil(math.log2(max(count, 1)))


def largest_magnitude(t: Tensor, dim, keepdim: bool = False) -> Tensor:
    """``max |t|`` over ``dim`` (an int or a tuple), 0 where those dims hold nothing (a routing with no children)."""
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if all(t.shape[d] for d in dims):
        return t.abs().amax(dim=dims, keepdim=keepdim)
    return t.abs().sum(dim=dims, keepdim=keepdim)  # an empty reduction: zeros of the reduced shape


def power_of_two_above(magnitude: Tensor, least: float) -> Tensor:
    """The least power of two ``>= max(magnitude, least)``, at most the dtype's largest (detached)."""
    with torch.no_grad():
        exponent = torch.ceil(torch.log2(magnitude.clamp_min(least)))
        return torch.exp2(exponent.clamp_max(math.frexp(torch.finfo(magnitude.dtype).max)[1] - 1))


def efficient_squash(s: Tensor, dim: int = -1, eps: float | None = None) -> Tensor:
    """Efficient-CapsNet's squash: keep the direction, map the length ``n`` to ``1 - exp(-n)``.

    Mazzia, Salvetti & Chiaberge (2021): ``v = (1 - 1/exp(|s|)) s / |s|``. Finite, with a finite
    gradient, for every finite ``s`` (zero included: the length has ``eps`` under its square root).

    Args:
        s: capsule pre-activations.
        dim: the capsule dimension.
        eps: added under the square root of the length; default ``finfo(s.dtype).eps ** 2``.

    Shape:
        any; output has the shape of ``s``.

    Examples::

        >>> v = efficient_squash(torch.tensor([[3.0, 4.0]]))   # |s| = 5 -> |v| = 1 - exp(-5)
        >>> torch.allclose(v.norm(dim=-1), torch.tensor([1 - math.exp(-5)]))
        True
    """
    return _efficient_squash(s, dim, eps)


def _efficient_squash(s: Tensor, dim: int = -1, eps: float | None = None, unit: float = 1.0) -> Tensor:
    """``efficient_squash(s / unit)`` from ``s``: ``t / sqrt(q)`` is the direction and ``sqrt(q) / kappa``
    the length (:func:`~capsnets.functional.squash._scaled`), which may overflow to inf harmlessly."""
    if eps is None:
        eps = _default_eps(s.dtype)
    t, kappa, q = _scaled(s, dim, eps, unit)
    root = q.sqrt()
    return t / root * -torch.expm1(-(root / kappa))


def apply_squash(kind: str, s: Tensor, unit: float = 1.0) -> Tensor:
    """``squash(s / unit)`` (Sabour et al. 2017, Eq. 1) or ``efficient_squash(s / unit)``, by ``kind``."""
    return _squash(s, unit=unit) if kind == "sabour" else _efficient_squash(s, unit=unit)


def squash_scaled(kind: str, t: Tensor, scale: Tensor) -> Tensor:
    """``squash(t * scale)`` (``"sabour"`` or ``"efficient"``) for capsules ``t`` and a positive, detached
    ``scale`` (the capsule dim kept, size 1) whose product with ``t`` may overflow: the direction is taken from
    ``t``, and the length ``|t| scale`` enters only through ``1 / (1 + 1/n^2)`` or ``1 - exp(-n)``, both 1 at
    ``n = inf``."""
    length = safe_norm(t, keepdim=True)  # > 0: eps under the square root
    n = length * scale
    factor = -torch.expm1(-n) if kind == "efficient" else torch.reciprocal(1 + torch.reciprocal(n).square())
    return t / length * factor


def bind_routing(routing, in_capsules: int, in_dim: int, out_capsules: int, out_dim: int, *, device=None, dtype=None):
    """The routing a layer calls: ``routing.build(...)`` for a routing that has parameters of its own (they become
    the layer's), the routing itself otherwise."""
    build = getattr(routing, "build", None)
    if build is None:
        return routing
    return build(in_capsules, in_dim, out_capsules, out_dim, device=device, dtype=dtype)
