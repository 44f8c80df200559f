"""Routing at every position of a capsule grid (convolutional capsules).

LaLonde & Bagci (2018), "Capsules for Object Segmentation", Sec. 3.1: convolutional capsules route *locally*:
:func:`local_routing` runs a routing procedure independently at every output position, between the child and
parent capsule types there.

Dimension legend: ``B`` batch, ``I`` child capsule types, ``J`` parent capsule types, ``D`` parent capsule dim,
``H``/``W`` rows/columns of the capsule grid.
"""

from __future__ import annotations

from torch import Tensor

from capsnets.functional.routing import DynamicRouting
from capsnets.functional.routing_spec import as_routing


def local_routing(u_hat: Tensor, routing=None, *, return_couplings: bool = False):
    """Route independently at every output position of a convolutional capsule layer.

    LaLonde & Bagci (2018), Sec. 3.1: each example and position ``(h, w)`` is one routing problem between
    the ``I`` child types and the ``J`` parent types there (logits ``b`` of shape ``(I, H, W, J)`` per
    example, reset per forward, softmax over parents at each position). The positions are folded into the
    batch, so any routing callable for ``(B, I, J, D)`` routes locally.

    Args:
        u_hat: every child type's prediction for every parent type at every position.
        routing: a routing callable, or its spec (a dict, :func:`~capsnets.functional.routing_from_config`);
            None: ``DynamicRouting()``.
        return_couplings: also return the couplings of the last iteration.

    Shape:
        - u_hat: ``(B, I, J, D, H, W)``; ``J, D >= 1`` (else the routing's ``ValueError`` names the empty
          size); no child types give parents with no input, an empty batch or grid empty results.
        - output: ``(B, J, D, H, W)``; couplings ``(B, I, J, H, W)``, summing to 1 over ``J``.

    Examples::

        >>> local_routing(torch.randn(2, 4, 8, 16, 6, 6), DynamicRouting(3)).shape
        torch.Size([2, 8, 16, 6, 6])
    """
    if u_hat.dim() != 6:
        raise ValueError(
            f"local_routing expects u_hat of shape (B, I, J, D, H, W) (batch, child types, parent "
            f"types, parent dim, rows, columns); got shape {tuple(u_hat.shape)}"
        )
    if not callable(routing):  # None or a spec (the layers pass routing objects)
        routing = as_routing(routing, DynamicRouting)
    batch, children, parents, dim, height, width = u_hat.shape
    # (B, I, J, D, H, W) -> (B, H, W, I, J, D) -> (B*H*W, I, J, D): one routing problem per position
    flat = u_hat.permute(0, 4, 5, 1, 2, 3).reshape(batch * height * width, children, parents, dim)
    v, couplings = routing(flat, return_couplings=True) if return_couplings else (routing(flat), None)
    v = v.view(batch, height, width, parents, dim).permute(0, 3, 4, 1, 2)  # (B, J, D, H, W)
    if not return_couplings:
        return v
    return v, couplings.view(batch, height, width, children, parents).permute(0, 3, 4, 1, 2)


def local_dynamic_routing(
    u_hat: Tensor,
    iterations: int = DynamicRouting.iterations,
    *,
    detach_routing: bool = DynamicRouting.detach_routing,
    none_of_the_above: bool = DynamicRouting.none_of_the_above,
    return_couplings: bool = False,
):
    """:func:`dynamic_routing` at every position of a capsule grid; see :func:`local_routing` for shapes."""
    return local_routing(
        u_hat, DynamicRouting(iterations, detach_routing, none_of_the_above), return_couplings=return_couplings
    )
