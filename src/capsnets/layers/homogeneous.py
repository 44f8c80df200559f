"""Homogeneous vector capsules: class capsules from child capsules of the same dimension, without routing.

Byerly, Kalganova & Dear (2021), "No Routing Needed Between Capsules", Neurocomputing 463 (arXiv:2001.09136),
Sec. 3, and the authors' code (AdamByerly/BMCNNwHFCs, ``python/models/nn_ops.py``, ``hvc_from_xyz``, and
``variable.py``): :func:`~capsnets.functional.homogeneous_vector_capsules`, then batch normalisation over the
batch and the classes of each capsule component, with a learned offset and no scale (the code's
``batch_norm``, epsilon 1e-3: :class:`OffsetBatchNorm`), then a ReLU. A class's logit is the length of its capsule.

Deviation: the running statistics of the normalisation follow PyTorch's momentum (0.1), not the code's decay of
0.9997.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from capsnets.functional import homogeneous_vector_capsules
from capsnets.validation import number, positive_int


class OffsetBatchNorm(nn.Module):
    """Batch normalisation with a learned offset and no scale (the authors' ``batch_norm``, epsilon 1e-3), with
    statistics over every dimension but the second.

    Args:
        channels: size ``C`` of the second dimension.

    Shape:
        ``(B, C, ...) -> (B, C, ...)``

    Examples::

        >>> OffsetBatchNorm(8)(torch.randn(4, 8, 5, 5)).shape
        torch.Size([4, 8, 5, 5])
    """

    def __init__(self, channels: int, *, device=None, dtype=None) -> None:
        super().__init__()
        channels = positive_int("channels", channels)
        self.norm = nn.BatchNorm1d(channels, eps=1e-3, affine=False, device=device, dtype=dtype)
        self.offset = nn.Parameter(torch.zeros(channels, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        last = x.movedim(1, -1)  # (B, ..., C)
        normed = self.norm(last.reshape(-1, x.shape[1])) + self.offset  # (everything else, C)
        return normed.view(last.shape).movedim(-1, 1)


class HomogeneousVectorCapsules(nn.Module):
    """Class capsules as sums of element-wise products with the children, batch-normalised and rectified.

    Args:
        in_capsules: child capsules ``I``.
        dim: the dimension ``D`` of every child and parent capsule.
        out_capsules: parent capsules ``J`` (the classes).
        init_std: standard deviation of the normal initialisation of the weights (the code's 0.05).

    Shape:
        - input: ``(B, I, D)``
        - output: ``(B, J, D)``, non-negative; with ``return_couplings``, also the couplings ``(B, I, J)``, all
          1: without routing, every child goes whole to every parent (they do not sum to 1 over ``J``)
        - ``weight``: ``(J, I, D)``

    Examples::

        >>> layer = HomogeneousVectorCapsules(100, 16, 10)
        >>> capsules = layer(torch.randn(4, 100, 16))
        >>> capsules.shape, bool((capsules >= 0).all())
        (torch.Size([4, 10, 16]), True)
    """

    def __init__(
        self, in_capsules: int, dim: int, out_capsules: int, *, init_std: float = 0.05, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.in_capsules, self.dim = positive_int("in_capsules", in_capsules), positive_int("dim", dim)
        self.out_capsules = positive_int("out_capsules", out_capsules)
        number("init_std", init_std, 0.0, low_open=True)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.randn(out_capsules, in_capsules, dim, **factory) * init_std)
        self.norm = OffsetBatchNorm(dim, **factory)

    def forward(self, u: Tensor, *, return_couplings: bool = False):
        """The class capsules of ``u``.

        Args:
            u: the child capsules.
            return_couplings: also return the couplings (see Shape), as the routing layers do.

        Returns:
            the class capsules, or ``(capsules, couplings)`` with ``return_couplings``.
        """
        s = homogeneous_vector_capsules(u, self.weight)  # (B, J, D)
        v = torch.relu(self.norm(s.transpose(1, 2)).transpose(1, 2))  # statistics over B and J
        if not return_couplings:
            return v
        return v, u.new_ones(u.shape[0], self.in_capsules, self.out_capsules)

    def extra_repr(self) -> str:
        return f"in_capsules={self.in_capsules}, dim={self.dim}, out_capsules={self.out_capsules}"
