"""What the non-iterative and attention routings share: checks of their votes and settings, the dtype they
compute in, the two squash functions they may end with, a softmax whose gradient stays finite, and binding a
routing to its layer's sizes.

Some routings learn: Efficient-CapsNet's self-attention routing a bias per (child, parent) pair, inverted
dot-product attention the affine part of its LayerNorm, self-routing a small routing network per child. Their
spec is a frozen dataclass like :class:`~capsnets.functional.DynamicRouting`; a capsule layer calls its
``build(in_capsules, in_dim, out_capsules, out_dim)`` (:func:`bind_routing`), which returns a
:class:`BoundRouting`: an ``nn.Module``, so the parameters belong to the layer (optimisers, ``state_dict``,
``.to()``), that calls the spec with them.

Every routing function backpropagates the loss's gradient divided by a power of two ``>=`` its largest magnitude,
and multiplies its inputs' gradients back (:func:`normalized_gradients`): their own products with the gradient then
stay within the dtype's range whatever the loss's scale, and a gradient beyond the dtype is inf, never NaN.
Routings whose backward multiplies the gradient by the votes more than once route large float32 and half votes
that need a gradient in float64 (:func:`widened`).

Dimension legend: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` parent capsule dim,
``D_in`` child capsule dim.

The squash of Efficient-CapsNet (Mazzia, Salvetti & Chiaberge 2021, "Efficient-CapsNet: Capsule Network with
Self-Attention Routing", Scientific Reports; EscVM/Efficient-CapsNet, ``utils/layers.py``, ``Squash``)
is ``(1 - 1/exp(|s|)) s / |s|``: :func:`efficient_squash`. Where that code adds ``1e-20`` to ``|s|`` and to
``exp(|s|)``, here the length has an epsilon under its square root (as :func:`~capsnets.functional.squash`).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn

from capsnets.functional.squash import _default_eps, _scaled, _squash, safe_norm
from capsnets.validation import ArgumentError

#: The squash functions a routing may end with, by the name its spec records.
SQUASHES = ("sabour", "efficient")


#: The sizes of a routing's votes ``(B, I, J, D)`` that must be at least 1: the parents and their components. An
#: empty batch is routed to an empty result, and no children to parents with no input (what zero votes give).
CAPSULE_SIZES = {2: ("J", "parent capsules"), 3: ("D", "components per capsule")}


def check_capsule_sizes(shape, owner: str, name: str = "u_hat", sizes=CAPSULE_SIZES) -> None:
    """Raise an :class:`~capsnets.validation.ArgumentError` (a ``ValueError``) naming the first size of ``shape``
    in ``sizes`` (by position) that is zero: a routing needs a parent for each child's couplings to sum to 1 over,
    and capsules of at least one component (a length, a LayerNorm or a Gaussian of none is 0/0)."""
    for position, (letter, what) in sizes.items():
        if shape[position] == 0:
            raise ArgumentError(
                f"{owner} needs at least one of the {what} ({letter} >= 1); got {name} of shape {tuple(shape)}: "
                f"give the layer at least one {what[:-1] if what.endswith('s') else what}",
                name,
            )


def check_votes(votes, owner: str, name: str = "u_hat", sizes=CAPSULE_SIZES, activations=None) -> None:
    """Raise an :class:`~capsnets.validation.ArgumentError` (a ``ValueError``) unless ``votes`` is a floating-point
    ``(B, I, J, D)`` tensor whose ``sizes`` are at least 1 (:func:`check_capsule_sizes`; the last one's letter and
    meaning name ``D``) and ``activations``, where given, is ``(B, I)``: the one check of every routing's votes."""
    letter, meaning = sizes[3]
    if not isinstance(votes, Tensor) or votes.dim() != 4:
        shape = tuple(votes.shape) if isinstance(votes, Tensor) else type(votes).__name__
        raise ArgumentError(
            f"{owner} expects {name} of shape (B, I, J, {letter}) (batch, children, parents, {meaning}); got {shape}",
            name,
        )
    if not votes.is_floating_point():
        raise ArgumentError(f"{owner} expects floating-point {name}, got {votes.dtype}", name)
    check_capsule_sizes(votes.shape, owner, name, sizes)
    if activations is not None and (not isinstance(activations, Tensor) or activations.shape != votes.shape[:2]):
        shape = tuple(activations.shape) if isinstance(activations, Tensor) else type(activations).__name__
        raise ArgumentError(
            f"{owner} expects activations of shape (B, I) = {tuple(votes.shape[:2])} to match {name}; got {shape}",
            "activations",
        )


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


class _Exit(torch.autograd.Function):
    """Identity on a routing's outputs whose backward divides their gradients by ``2^e``, the least power of two
    ``>=`` their largest magnitude (``e >= 0``, at most the largest exponent of the dtypes involved), and keeps
    ``2^e`` in ``box`` for :class:`_Entry`."""

    @staticmethod
    def forward(ctx, box, *outputs):
        ctx.box = box
        return tuple(o.clone() for o in outputs)  # not views: the caller may modify them in place

    @staticmethod
    def backward(ctx, *grads):
        box = ctx.box
        dtypes = box["dtypes"] + [g.dtype for g in grads]
        exponent = min(math.frexp(torch.finfo(d).max)[1] - 1 for d in dtypes)  # 2^exponent fits every dtype
        with torch.no_grad():
            tops = [g.detach().abs().amax().double() for g in grads if g.numel()]
            top = torch.stack(tops).amax() if tops else grads[0].new_zeros((), dtype=torch.float64)
            scale = torch.exp2(torch.ceil(torch.log2(top.clamp_min(1.0))).clamp_max(exponent))  # NaN stays NaN
        # a scale of 1 (the usual case) skips the multiplications, where telling costs no wait for a device
        box["scale"] = None if scale.device.type == "cpu" and scale.item() == 1.0 else scale
        return (None, *(g if box["scale"] is None else g / scale.to(g.dtype) for g in grads))


class _Entry(torch.autograd.Function):
    """Identity on a routing's inputs whose backward multiplies their gradients by the ``2^e`` of :class:`_Exit`
    (an overflow there is the gradient's own)."""

    @staticmethod
    def forward(ctx, box, *inputs):
        ctx.box = box
        return tuple(i.view_as(i) for i in inputs)

    @staticmethod
    def backward(ctx, *grads):
        scale = ctx.box.get("scale")
        if scale is None:  # a scale of 1, or no gradient reached the outputs
            return (None, *grads)
        return (None, *(g * scale.to(g.dtype) for g in grads))


def normalized_gradients(routing):
    """Decorate a routing function so that its backward runs on the gradient of its outputs divided by a power of
    two ``>=`` its largest magnitude, and the gradients of its inputs (the tensor arguments that require one) are
    multiplied back: the same gradients (powers of two are exact; a part below the dtype's smallest numbers
    relative to the largest is lost), with the routing's own products and sums of the gradient within the
    dtype's range whatever the loss's scale. A gradient of magnitude 1 or less is used as it is."""

    @functools.wraps(routing)
    def route(*args, **kwargs):
        leaves = [
            (index, value)
            for index, value in [*enumerate(args), *kwargs.items()]
            if isinstance(value, Tensor) and value.requires_grad and value.is_floating_point()
        ]
        if not leaves or not torch.is_grad_enabled() or torch.compiler.is_compiling() or torch.jit.is_tracing():
            return routing(*args, **kwargs)
        box = {"dtypes": [value.dtype for _, value in leaves]}
        entered = _Entry.apply(box, *(value for _, value in leaves))
        args, kwargs = list(args), dict(kwargs)
        for (key, _), value in zip(leaves, entered):
            if isinstance(key, int):
                args[key] = value
            else:
                kwargs[key] = value
        out = routing(*args, **kwargs)
        single = isinstance(out, Tensor)
        items = (out,) if single else tuple(out)
        live = [index for index, item in enumerate(items) if isinstance(item, Tensor) and item.requires_grad]
        if not live:
            return out
        exited = dict(zip(live, _Exit.apply(box, *(items[index] for index in live))))
        items = [exited.get(index, item) for index, item in enumerate(items)]
        if single:
            return items[0]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)

    return route


def working(t: Tensor) -> Tensor:
    """``t`` in the dtype the routings compute in: float32 for float16/bfloat16 (too narrow for their sums)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


#: Votes beyond this magnitude are routed in float64 by :func:`widened` where they need a gradient.
WIDE_VOTES = 2.0**32


def widened(u_hat: Tensor, gradient_only: bool = True) -> Tensor:
    """``working(u_hat)``, or ``u_hat`` in float64 where it needs a gradient (or, not ``gradient_only``, always) and
    its largest magnitude exceeds :data:`WIDE_VOTES` (float32 and half votes, on a device with float64; one host
    check, not while tracing): a routing whose backward multiplies the gradient by the votes more than once
    overflows float32 there, although the gradient itself is far smaller."""
    if (
        u_hat.dtype == torch.float64
        or u_hat.device.type == "mps"
        or (gradient_only and not (torch.is_grad_enabled() and u_hat.requires_grad))
        or u_hat.numel() == 0
        or torch.compiler.is_compiling()
        or torch.jit.is_tracing()
    ):
        return working(u_hat)
    with torch.no_grad():
        low, high = torch.aminmax(u_hat.detach())
    return u_hat.double() if max(-float(low), float(high)) > WIDE_VOTES else working(u_hat)


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


class BoundRouting(nn.Module):
    """A routing spec with its parameters.

    Args:
        spec: the routing (a frozen dataclass whose ``__call__`` takes the parameters as keyword arguments).
        parameters: initial values of the parameters, by the keyword ``spec`` takes them under.

    Examples::

        >>> from capsnets.functional import SelfAttentionRouting
        >>> routing = SelfAttentionRouting().build(32, 8, 10, 16)
        >>> routing.bias.shape, routing(torch.randn(2, 32, 10, 16)).shape
        (torch.Size([32, 10]), torch.Size([2, 10, 16]))
    """

    def __init__(self, spec, parameters: dict[str, Tensor]) -> None:
        super().__init__()
        self.spec = spec
        self.needs_poses = bool(getattr(spec, "needs_poses", False))
        self._names = tuple(parameters)
        for name, value in parameters.items():
            self.register_parameter(name, nn.Parameter(value))

    def forward(self, u_hat: Tensor, **kwargs):
        return self.spec(u_hat, **{name: getattr(self, name) for name in self._names}, **kwargs)

    def to_config(self) -> dict:
        """The spec of the routing (its parameters live in the layer's ``state_dict``)."""
        return self.spec.to_config()

    def extra_repr(self) -> str:
        return repr(self.spec)
