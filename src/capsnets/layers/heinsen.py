"""Capsules with matrix poses routed by Heinsen's algorithm.

Heinsen (2019), "An Algorithm for Routing Capsules in All Domains", arXiv:1911.00792, Sec. 2, and the author's
code (glassroom/heinsen_routing_2019_paper, ``heinsen_routing.py``, ``Routing``). Child ``i`` has a score
``a_i`` (a logit) and a ``d_cov x d_in`` pose ``mu_i``; its vote for parent ``j`` is ``V_ij = mu_i W_ij + B_ij``
(``W_ij`` ``d_in x d_out``, normal over ``d_in`` at the start; ``B_ij`` zeros), and
:func:`~capsnets.functional.heinsen_routing` makes the parents. With ``in_capsules=None`` one ``W_j``,
``B_j`` and ``beta_j`` serve every child, so the layer takes any number of children (the code's layer without
``n_inp``, which its smallNORB classifier routes its part detections with).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from capsnets.functional import HeinsenOutput, HeinsenRouting, as_routing, bind_routing
from capsnets.validation import ArgumentError, positive_int


class HeinsenCapsules(nn.Module):
    """Parent capsules with ``d_cov x d_out`` poses from children with scores and ``d_cov x d_in`` poses.

    Args:
        in_capsules: child capsules ``I``, or None: any number, with weights shared by the children.
        out_capsules: parent capsules ``J``.
        d_cov, d_in, d_out: the poses' rows, the children's columns and the parents' columns.
        routing: a :class:`~capsnets.functional.HeinsenRouting` or its spec; None: ``HeinsenRouting()``.

    Shape:
        - scores ``(B, I)`` (logits) and poses ``(B, I, d_cov, d_in)``
        - output: :class:`~capsnets.functional.HeinsenOutput` with ``scores`` ``(B, J)`` (logits), ``mu`` and
          ``sigma2`` ``(B, J, d_cov, d_out)``, ``couplings`` ``(B, I, J)`` (summing to 1 over ``J``); with
          ``return_couplings``, the output and its couplings
        - ``weight``: ``(I, J, d_in, d_out)`` (``I`` 1 when shared), ``bias``: ``(I, J, d_cov, d_out)``

    Examples::

        >>> layer = HeinsenCapsules(None, 10, 4, 4, 4)
        >>> out = layer(torch.randn(2, 100), torch.randn(2, 100, 4, 4))
        >>> out.scores.shape, out.mu.shape
        (torch.Size([2, 10]), torch.Size([2, 10, 4, 4]))
    """

    def __init__(
        self,
        in_capsules: int | None,
        out_capsules: int,
        d_cov: int,
        d_in: int,
        d_out: int,
        *,
        routing=None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.in_capsules = None if in_capsules is None else positive_int("in_capsules", in_capsules)
        self.out_capsules = positive_int("out_capsules", out_capsules)
        self.d_cov, self.d_in, self.d_out = (
            positive_int(n, v) for n, v in (("d_cov", d_cov), ("d_in", d_in), ("d_out", d_out))
        )
        rows, factory = in_capsules or 1, {"device": device, "dtype": dtype}
        self.routing = bind_routing(
            as_routing(routing, HeinsenRouting, types=("heinsen",)),
            rows,
            d_cov * d_in,
            out_capsules,
            d_cov * d_out,
            **factory,
        )
        self.weight = nn.Parameter(torch.randn(rows, out_capsules, d_in, d_out, **factory) / d_in)
        self.bias = nn.Parameter(torch.zeros(rows, out_capsules, d_cov, d_out, **factory))

    def votes(self, poses: Tensor) -> Tensor:
        """Every child's vote for every parent, ``(B, I, d_cov, d_in) -> (B, I, J, d_cov * d_out)``."""
        expected = (self.in_capsules or poses.shape[1], self.d_cov, self.d_in) if poses.dim() == 4 else None
        if expected is None or tuple(poses.shape[1:]) != expected:
            raise ArgumentError(
                f"HeinsenCapsules expects poses of shape (B, {self.in_capsules or 'I'}, {self.d_cov}, {self.d_in}), "
                f"got {tuple(poses.shape)}"
            )
        if self.in_capsules is None:  # one W_j and B_j for every child
            votes = torch.einsum("bicd,jdh->bijch", poses, self.weight[0]) + self.bias[0]
        else:
            votes = torch.einsum("bicd,ijdh->bijch", poses, self.weight) + self.bias  # (B, I, J, d_cov, d_out)
        return votes.flatten(-2)

    def forward(self, scores: Tensor, poses: Tensor, *, return_couplings: bool = False):
        """The parent capsules of the children's ``scores`` and ``poses``.

        Args:
            scores: the children's scores (logits).
            poses: the children's poses.
            return_couplings: also return the routing's final couplings (see Shape; the output holds them too).

        Returns:
            the parents, or ``(parents, couplings)`` with ``return_couplings``.
        """
        out = self.routing(self.votes(poses), activations=scores)
        parents = (*out.mu.shape[:2], self.d_cov, self.d_out)
        out = HeinsenOutput(out.scores, out.mu.view(parents), out.sigma2.view(parents), out.couplings)
        return (out, out.couplings) if return_couplings else out

    def extra_repr(self) -> str:
        return (
            f"in_capsules={self.in_capsules}, out_capsules={self.out_capsules}, d_cov={self.d_cov}, "
            f"d_in={self.d_in}, d_out={self.d_out}"
        )
