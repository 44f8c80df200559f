"""Routing by agreement between vector capsules (dynamic routing).

Sabour, Frosst & Hinton (2017), "Dynamic Routing Between Capsules", Sec. 2, Procedure 1.

The "none-of-the-above" category (Sec. 7, for CIFAR-10: "we do not expect the final layer of ten capsules to
explain everything in the image"): with ``none_of_the_above=True`` each child's softmax runs over the ``J``
parents and one more, whose logit stays 0 in every iteration (it has no capsule, so no agreement updates it).
It takes part of each child's coupling and yields no output and no class score; the couplings to the ``J``
parents then sum to less than 1. This is what the authors' released code does with ``leaky=True``
(Sarasra/models, ``research/capsules/models/layers/layers.py``, ``_leaky_routing``), in every iteration.

Dimension legend: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` parent capsule dim.

Convolutional capsules route at every position of a grid: :func:`capsnets.functional.local_routing`.

Implementation (same result as the procedure, in fewer operations): the predictions are laid out once as
``(B, J, I, D)`` so every weighted sum and every agreement is a batched matrix product
(:func:`~capsnets.functional.products.matvec`); the first iteration's couplings are exactly ``1/J`` (``1/(J+1)``
with the none-of-the-above parent), so it takes no softmax; the last iteration does not update the logits, whose
new value would never be used.

Numerics (not in the paper; same values): the weighted sums are formed with the couplings times ``2^-k``
(``2^k >= I``) and the agreements and logits with ``v`` times ``2^-m`` (``2^m >= 2 r sqrt(D)``), powers of
two put back exactly where the values are used, so no sum overflows for any finite ``u_hat``; the softmax
takes the logits less their maximum over parents. float16 predictions are routed in float32. With
``detach_routing=False`` the backward multiplies the gradient by the votes twice per iteration, which overflows
float32 for near-tied parents from about 1e24 although the gradient itself is far smaller: there, predictions
beyond ``WIDE_VOTES`` (``2^32``) are routed in float64 (where the device has it) and the results returned in their
own dtype, so the gradients stay finite for every finite vote.

Gradients: with ``detach_routing=True`` (the default, as in the authors' released code) the predictions are
detached in every iteration but the last, so gradients reach ``u_hat`` only through the final weighted sum
and the couplings act as constants. With ``detach_routing=False`` gradients flow through every iteration,
as the procedure reads when differentiated literally.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.functional.products import matvec
from capsnets.functional.routing_common import check_votes, normalized_gradients
from capsnets.functional.squash import _squash
from capsnets.validation import ArgumentError, routing_iterations


@dataclass(frozen=True)
class DynamicRouting:
    """Dynamic routing as a value to pass to a capsule layer. Its defaults are the library's defaults of
    dynamic routing: layers and model builders that are given no routing use ``DynamicRouting()``.

    Args:
        iterations: routing iterations ``r`` (>= 1; the paper uses 3).
        detach_routing: detach the predictions in every iteration but the last (see the module docstring).
        none_of_the_above: an extra parent in each child's softmax that takes coupling but has no capsule
            (Sec. 7; see the module docstring).

    Shape:
        ``(B, I, J, D) -> (B, J, D)``; with ``return_couplings=True`` also the couplings ``(B, I, J)`` to the
        ``J`` parents (without the none-of-the-above parent's share). Empty sizes as in :func:`dynamic_routing`.

    Examples::

        >>> routing = DynamicRouting(2)
        >>> routing(torch.randn(8, 1152, 10, 16)).shape
        torch.Size([8, 10, 16])
        >>> routing.to_config()
        {'type': 'dynamic', 'iterations': 2, 'detach_routing': True, 'none_of_the_above': False}
    """

    iterations: int = 3
    detach_routing: bool = True
    none_of_the_above: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "iterations", routing_iterations("iterations", self.iterations))
        for name in ("detach_routing", "none_of_the_above"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def __call__(self, u_hat: Tensor, *, return_couplings: bool = False):
        return dynamic_routing(
            u_hat,
            self.iterations,
            detach_routing=self.detach_routing,
            none_of_the_above=self.none_of_the_above,
            return_couplings=return_couplings,
        )

    def to_config(self) -> dict:
        """The JSON-able spec of this routing (:func:`~capsnets.functional.routing_from_config` rebuilds it)."""
        return {
            "type": "dynamic",
            "iterations": self.iterations,
            "detach_routing": self.detach_routing,
            "none_of_the_above": self.none_of_the_above,
        }


#: With gradients through every iteration, float32 and half predictions of a larger magnitude are routed in float64.
WIDE_VOTES = 2.0**32

#: Up to this many children per parent, an exported graph sums elementwise products instead of a batched product.
_ELEMENTWISE_CHILDREN = 32


@normalized_gradients
def dynamic_routing(
    u_hat: Tensor,
    iterations: int = DynamicRouting.iterations,
    *,
    detach_routing: bool = DynamicRouting.detach_routing,
    none_of_the_above: bool = DynamicRouting.none_of_the_above,
    return_couplings: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Route child predictions to parent capsules by agreement (Procedure 1).

    Args:
        u_hat: predictions ``u_hat[j|i]`` of every child ``i`` for every parent ``j``.
        iterations: number of routing iterations ``r`` (>= 1).
        detach_routing: detach ``u_hat`` in every iteration but the last (see the module docstring).
        none_of_the_above: route over one more parent, with a logit fixed at 0 and no capsule (Sec. 7).
        return_couplings: also return the couplings ``c`` used in the last iteration.

    Shape:
        - u_hat: ``(B, I, J, D)``; ``J, D >= 1`` (else a ``ValueError`` names the empty size); ``I = 0`` gives
          parents with no input (zero poses), ``B = 0`` empty results.
        - output: ``(B, J, D)``; couplings ``(B, I, J)``, summing to 1 over ``J`` (to 1 less the
          none-of-the-above parent's share with ``none_of_the_above``).

    Examples::

        >>> v, c = dynamic_routing(torch.randn(8, 1152, 10, 16), 3, return_couplings=True)
        >>> v.shape, c.shape
        (torch.Size([8, 10, 16]), torch.Size([8, 1152, 10]))
    """
    check_votes(u_hat, "dynamic_routing")
    routing_iterations("iterations", iterations)
    batch, children, parents, dim = u_hat.shape
    u = u_hat.permute(0, 2, 1, 3).contiguous()  # (B, J, I, D)
    if u.dtype == torch.float16:  # its range is too narrow for the sums and agreements
        u = u.float()
    if _wide(u_hat, detach_routing):
        u = u.double()
    sum_unit, logit_unit = _units(children, dim, iterations)
    u_route = u.detach() if detach_routing else u
    first = 1.0 / (parents + 1 if none_of_the_above else parents)  # the couplings while the logits are all 0
    # An exported graph (ONNX) runs a batched product of tiny matrices as one small GEMM per batch entry;
    # with few children (local routing folds every position into the batch) products and sums are faster.
    elementwise = children <= _ELEMENTWISE_CHILDREN and torch.compiler.is_exporting()
    logits = None  # (B, J, I), times logit_unit; zero on entry, never materialised while it is zero
    for r in range(iterations):
        last = r == iterations - 1
        u_r = u if last else u_route
        if logits is None:
            weights = u.new_full((batch, parents, 1, children), sum_unit * first)
        else:
            weights = (_couplings(logits, logit_unit, none_of_the_above) * sum_unit).unsqueeze(2)  # (B, J, 1, I)
        if elementwise:  # (B, J, I, 1) * (B, J, I, D), summed over I
            s = (weights.transpose(2, 3) * u_r).sum(2)
        else:  # (B, J, 1, I) @ (B, J, I, D) -> (B, J, D), times sum_unit
            s = torch.matmul(weights, u_r).squeeze(2)
        v = _squash(s, unit=sum_unit)  # (B, J, D)
        if not last:  # (B, J, I, D) times (B, J, D, 1) -> (B, J, I): the agreements, times logit_unit
            if elementwise:
                agreement = (u_route * (v * logit_unit).unsqueeze(2)).sum(-1)
            else:
                agreement = matvec(u_route, (v * logit_unit).unsqueeze(-1)).squeeze(-1)
            logits = agreement if logits is None else logits + agreement
    v = v.to(u_hat.dtype)
    if not return_couplings:
        return v
    if logits is None:
        couplings = u_hat.new_full((batch, children, parents), first)
    else:
        couplings = _couplings(logits, logit_unit, none_of_the_above).transpose(1, 2).to(u_hat.dtype)
    return v, couplings


def _wide(u_hat: Tensor, detach_routing: bool) -> bool:
    """Whether ``u_hat`` is routed in float64 (module docstring): gradients through every iteration, float32 or
    half predictions beyond :data:`WIDE_VOTES`, on a device with float64; one host check, not while tracing."""
    if (
        detach_routing
        or u_hat.dtype == torch.float64
        or u_hat.device.type == "mps"
        or not (torch.is_grad_enabled() and u_hat.requires_grad)
        or u_hat.numel() == 0
        or torch.compiler.is_compiling()
        or torch.jit.is_tracing()
    ):
        return False
    with torch.no_grad():
        low, high = torch.aminmax(u_hat.detach())
    return max(-float(low), float(high)) > WIDE_VOTES


def _units(children: int, dim: int, iterations: int) -> tuple[float, float]:
    """Powers of two that keep every sum of the procedure within the largest ``|u_hat|`` (module docstring):
    ``|sum_i c_ij u_ij| <= I max|u|`` and ``|sum of r agreements| <= r sqrt(D) max|u|`` (``|v| < 1``)."""
    sum_unit = 2.0 ** -math.ceil(math.log2(max(children, 1)))
    logit_unit = 2.0 ** -math.ceil(math.log2(2 * iterations * math.sqrt(dim)))
    return sum_unit, logit_unit


def _couplings(logits: Tensor, unit: float, none_of_the_above: bool = False) -> Tensor:
    """``softmax_j(logits / unit)`` (B, J, I), shifted by the per-child maximum first, so it cannot overflow.
    With ``none_of_the_above`` the softmax also runs over a parent ``J + 1`` whose logit is 0, and its
    share is left out of the result."""
    if none_of_the_above:
        logits = torch.cat([logits, logits.new_zeros(logits.shape[0], 1, logits.shape[2])], dim=1)  # (B, J+1, I)
    shifted = logits - logits.detach().amax(dim=1, keepdim=True)
    couplings = torch.softmax(shifted / unit, dim=1)
    return couplings[:, :-1] if none_of_the_above else couplings
