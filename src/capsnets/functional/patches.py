"""Receptive fields of convolutional capsule layers, gathered with tensor ops (no loops).

For a convolutional matrix capsule layer (Hinton, Sabour & Frosst 2018, Sec. 4), the children of the
parents at one output position are the ``K * K * T`` capsules of its ``K x K`` receptive field. This
module gathers them for every output position at once with ``torch.nn.functional.unfold``; zero
padding adds children with activation 0, which take no part in routing.

Dimension legend: ``B`` batch, ``T`` child types, ``K`` kernel size, ``L = H' * W'`` output positions,
``F`` features per capsule (``P * P`` pose components).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def capsule_patches(
    features: Tensor, kernel_size: int, stride: int = 1, padding: int = 0
) -> tuple[Tensor, tuple[int, int]]:
    """Gather each output position's receptive field of capsules.

    Args:
        features: per-capsule features on a grid.
        kernel_size, stride, padding: the convolution geometry (zero padding).

    Shape:
        - features: ``(B, T, F, H, W)``
        - output: ``(B, H', W', T * K * K, F)``, children ordered by (type, kernel row, kernel column),
          and the grid size ``(H', W')``.

    Examples::

        >>> patches, grid = capsule_patches(torch.randn(2, 8, 17, 14, 14), kernel_size=3, stride=2)
        >>> patches.shape, grid
        (torch.Size([2, 6, 6, 72, 17]), (6, 6))
    """
    if features.dim() != 5:
        raise ValueError(f"features must be (B, T, F, H, W), got shape {tuple(features.shape)}")
    batch, types, feats, height, width = features.shape
    out_h = (height + 2 * padding - kernel_size) // stride + 1
    out_w = (width + 2 * padding - kernel_size) // stride + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(
            f"a {height}x{width} capsule grid is smaller than kernel_size={kernel_size} with padding={padding}"
        )
    cols = F.unfold(features.reshape(batch, types * feats, height, width), kernel_size, padding=padding, stride=stride)
    cols = cols.view(batch, types, feats, kernel_size * kernel_size, out_h, out_w)  # (B, T, F, KK, H', W')
    patches = cols.permute(0, 4, 5, 1, 3, 2).reshape(batch, out_h, out_w, types * kernel_size**2, feats)
    return patches, (out_h, out_w)
