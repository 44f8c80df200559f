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
output is finite for every finite vote; float16/bfloat16 votes are routed in float32. The gradient grows with
the votes squared: it is finite for votes up to about 1e12, and beyond, up to the dtype's largest, wherever the
couplings saturate at 0 and 1 (all but near-tied agreements), since the softmax gives a coupling of zero a zero
gradient, whatever the gradient that reaches it.

Dimension legend: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` parent capsule dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.functional.bound_routing import BoundRouting
from capsnets.functional.products import matvec
from capsnets.functional.routing_common import (
    SQUASHES,
    apply_squash,
    check_votes,
    largest_magnitude,
    power_of_two_above,
    saturating_softmax,
    squash_scaled,
    sum_unit,
    working,
)
from capsnets.validation import choice, flag


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
            raise ValueError(
                "SelfAttentionRouting(bias=True) learns its log priors: give it to a capsule layer "
                "(which builds them), call .build(in_capsules, in_dim, out_capsules, out_dim), or "
                "pass bias=; SelfAttentionRouting(bias=False) has none"
            )
        if not self.bias and bias is not None:
            raise ValueError("SelfAttentionRouting(bias=False) takes no bias")
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
        raise ValueError(
            f"self_attention_routing expects a bias of shape (I, J) = {(children, parents)}, got {tuple(bias.shape)}"
        )
    u = working(u_hat).transpose(1, 2).contiguous()  # (B, J, I, D)
    unit = sum_unit(children)
    # k: a power of two >= max |u_hat| per example (at most the dtype's largest), 1 for votes within [-1, 1]
    k = power_of_two_above(largest_magnitude(u, (1, 2, 3)), 1.0).view(batch, 1, 1)
    ones = u.new_full((1, 1, 1, children), unit)
    total = torch.matmul(ones, u).squeeze(2) / k  # (B, J, D): unit sum_k u_hat[j|k] / k, within [-1, 1]
    # (B, J, I, D) @ (B, J, D, 1) -> (B, J, I): A_ij unit / k^2, each product within max |u_hat| / k <= 1
    agreement = matvec(u, (total / k).unsqueeze(-1)).squeeze(-1)
    shifted = agreement - agreement.detach().amax(dim=1, keepdim=True)  # <= 0, exactly 0 at the maximum
    # each factor finite, so a zero stays zero and the rest go at most to -inf
    couplings = saturating_softmax(shifted * (k / math.sqrt(dim)) * k / unit, dim=1)  # (B, J, I)
    if bias is None:
        s = torch.matmul((couplings * unit).unsqueeze(2), u).squeeze(2)  # (B, J, D): sum_i c u_hat, times unit
        v = apply_squash(squash, s, unit)
    else:  # the weights c + b over m, a power of two >= their largest, so that the sum cannot overflow either
        couplings = couplings + working(bias).to(couplings.dtype).t()
        m = power_of_two_above(largest_magnitude(couplings, 2, keepdim=True), 1.0)
        s = torch.matmul((couplings * (unit / m)).unsqueeze(2), u).squeeze(2)  # sum_i (c + b) u_hat, times unit / m
        v = squash_scaled(squash, s, m / unit)
    v = v.to(u_hat.dtype)
    couplings = couplings.transpose(1, 2)  # (B, I, J)
    return (v, couplings.to(u_hat.dtype)) if return_couplings else v
