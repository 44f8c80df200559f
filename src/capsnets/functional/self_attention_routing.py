"""Self-attention routing (Efficient-CapsNet): one pass, no iterations.

Mazzia, Salvetti & Chiaberge (2021), "Efficient-CapsNet: Capsule Network with Self-Attention Routing",
Scientific Reports 11 (its self-attention routing), and the authors' code (EscVM/Efficient-CapsNet,
``utils/layers.py``, ``FCCaps.call``). For each parent ``j`` the agreement of child ``i``'s vote with all the
votes for ``j``, ``A_ij = sum_k u_hat[j|i] . u_hat[j|k]``, scaled by ``1/sqrt(D)``, gives the couplings
``c_ij = softmax_j(A_ij / sqrt(D))``; the log priors ``b_ij`` (learned, zero at the start) are added to the
couplings, as in the code (``c = softmax(...); c = c + b``), and ``v_j = squash(sum_i (c_ij + b_ij) u_hat[j|i])``.
The paper uses its own squash (:func:`~capsnets.functional.efficient_squash`), the default here.

Implementation (same values): the votes are laid out once as ``(B, J, I, D)``, so the sums over children and the
agreements are batched matrix products (as in :func:`~capsnets.functional.dynamic_routing`). Numerics (not in
the paper): sums are formed with every term times ``2^-n`` (``2^n >= I``; with log priors, also over a power of
two ``>= max |c + b|``), and the agreements from the votes over a power of two ``k >= max |u_hat|`` per example
(``k = 1`` for votes within [-1, 1]), shifted by their maximum over parents before ``k^2`` is put back, so the
output is finite for every finite vote; float16/bfloat16 votes are routed in float32. The backward is written
out (:class:`_Attention`) in the same units, the logits' scale ``k^2 / sqrt(D)`` put back last, so a vote's
gradient is inf only where its value is beyond the dtype (about ``k`` times the loss's gradient at tied
agreements), and never NaN; the loss's gradient is divided by a power of two above its largest magnitude while
it is backpropagated (:func:`~capsnets.functional.routing_common.normalized_gradients`).

Dimension legend: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` parent capsule dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.functional.products import matvec
from capsnets.functional.routing_common import (
    SQUASHES,
    BoundRouting,
    apply_squash,
    check_votes,
    largest_magnitude,
    normalized_gradients,
    power_of_two_above,
    squash_scaled,
    sum_unit,
    working,
)
from capsnets.validation import ArgumentError, choice, flag


@dataclass(frozen=True)
class SelfAttentionRouting:
    """Self-attention routing as a value to pass to a capsule layer.

    Args:
        bias: learn the log priors ``b`` (``(I, J)``, zero at the start) as in the paper; they are parameters of
            the layer the routing is given to (``build``). False: no priors, and no parameters.
        squash: ``"efficient"`` (the paper's, :func:`~capsnets.functional.efficient_squash`) or ``"sabour"``.

    Shape:
        ``(B, I, J, D) -> (B, J, D)``; with ``return_couplings=True`` also the couplings ``c + b`` ``(B, I, J)``.
        Empty sizes as in :func:`self_attention_routing`.

    Examples::

        >>> layer = LinearCapsules(32, 8, 10, 16, routing=SelfAttentionRouting())
        >>> layer(torch.randn(2, 32, 8)).shape, layer.routing.bias.shape
        (torch.Size([2, 10, 16]), torch.Size([32, 10]))
        >>> SelfAttentionRouting(bias=False)(torch.randn(2, 32, 10, 16)).shape
        torch.Size([2, 10, 16])
    """

    bias: bool = True
    squash: str = "efficient"

    def __post_init__(self) -> None:
        flag("bias", self.bias)
        choice("squash", self.squash, SQUASHES)

    def __call__(self, u_hat: Tensor, *, bias: Tensor | None = None, return_couplings: bool = False):
        if self.bias and bias is None:
            raise ArgumentError(
                "SelfAttentionRouting(bias=True) learns its log priors: give it to a capsule layer "
                "(which builds them), call .build(in_capsules, in_dim, out_capsules, out_dim), or "
                "pass bias=; SelfAttentionRouting(bias=False) has none"
            )
        if not self.bias and bias is not None:
            raise ArgumentError("SelfAttentionRouting(bias=False) takes no bias")
        return self_attention_routing(u_hat, bias, squash=self.squash, return_couplings=return_couplings)

    def build(self, in_capsules: int, in_dim: int, out_capsules: int, out_dim: int, *, device=None, dtype=None):
        """The routing with its log priors ``b`` ``(in_capsules, out_capsules)``, zeros (an ``nn.Module``);
        the routing itself when ``bias=False``."""
        if not self.bias:
            return self
        return BoundRouting(self, {"bias": torch.zeros(in_capsules, out_capsules, device=device, dtype=dtype)})

    def to_config(self) -> dict:
        """The JSON-able spec of this routing (:func:`~capsnets.functional.routing_from_config` rebuilds it)."""
        return {"type": "self_attention", "bias": self.bias, "squash": self.squash}


@normalized_gradients
def self_attention_routing(
    u_hat: Tensor, bias: Tensor | None = None, *, squash: str = "efficient", return_couplings: bool = False
):
    """Route votes to parents by their agreement with all the votes for that parent (one pass).

    Args:
        u_hat: votes ``u_hat[j|i]`` of every child ``i`` for every parent ``j``.
        bias: log priors ``b`` added to the couplings, or None for none.
        squash: ``"efficient"`` or ``"sabour"`` (see :class:`SelfAttentionRouting`).
        return_couplings: also return the couplings ``c + b``.

    Shape:
        - u_hat: ``(B, I, J, D)``; bias: ``(I, J)``; ``J, D >= 1`` (else a ``ValueError`` names the empty size);
          ``I = 0`` gives parents with no input (zero poses), ``B = 0`` empty results.
        - output: ``(B, J, D)``; couplings ``(B, I, J)``.

    Examples::

        >>> v, c = self_attention_routing(torch.randn(8, 1152, 10, 16), return_couplings=True)
        >>> v.shape, c.shape
        (torch.Size([8, 10, 16]), torch.Size([8, 1152, 10]))
    """
    check_votes(u_hat, "self_attention_routing")
    choice("squash", squash, SQUASHES)
    batch, children, parents, dim = u_hat.shape
    if bias is not None and tuple(bias.shape) != (children, parents):
        raise ArgumentError(
            f"self_attention_routing expects a bias of shape (I, J) = {(children, parents)}, got {tuple(bias.shape)}"
        )
    u = working(u_hat).transpose(1, 2).contiguous()  # (B, J, I, D)
    b = None if bias is None else working(bias).to(u.dtype).t()  # (J, I)
    if (
        torch.is_grad_enabled()
        and (u.requires_grad or (b is not None and b.requires_grad))
        and not (torch.compiler.is_compiling() or torch.jit.is_tracing())
    ):
        s, couplings, m = _Attention.apply(u, b)
    else:
        s, couplings, m = _attend(u, b)[:3]
    unit = sum_unit(children)
    v = apply_squash(squash, s, unit) if b is None else squash_scaled(squash, s, m / unit)
    v = v.to(u_hat.dtype)
    couplings = couplings.transpose(1, 2)  # (B, I, J)
    return (v, couplings.to(u_hat.dtype)) if return_couplings else v


def _attend(u: Tensor, b: Tensor | None):
    """The weighted sums ``s`` ``(B, J, D)`` (``sum_i (c + b) u_hat`` times ``unit / m``), the couplings ``c + b``
    ``(B, J, I)``, ``m`` (``(B, J, 1)``, 1 without log priors), and what the backward of :class:`_Attention`
    uses: ``tau`` (``unit sum_i u_hat / k``, ``(B, J, D)``), the couplings ``c`` and ``k`` ``(B, 1, 1)``."""
    batch, _, children, dim = u.shape
    unit = sum_unit(children)
    # k: a power of two >= max |u_hat| per example (at most the dtype's largest), 1 for votes within [-1, 1]
    k = power_of_two_above(largest_magnitude(u, (1, 2, 3)), 1.0).view(batch, 1, 1)
    ones = u.new_full((1, 1, 1, children), unit)
    tau = torch.matmul(ones, u).squeeze(2) / k  # (B, J, D): unit sum_k u_hat[j|k] / k, within [-1, 1]
    # (B, J, I, D) @ (B, J, D, 1) -> (B, J, I): A_ij unit / k^2, each product within max |u_hat| / k <= 1
    agreement = matvec(u, (tau / k).unsqueeze(-1)).squeeze(-1)
    shifted = agreement - agreement.detach().amax(dim=1, keepdim=True)  # <= 0, exactly 0 at the maximum
    # each factor finite, so a zero stays zero and the rest go at most to -inf
    c = torch.softmax(shifted * (k / math.sqrt(dim)) * k / unit, dim=1)  # (B, J, I)
    if b is None:
        s = torch.matmul((c * unit).unsqueeze(2), u).squeeze(2)  # (B, J, D): sum_i c u_hat, times unit
        return s, c, u.new_ones(()), tau, c, k
    # the weights c + b over m, a power of two >= their largest, so that the sum cannot overflow either
    w = c + b
    m = power_of_two_above(largest_magnitude(w, 2, keepdim=True), 1.0)
    s = torch.matmul((w * (unit / m)).unsqueeze(2), u).squeeze(2)  # sum_i (c + b) u_hat, times unit / m
    return s, w, m, tau, c, k


class _Attention(torch.autograd.Function):
    """:func:`_attend` differentiated in units that keep every product of the backward within the dtype.

    Autograd's chain multiplies the gradient of the logits by their scale ``k^2 / (sqrt(D) unit)`` before the
    agreements' factors ``u_hat / k`` bring it back: beyond votes of about the square root of the dtype's
    largest, the product overflows, and ``inf * 0`` or ``inf - inf`` gives NaN, although the gradient is
    about ``k``. Here the gradient of the couplings is taken over ``k`` (``gamma``, a sum of products with
    ``u_hat / k``), the softmax's backward and the agreements' in those units, and the factor ``k^2 / (sqrt(D)
    unit)`` comes last: the gradient of a vote overflows to inf only where its value is beyond the dtype's
    largest, and is never NaN."""

    @staticmethod
    def forward(ctx, u, b):
        s, w, m, tau, c, k = _attend(u, b)
        ctx.save_for_backward(u, tau, c, w, m, k)
        ctx.has_bias = b is not None
        ctx.mark_non_differentiable(m)
        return s, w, m

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_s, g_w, _):
        u, tau, c, w, m, k = ctx.saved_tensors
        dim, unit = u.shape[-1], sum_unit(u.shape[2])
        k4 = k.unsqueeze(-1)
        a = u / k4  # within [-1, 1]
        weight = w * (unit / m)  # the weights of the sum s
        # the couplings' gradient over k: the outputs' own and that through s, (unit / m) g_s . u_hat / k
        gamma = g_w / k + matvec(a, g_s.unsqueeze(-1)).squeeze(-1) * (unit / m)  # (B, J, I)
        h = c * (gamma - (c * gamma).sum(1, keepdim=True))  # the logits' gradient over k (softmax over parents)
        # the agreements a_i . tau (tau = unit sum_i a_i): their gradient in a_i, over k and the logits' scale ...
        g_u = h.unsqueeze(-1) * tau.unsqueeze(2)
        g_u += unit * torch.matmul(h.unsqueeze(2), a)  # (B, J, I, D)
        # ... which comes last (finite factors: a zero stays zero, the rest may overflow), and the sum's own
        g_u *= k4
        g_u /= math.sqrt(dim) * unit
        g_u *= k4
        g_u.addcmul_(weight.unsqueeze(-1), g_s.unsqueeze(2))
        g_b = None
        if ctx.has_bias and ctx.needs_input_grad[1]:  # w = c + b: the couplings' whole gradient, summed over B
            top = torch.finfo(u.dtype).max
            share = sum_unit(u.shape[0])
            g_b = (gamma * (k * share)).clamp(-top, top).sum(0) / share
        return g_u, g_b
