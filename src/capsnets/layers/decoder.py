"""Masked reconstruction decoder (Sabour, Frosst & Hinton 2017, Sec. 4.1, Fig. 2).

All class capsules but one are masked to zero; a small MLP reconstructs the input image from what is
left. During training the true class is kept; at test time the longest capsule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from capsnets.functional import mask_capsules
from capsnets.validation import image_size, positive_int, positive_ints


class CapsuleDecoder(nn.Module):
    """MLP decoder from masked class capsules to an image.

    Args:
        num_capsules: number of class capsules ``J``.
        capsule_dim: class capsule dimension ``D``.
        output_shape: ``(C, H, W)`` of the reconstructed image.
        hidden: sizes of the hidden ReLU layers (paper: 512, 1024).

    Shape:
        - capsules: ``(B, J, D)``; select: ``(B,)`` class indices or ``(B, J)`` mask
        - output: ``(B, C, H, W)`` in ``[0, 1]``

    Examples::

        >>> decoder = CapsuleDecoder(10, 16, (1, 28, 28))
        >>> decoder(torch.randn(2, 10, 16), torch.tensor([3, 7])).shape
        torch.Size([2, 1, 28, 28])
    """

    def __init__(
        self,
        num_capsules: int,
        capsule_dim: int,
        output_shape: Sequence[int],
        *,
        hidden: Sequence[int] = (512, 1024),
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.num_capsules = positive_int("num_capsules", num_capsules)
        self.capsule_dim = positive_int("capsule_dim", capsule_dim)
        self.output_shape = image_size("output_shape", output_shape)
        positive_ints("hidden", tuple(hidden))
        sizes = [num_capsules * capsule_dim, *hidden]
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(fan_in, fan_out, device=device, dtype=dtype), nn.ReLU(inplace=True)]
        layers += [nn.Linear(sizes[-1], math.prod(self.output_shape), device=device, dtype=dtype)]
        self.mlp = nn.Sequential(*layers)

    def forward(self, capsules: Tensor, select: Tensor) -> Tensor:
        flat = mask_capsules(capsules, select)  # (B, J*D)
        return torch.sigmoid(self.mlp(flat)).view(-1, *self.output_shape)

    def extra_repr(self) -> str:
        return f"num_capsules={self.num_capsules}, capsule_dim={self.capsule_dim}, output_shape={self.output_shape}"
