"""Masking of class capsules for the reconstruction decoder (Sabour et al. 2017, Sec. 4.1)."""

from __future__ import annotations

import torch
from torch import Tensor

from capsnets.validation import ArgumentError


def mask_capsules(capsules: Tensor, select: Tensor) -> Tensor:
    """Zero every capsule but the selected one(s), then flatten.

    Args:
        capsules: class capsule vectors.
        select: ``(B,)`` class indices, or a ``(B, J)`` mask/weights (e.g. one-hot or multi-hot).

    Shape:
        - capsules: ``(B, J, D)``
        - output: ``(B, J * D)``

    Examples::

        >>> mask_capsules(torch.ones(2, 10, 16), torch.tensor([3, 7])).view(2, 10, 16).sum(dim=-1)[0]
        tensor([ 0.,  0.,  0., 16.,  0.,  0.,  0.,  0.,  0.,  0.])
    """
    if capsules.dim() != 3:
        raise ArgumentError(f"capsules must be (B, J, D), got shape {tuple(capsules.shape)}")
    batch, parents, _ = capsules.shape
    if select.dim() == 1:
        if select.shape[0] != batch:
            raise ArgumentError(f"select has {select.shape[0]} indices for a batch of {batch}")
        select = torch.nn.functional.one_hot(select.long(), parents)
    if select.shape != (batch, parents):
        raise ArgumentError(f"select must be (B,) or (B, J) = {(batch, parents)}, got {tuple(select.shape)}")
    return (capsules * select.to(capsules.dtype).unsqueeze(-1)).flatten(1)
