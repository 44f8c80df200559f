"""A routing bound to one layer's sizes, holding the routing's own parameters.

Some routings learn: Efficient-CapsNet's self-attention routing a bias per (child, parent) pair, inverted
dot-product attention the affine part of its LayerNorm, self-routing a small routing network per child. Their
spec (e.g. :class:`~capsnets.functional.SelfRouting`) is a frozen dataclass like
:class:`~capsnets.functional.DynamicRouting`; a capsule layer calls its ``build(in_capsules, in_dim,
out_capsules, out_dim)``, which returns a :class:`BoundRouting`: an ``nn.Module``, so the parameters belong to
the layer (optimisers, ``state_dict``, ``.to()``), that calls the spec with them. It holds parameters but no
math, and lives beside the specs that build it, so that ``functional`` imports nothing from ``layers``.
"""

from __future__ import annotations

from torch import Tensor, nn


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
