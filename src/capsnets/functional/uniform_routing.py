"""Uniform coupling: no routing at all, the ablation baseline of the routing algorithms.

Every child sends its vote to every parent with the same coupling ``c_ij = 1/J`` (the couplings dynamic routing
starts from: Sabour, Frosst & Hinton 2017, Procedure 1, with one iteration), or, with ``mean=True``, ``1/I``
(each parent the mean of its votes); then squash. Paik, Kwak & Kim (2019), "Capsule Networks Need an Improved
Routing Algorithm", report routing algorithms that do no better than couplings assigned uniformly.

Dimension legend: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` parent capsule dim.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from capsnets.functional.routing_common import (
    SQUASHES,
    apply_squash,
    check_votes,
    normalized_gradients,
    sum_unit,
    working,
)
from capsnets.validation import choice, flag


@dataclass(frozen=True)
class UniformRouting:
    """Parents from uniformly coupled votes, as a value to pass to a capsule layer.

    Args:
        mean: couplings ``1/I`` (each parent the mean of its votes) instead of ``1/J``.
        squash: ``"sabour"`` (Sabour et al. 2017, Eq. 1) or ``"efficient"``
            (:func:`~capsnets.functional.efficient_squash`).

    Shape:
        ``(B, I, J, D) -> (B, J, D)``; with ``return_couplings=True`` also the couplings ``(B, I, J)``. Empty
        sizes as in :func:`uniform_routing`.

    Examples::

        >>> UniformRouting()(torch.randn(8, 1152, 10, 16)).shape
        torch.Size([8, 10, 16])
        >>> UniformRouting().to_config()
        {'type': 'uniform', 'mean': False, 'squash': 'sabour'}
    """

    mean: bool = False
    squash: str = "sabour"

    def __post_init__(self) -> None:
        flag("mean", self.mean)
        choice("squash", self.squash, SQUASHES)

    def __call__(self, u_hat: Tensor, *, return_couplings: bool = False):
        return uniform_routing(u_hat, mean=self.mean, squash=self.squash, return_couplings=return_couplings)

    def build(self, in_capsules: int, in_dim: int, out_capsules: int, out_dim: int, *, device=None, dtype=None):
        """No parameters: the routing itself (see :func:`~capsnets.functional.routing_common.bind_routing`)."""
        return self

    def to_config(self) -> dict:
        """The JSON-able spec of this routing (:func:`~capsnets.functional.routing_from_config` rebuilds it)."""
        return {"type": "uniform", "mean": self.mean, "squash": self.squash}


@normalized_gradients
def uniform_routing(u_hat: Tensor, *, mean: bool = False, squash: str = "sabour", return_couplings: bool = False):
    """``v_j = squash(sum_i c u_hat[j|i])`` with ``c = 1/J`` (or ``1/I`` with ``mean=True``).

    Shape:
        - u_hat: ``(B, I, J, D)``; ``J, D >= 1`` (else a ``ValueError`` names the empty size); ``I = 0`` gives
          parents with no input (zero poses), ``B = 0`` empty results.
        - output: ``(B, J, D)``; couplings ``(B, I, J)``, all ``c``.

    Examples::

        >>> u_hat = torch.randn(2, 6, 3, 4)
        >>> torch.allclose(uniform_routing(u_hat), dynamic_routing(u_hat, 1))
        True
    """
    check_votes(u_hat, "uniform_routing")
    choice("squash", squash, SQUASHES)
    batch, children, parents, _ = u_hat.shape
    unit = sum_unit(children)
    s = (working(u_hat) * unit).sum(dim=1)  # (B, J, D): sum_i u_hat / 2^k, within max |u_hat|
    share = children if mean else parents  # no children (mean): no votes, a zero sum, and no couplings to fill
    v = apply_squash(squash, s, unit * max(share, 1)).to(u_hat.dtype)
    if not return_couplings:
        return v
    return v, u_hat.new_full((batch, children, parents), 1.0 / max(share, 1))
