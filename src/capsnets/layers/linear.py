"""Fully connected capsule layer: one transformation matrix per (child, parent) pair, then routing.

Sabour, Frosst & Hinton (2017), "Dynamic Routing Between Capsules", Sec. 2, Eq. 2:
``u_hat[j|i] = W[i, j] u[i]``; the routing that turns the predictions into parent capsules is passed in
(e.g. :class:`capsnets.functional.DynamicRouting`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from capsnets.functional import DynamicRouting, as_routing, bind_routing
from capsnets.validation import ArgumentError, number, positive_int


class LinearCapsules(nn.Module):
    """Capsules from capsules, fully connected, with routing by agreement.

    Args:
        in_capsules: number of child capsules ``I``.
        in_dim: child capsule dimension ``D_in``.
        out_capsules: number of parent capsules ``J``.
        out_dim: parent capsule dimension ``D_out``.
        routing: a callable ``(B, I, J, D_out) -> (B, J, D_out)`` or its spec (a dict,
            :func:`~capsnets.functional.routing_from_config`); None: ``DynamicRouting()``. A routing with
            parameters of its own (e.g. :class:`~capsnets.functional.SelfRouting`) is built for this
            layer's sizes (``routing.build``), and its parameters are the layer's; one with ``needs_poses`` is
            also given the child capsules (``poses=``).
        init_std: standard deviation of the normal initialisation of ``W``.

    Shape:
        - input: ``(B, I, D_in)``
        - output: ``(B, J, D_out)``; with ``return_couplings``, also the routing's couplings ``(B, I, J)``
          (summing to 1 over ``J`` for dynamic routing; each routing's own normalisation otherwise)
        - ``weight``: ``(I, J, D_out, D_in)``

    Examples:
        >>> layer = LinearCapsules(1152, 8, 10, 16)
        >>> v, couplings = layer(torch.randn(2, 1152, 8), return_couplings=True)
        >>> v.shape, couplings.shape
        (torch.Size([2, 10, 16]), torch.Size([2, 1152, 10]))
    """

    def __init__(
        self,
        in_capsules: int,
        in_dim: int,
        out_capsules: int,
        out_dim: int,
        *,
        routing: Callable[..., Tensor] | None = None,
        init_std: float = 0.01,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.in_capsules = positive_int("in_capsules", in_capsules)
        self.in_dim = positive_int("in_dim", in_dim)
        self.out_capsules = positive_int("out_capsules", out_capsules)
        self.out_dim = positive_int("out_dim", out_dim)
        number("init_std", init_std, 0.0, low_open=True)
        self.routing = bind_routing(
            as_routing(routing, DynamicRouting), in_capsules, in_dim, out_capsules, out_dim, device=device, dtype=dtype
        )
        self.weight = nn.Parameter(
            torch.randn(in_capsules, out_capsules, out_dim, in_dim, device=device, dtype=dtype) * init_std
        )

    def predictions(self, u: Tensor) -> Tensor:
        """Every child's prediction for every parent, ``(B, I, D_in) -> (B, I, J, D_out)``."""
        if u.dim() != 3 or u.shape[1:] != (self.in_capsules, self.in_dim):
            raise ArgumentError(f"LinearCapsules expects (B, {self.in_capsules}, {self.in_dim}), got {tuple(u.shape)}")
        batch = u.shape[0]
        # One batched matmul over children: (I, B, D_in) @ (I, D_in, J*D_out) -> (I, B, J*D_out)
        w = self.weight.permute(0, 3, 1, 2).reshape(self.in_capsules, self.in_dim, -1)
        u_hat = torch.bmm(u.transpose(0, 1), w)
        return u_hat.view(self.in_capsules, batch, self.out_capsules, self.out_dim).transpose(0, 1)

    def forward(self, u: Tensor, *, return_couplings: bool = False):
        """The parent capsules of ``u``.

        Args:
            u: the child capsules.
            return_couplings: also return the routing's final couplings (see Shape).

        Returns:
            the parents, or ``(parents, couplings)`` with ``return_couplings``.
        """
        u_hat = self.predictions(u)  # (B, I, J, D_out)
        children = {"poses": u} if getattr(self.routing, "needs_poses", False) else {}
        if return_couplings:
            return self.routing(u_hat, return_couplings=True, **children)
        return self.routing(u_hat, **children)

    def extra_repr(self) -> str:
        return (
            f"in_capsules={self.in_capsules}, in_dim={self.in_dim}, out_capsules={self.out_capsules}, "
            f"out_dim={self.out_dim}, routing={self.routing!r}"
        )
