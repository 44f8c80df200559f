"""Inverted dot-product attention routing, within one layer or concurrently across a stack of layers.

Tsai, Srivastava, Goh & Salakhutdinov (2020), "Capsules with Inverted Dot-Product Attention Routing", ICLR,
Procedure 1 and the concurrent iterative routing of its Fig. 3; the authors' code
(apple/ml-capsules-inverted-attention-routing, ``src/layers.py``, ``CapsuleFC.forward``, and
``src/capsule_model.py``, ``CapsModel.forward``). The parent poses start at zero, so the first couplings are
uniform, ``1/J``; each further iteration scores every vote against its parent, ``a_ij = u_hat[j|i] . v_j /
sqrt(D)``, normalises over the *parents* (the inversion: children compete for parents, as queries over keys),
``c_ij = softmax_j(a_ij)``, and sets ``v_j = LayerNorm(sum_i c_ij u_hat[j|i])``: a LayerNorm over the pose
(``eps = 1e-5``, with a learned elementwise affine by default, as ``nn.LayerNorm``) instead of a squash. The
``1/sqrt(D)`` scale of the agreements is the code's (``CapsuleFC.scale``); Procedure 1 has none.

Deviations: the code's re-normalisation ``c / (sum_j c + 1e-10)`` (a no-op up to rounding) and its dropout
on the poses are left out. Parent poses are LayerNorm outputs, whose length is about ``sqrt(D)``, not a
probability: a model reads its classes from them with a layer of its own (the code's ``CapsModel.final_fc``).

Numerics (not in the paper; same values): the agreements are formed from the votes divided by a power of two
``>= max |u_hat|`` per example (1 for votes within [-1, 1]) and shifted by their maximum over parents before
it is put back, the weighted sums with the couplings times ``2^-k`` (``2^k >= I``), and the LayerNorm from each
pose divided by a power of two ``>=`` its largest component, the epsilon scaled to match, so no sum, product or
square overflows for any finite votes; float16/bfloat16 votes are routed in float32. The backward multiplies
the gradient by the votes twice per iteration (through the agreements and the next weighted sum), which overflows
float32 from about 1e19 although the gradient itself is far smaller: float32/half votes that need a gradient
beyond ``2^32`` are routed in float64 (:func:`~capsnets.functional.routing_common.widened`, where the device has
it; one host check) and the results returned in their own dtype.

Dimension legend: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` parent capsule dim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from capsnets.functional.products import matvec
from capsnets.functional.routing_common import (
    BoundRouting,
    check_votes,
    largest_magnitude,
    normalized_gradients,
    power_of_two_above,
    saturating_softmax,
    sum_unit,
    widened,
    working,
)
from capsnets.validation import ArgumentError, flag, routing_iterations

#: LayerNorm's epsilon (``nn.LayerNorm``'s default, used by the authors' code).
LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class InvertedAttentionRouting:
    """Inverted dot-product attention routing as a value to pass to a capsule layer.

    Args:
        iterations: routing iterations (>= 1), the first with uniform couplings. The authors' code
            (``main_capsule.py``) takes ``--num_routing`` with the same meaning.
        affine: learn the LayerNorm's elementwise weight and bias (``(D,)``, one and zero at the start) as
            parameters of the layer the routing is given to (``build``), as ``nn.LayerNorm`` does. False: a
            LayerNorm without parameters.
        eps: the LayerNorm's epsilon.

    Shape:
        ``(B, I, J, D) -> (B, J, D)``; with ``return_couplings=True`` also the couplings ``(B, I, J)`` of the last
        iteration. Empty sizes as in :func:`inverted_attention_routing`.

    Note:
        The parents are LayerNorm outputs, all of length about ``sqrt(D)``: a model whose class scores are capsule
        lengths (e.g. ``capsnet_digits``) cannot learn with this routing in its class layer; read the classes from
        the poses with a layer of its own, as the paper does.

    Examples::

        >>> layer = LinearCapsules(32, 8, 10, 16, routing=InvertedAttentionRouting(2))
        >>> layer(torch.randn(2, 32, 8)).shape, layer.routing.weight.shape
        (torch.Size([2, 10, 16]), torch.Size([16]))
        >>> InvertedAttentionRouting(3, affine=False).to_config()
        {'type': 'inverted_attention', 'iterations': 3, 'affine': False, 'eps': 1e-05}
    """

    iterations: int = 2
    affine: bool = True
    eps: float = LAYER_NORM_EPS

    def __post_init__(self) -> None:
        object.__setattr__(self, "iterations", routing_iterations("iterations", self.iterations))
        flag("affine", self.affine)
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not self.eps > 0:
            raise ArgumentError(f"eps must be a number > 0, got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))

    def __call__(
        self,
        u_hat: Tensor,
        *,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        parents: Tensor | None = None,
        iterations: int | None = None,
        return_couplings: bool = False,
    ):
        if self.affine and (weight is None or bias is None):
            raise ArgumentError(
                "InvertedAttentionRouting(affine=True) learns its LayerNorm's weight and bias: give "
                "it to a capsule layer (which builds them), call .build(in_capsules, in_dim, "
                "out_capsules, out_dim), or pass weight= and bias="
            )
        if not self.affine and (weight is not None or bias is not None):
            raise ArgumentError("InvertedAttentionRouting(affine=False) takes no weight or bias")
        return inverted_attention_routing(
            u_hat,
            self.iterations if iterations is None else iterations,
            weight=weight,
            bias=bias,
            eps=self.eps,
            parents=parents,
            return_couplings=return_couplings,
        )

    def build(self, in_capsules: int, in_dim: int, out_capsules: int, out_dim: int, *, device=None, dtype=None):
        """The routing with its LayerNorm's ``weight`` (ones) and ``bias`` (zeros) ``(out_dim,)`` (an
        ``nn.Module``); the routing itself when ``affine=False``."""
        if not self.affine:
            return self
        return BoundRouting(
            self,
            {
                "weight": torch.ones(out_dim, device=device, dtype=dtype),
                "bias": torch.zeros(out_dim, device=device, dtype=dtype),
            },
        )

    def to_config(self) -> dict:
        """The JSON-able spec of this routing (:func:`~capsnets.functional.routing_from_config` rebuilds it)."""
        return {"type": "inverted_attention", "iterations": self.iterations, "affine": self.affine, "eps": self.eps}


@normalized_gradients
def inverted_attention_routing(
    u_hat: Tensor,
    iterations: int = InvertedAttentionRouting.iterations,
    *,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = LAYER_NORM_EPS,
    parents: Tensor | None = None,
    return_couplings: bool = False,
):
    """Route votes to parents by inverted dot-product attention (Tsai et al. 2020, Procedure 1).

    Args:
        u_hat: votes ``u_hat[j|i]`` of every child ``i`` for every parent ``j``.
        iterations: routing iterations (>= 1); without ``parents`` the first has uniform couplings.
        weight, bias: the LayerNorm's elementwise affine, or None for none.
        eps: the LayerNorm's epsilon.
        parents: parent poses to start from (concurrent routing,
            :func:`concurrent_inverted_attention_routing`); None: zero, i.e. uniform first couplings.
        return_couplings: also return the couplings of the last iteration.

    Shape:
        - u_hat: ``(B, I, J, D)``; weight, bias: ``(D,)``; parents: ``(B, J, D)``
        - ``J, D >= 1`` (else a ``ValueError`` names the empty size); ``I = 0`` gives parents with no input (the
          LayerNorm of a zero pose: its bias), ``B = 0`` empty results.
        - output: ``(B, J, D)``; couplings ``(B, I, J)``, summing to 1 over ``J``.

    Examples::

        >>> inverted_attention_routing(torch.randn(8, 1152, 10, 16), 2).shape
        torch.Size([8, 10, 16])
    """
    check_votes(u_hat, "inverted_attention_routing")
    iterations = routing_iterations("iterations", iterations)
    batch, children, num_parents, dim = u_hat.shape
    for name, value, shape in (
        ("weight", weight, (dim,)),
        ("bias", bias, (dim,)),
        ("parents", parents, (batch, num_parents, dim)),
    ):
        if value is not None and tuple(value.shape) != shape:
            raise ArgumentError(f"inverted_attention_routing expects {name} of shape {shape}, got {tuple(value.shape)}")
    u = widened(u_hat).transpose(1, 2).contiguous()  # (B, J, I, D)
    unit = sum_unit(children)
    k = power_of_two_above(largest_magnitude(u, (1, 2, 3)), 1.0).view(batch, 1, 1)  # 1 for votes within [-1, 1]
    v, couplings = working(parents).to(u.dtype) if parents is not None else None, None
    for _ in range(iterations):
        if v is None:  # poses at zero: every coupling is 1/J
            couplings = u.new_full((batch, num_parents, children), 1.0 / num_parents)
        else:  # (B, J, I, D) @ (B, J, D, 1) -> (B, J, I): the agreements over k, shifted; softmax over parents
            agreement = matvec(u, (v / k).unsqueeze(-1)).squeeze(-1)
            shifted = agreement - agreement.detach().amax(dim=1, keepdim=True)
            couplings = saturating_softmax(shifted * (k / math.sqrt(dim)), dim=1)
        s = torch.matmul((couplings * unit).unsqueeze(2), u).squeeze(2)  # (B, J, D): sum_i c_ij u_hat, times unit
        v = _layer_norm(s, unit, eps, weight, bias)
    v = v.to(u_hat.dtype)
    return (v, couplings.transpose(1, 2).to(u_hat.dtype)) if return_couplings else v


def _layer_norm(s: Tensor, unit: float, eps: float, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """``LayerNorm(s / unit)`` over the last dim, computed from each pose divided by a power of two ``>=`` its
    largest component (``eps`` scaled to match), so that its square cannot overflow."""
    k = power_of_two_above(s.abs().amax(dim=-1, keepdim=True), unit)
    t = s / k
    centred = t - t.mean(dim=-1, keepdim=True)
    variance = centred.square().mean(dim=-1, keepdim=True)
    # eps (unit / k)^2 may underflow to zero for the longest poses: the floor (eps of the dtype, squared; below
    # any variance the rounding of t resolves) keeps a zero variance giving a zero pose, with a finite gradient
    floor = torch.finfo(s.dtype).eps ** 2
    out = centred / (variance + eps * (unit / k).square()).clamp_min(floor).sqrt()
    if weight is not None:
        out = out * working(weight).to(out.dtype)
    if bias is not None:
        out = out + working(bias).to(out.dtype)
    return out


def concurrent_inverted_attention_routing(layers: Sequence, u: Tensor, iterations: int | None = None) -> list[Tensor]:
    """Concurrent iterative routing through a stack of capsule layers (Tsai et al. 2020, Fig. 3).

    The first iteration is one bottom-up pass with uniform couplings in every layer; in each further iteration
    every layer routes at once, from the capsules of the layer below and to the parent poses of the previous
    iteration (``src/capsule_model.py``, ``CapsModel.forward`` with ``sequential_routing=False``).

    Args:
        layers: capsule layers (e.g. :class:`~capsnets.layers.LinearCapsules`), each with ``predictions(u)``
            and inverted dot-product attention as its ``routing`` (an :class:`InvertedAttentionRouting` or the
            module it builds), the output of each the input of the next.
        u: the input capsules of the first layer.
        iterations: routing iterations (>= 1); None: the first layer's routing's.

    Returns:
        The capsules of every layer, the last layer's last.

    Examples::

        >>> stack = [LinearCapsules(32, 8, 16, 12, routing=InvertedAttentionRouting(3)),
        ...          LinearCapsules(16, 12, 10, 16, routing=InvertedAttentionRouting(3))]
        >>> [tuple(v.shape) for v in concurrent_inverted_attention_routing(stack, torch.randn(2, 32, 8))]
        [(2, 16, 12), (2, 10, 16)]
    """
    if len(layers) == 0:
        raise ArgumentError("concurrent_inverted_attention_routing needs at least one layer")
    for index, layer in enumerate(layers):
        spec = getattr(layer.routing, "spec", layer.routing)
        if not isinstance(spec, InvertedAttentionRouting):
            raise ArgumentError(f"layer {index} routes with {layer.routing!r}, not inverted dot-product attention")
    if iterations is None:
        iterations = getattr(layers[0].routing, "spec", layers[0].routing).iterations
    iterations = routing_iterations("iterations", iterations)
    values = [u]
    for layer in layers:  # the first iteration: uniform couplings, bottom-up
        values.append(layer.routing(layer.predictions(values[-1]), iterations=1))
    for _ in range(iterations - 1):  # every layer from the previous iteration's capsules below and above it
        values = [u] + [
            layer.routing(layer.predictions(values[index]), parents=values[index + 1], iterations=1)
            for index, layer in enumerate(layers)
        ]
    return values[1:]
