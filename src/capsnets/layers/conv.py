"""Convolutional and transposed-convolutional capsule layers with local routing.

LaLonde & Bagci (2018), "Capsules for Object Segmentation" (SegCaps), Sec. 3.1. Children are
capsule types on a grid. One convolution, its weights shared across child types, maps each child type's
``D_in`` maps to ``J x D_out`` maps: the predictions ``u_hat`` of every child type for every parent type
at every output position (the convolution's bias is part of ``u_hat``). Routing then runs independently
at each position (:func:`capsnets.functional.local_routing`).

Deviation: LaLonde & Bagci's code adds the bias to the routed sum ``s`` of each parent; here it is the
convolution's bias, added to every prediction ``u_hat``. Routing logits are per example with the softmax
over parent types, as in LaLonde & Bagci (2018), Sec. 3.1, and their code (the Bass tutorial's code shares
the logits across the batch and normalises them over child types).

Dimension legend: ``B`` batch, ``I``/``J`` child/parent capsule types, ``D_in``/``D_out`` capsule
dimensions, ``H``/``W`` grid rows/columns (primed: the output grid).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from capsnets.functional import DynamicRouting, as_routing, bind_routing, local_routing
from capsnets.validation import ArgumentError, non_negative_int, positive_int


class _GridCapsules(nn.Module):
    """What the convolutional and transposed layers share: checks, predictions, routing, repr."""

    conv: nn.Module

    def __init__(
        self,
        in_types: int,
        in_dim: int,
        out_types: int,
        out_dim: int,
        kernel_size: int,
        stride: int,
        padding: int,
        routing: Callable[..., Tensor] | None,
        *,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.in_types = positive_int("in_types", in_types)
        self.in_dim = positive_int("in_dim", in_dim)
        self.out_types = positive_int("out_types", out_types)
        self.out_dim = positive_int("out_dim", out_dim)
        self.kernel_size = positive_int("kernel_size", kernel_size)
        self.stride = positive_int("stride", stride)
        self.padding = non_negative_int("padding", padding)
        routing = as_routing(routing, DynamicRouting)
        if getattr(routing, "needs_poses", False):
            raise ArgumentError(
                f"routing={routing!r} routes by the children's own poses, which a convolutional capsule "
                f"layer does not give it; use it in LinearCapsules"
            )
        # a routing with parameters (e.g. self-attention's log priors) gets one set per (child type, parent type)
        self.routing = bind_routing(routing, in_types, in_dim, out_types, out_dim, device=device, dtype=dtype)

    def predictions(self, u: Tensor) -> Tensor:
        """Every child type's prediction for every parent type: ``(B, I, D_in, H, W) -> (B, I, J, D_out, H', W')``."""
        if u.dim() != 5 or u.shape[1:3] != (self.in_types, self.in_dim):
            raise ArgumentError(
                f"{type(self).__name__} expects capsules of shape "
                f"(B, {self.in_types}, {self.in_dim}, H, W) (batch, types, dim, rows, columns); "
                f"got {tuple(u.shape)}"
            )
        batch, _, _, height, width = u.shape
        maps = self.conv(u.reshape(batch * self.in_types, self.in_dim, height, width))  # (B*I, J*D_out, H', W')
        return maps.view(batch, self.in_types, self.out_types, self.out_dim, *maps.shape[-2:])

    def forward(self, u: Tensor, *, return_couplings: bool = False):
        """The parent capsules of ``u``.

        Args:
            u: the child capsules ``(B, I, D_in, H, W)``.
            return_couplings: also return the routing's final couplings at every output position,
                ``(B, I, J, H', W')`` (summing to 1 over ``J`` for dynamic routing).

        Returns:
            the parents ``(B, J, D_out, H', W')``, or ``(parents, couplings)`` with ``return_couplings``.
        """
        return local_routing(self.predictions(u), self.routing, return_couplings=return_couplings)

    def extra_repr(self) -> str:
        return (
            f"in_types={self.in_types}, in_dim={self.in_dim}, out_types={self.out_types}, out_dim={self.out_dim}, "
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"routing={self.routing!r}"
        )


class ConvCapsules2d(_GridCapsules):
    """Capsule types on a grid -> capsule types on a grid, by a shared convolution and local routing.

    Args:
        in_types, in_dim: child capsule types ``I`` and their dimension ``D_in``.
        out_types, out_dim: parent capsule types ``J`` and their dimension ``D_out``.
        kernel_size, stride, padding: of the convolution (``padding`` default ``kernel_size // 2``).
        routing: a callable ``(N, I, J, D_out) -> (N, J, D_out)`` run at every position, or its spec (a
            dict); None: ``DynamicRouting()`` (SegCaps routes once in its first capsule layer).

    Shape:
        - input: ``(B, I, D_in, H, W)``
        - output: ``(B, J, D_out, H', W')`` with ``H' = (H + 2 padding - kernel_size) // stride + 1``; with
          ``return_couplings``, also the couplings ``(B, I, J, H', W')``
        - ``conv.weight``: ``(J * D_out, D_in, kernel_size, kernel_size)``, shared by all child types

    Examples:
        >>> layer = ConvCapsules2d(2, 16, 4, 16, kernel_size=5, stride=2)
        >>> layer(torch.randn(1, 2, 16, 32, 32)).shape
        torch.Size([1, 4, 16, 16, 16])
    """

    def __init__(
        self,
        in_types: int,
        in_dim: int,
        out_types: int,
        out_dim: int,
        *,
        kernel_size: int = 5,
        stride: int = 1,
        padding: int | None = None,
        routing: Callable[..., Tensor] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        padding = kernel_size // 2 if padding is None else padding
        super().__init__(
            in_types, in_dim, out_types, out_dim, kernel_size, stride, padding, routing, device=device, dtype=dtype
        )
        self.conv = nn.Conv2d(in_dim, out_types * out_dim, kernel_size, stride, padding, device=device, dtype=dtype)


class ConvTransposeCapsules2d(_GridCapsules):
    """The transposed ("deconvolutional") capsule layer of SegCaps' decoder: upsamples the grid.

    Args: as :class:`ConvCapsules2d`, for a transposed convolution (default ``kernel_size=4, stride=2,
    padding=1``, which doubles the grid).

    Shape:
        - input: ``(B, I, D_in, H, W)``
        - output: ``(B, J, D_out, H', W')`` with ``H' = (H - 1) stride - 2 padding + kernel_size``; with
          ``return_couplings``, also the couplings ``(B, I, J, H', W')``
        - ``conv.weight``: ``(D_in, J * D_out, kernel_size, kernel_size)``

    Examples:
        >>> layer = ConvTransposeCapsules2d(4, 16, 2, 16)
        >>> layer(torch.randn(1, 4, 16, 8, 8)).shape
        torch.Size([1, 2, 16, 16, 16])
    """

    def __init__(
        self,
        in_types: int,
        in_dim: int,
        out_types: int,
        out_dim: int,
        *,
        kernel_size: int = 4,
        stride: int = 2,
        padding: int = 1,
        routing: Callable[..., Tensor] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            in_types, in_dim, out_types, out_dim, kernel_size, stride, padding, routing, device=device, dtype=dtype
        )
        self.conv = nn.ConvTranspose2d(
            in_dim, out_types * out_dim, kernel_size, stride, padding, device=device, dtype=dtype
        )
