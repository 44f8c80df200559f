"""Receptive fields of convolutional capsule layers, gathered with tensor ops (no loops).

For a convolutional matrix capsule layer (Hinton, Sabour & Frosst 2018, Sec. 4), the children of the
parents at one output position are the ``K * K * T`` capsules of its ``K x K`` receptive field. This
module gathers them for every output position at once with one ``index_select`` through a precomputed index
of the grid (:func:`patch_index`), which reads each capsule's values where they are and whose backward is one
``index_add``; zero padding adds children with activation 0, which take no part in routing.

Dimension legend: ``B`` batch, ``T`` child types, ``K`` kernel size, ``L = H' * W'`` output positions,
``F`` features per capsule (``P * P`` pose components).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from capsnets.validation import ArgumentError


def patch_grid(height: int, width: int, kernel_size: int, stride: int = 1, padding: int = 0) -> tuple[int, int]:
    """The output grid ``(H', W')`` of a ``kernel_size`` convolution over an ``height x width`` grid; raises
    a ValueError if the padded grid is smaller than the kernel."""
    out_h = (height + 2 * padding - kernel_size) // stride + 1
    out_w = (width + 2 * padding - kernel_size) // stride + 1
    if out_h < 1 or out_w < 1:
        raise ArgumentError(
            f"a {height}x{width} capsule grid is smaller than kernel_size={kernel_size} with padding={padding}"
        )
    return out_h, out_w


def patch_index(
    types: int, height: int, width: int, kernel_size: int, stride: int = 1, padding: int = 0, device=None
) -> Tensor:
    """For every output position and child slot, the capsule of the ``(T, H, W)`` grid it reads.

    Slots are ordered as in :func:`capsule_patches`: output positions row-major, then children by (type,
    kernel row, kernel column). A slot in the zero padding gets ``T * H * W``, one past the grid (the
    index of an appended zero capsule, :func:`gather_patches`). The result is cached per geometry and
    device (except while a graph is traced): do not modify it.

    Shape:
        - output: ``(H' * W', T * K * K)``, int64.

    Examples::

        >>> patch_index(1, 3, 3, kernel_size=2)
        tensor([[0, 1, 3, 4],
                [1, 2, 4, 5],
                [3, 4, 6, 7],
                [4, 5, 7, 8]])
    """
    key = (types, height, width, kernel_size, stride, padding, torch.device(device or "cpu"))
    if torch.compiler.is_compiling():  # a tensor made while a graph is traced belongs to the trace: not cached
        return _patch_index.__wrapped__(*key)
    return _patch_index(*key)


@lru_cache(maxsize=64)
def _patch_index(types, height, width, kernel_size, stride, padding, device) -> Tensor:
    out_h, out_w = patch_grid(height, width, kernel_size, stride, padding)
    rows = torch.arange(out_h).view(-1, 1) * stride + torch.arange(kernel_size).view(1, -1) - padding  # (H', K)
    cols = torch.arange(out_w).view(-1, 1) * stride + torch.arange(kernel_size).view(1, -1) - padding  # (W', K)
    r = rows.view(out_h, 1, 1, kernel_size, 1)
    c = cols.view(1, out_w, 1, 1, kernel_size)
    t = torch.arange(types).view(1, 1, types, 1, 1)
    index = (t * height + r) * width + c  # (H', W', T, K, K)
    inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
    index = torch.where(inside, index, types * height * width)
    return index.reshape(out_h * out_w, types * kernel_size * kernel_size).to(device)


def gather_patches(values: Tensor, index: Tensor, padding: int = 0) -> Tensor:
    """Each output position's receptive field of ``values`` on a flattened capsule grid.

    Args:
        values: per-capsule values, the grid ``(T, H, W)`` flattened (a contiguous ``(B, T, H, W, ...)``
            tensor reshaped).
        index: :func:`patch_index` of the grid; its slots equal to ``T * H * W`` read zeros.
        padding: the padding ``index`` was made with (with padding, a zero capsule is appended to the grid).

    Shape:
        - values: ``(B, T * H * W)`` or ``(B, T * H * W, F)``
        - output: ``(B * H' * W', T * K * K)`` or ``(B * H' * W', T * K * K, F)``

    Examples::

        >>> pose = torch.randn(2, 8, 14, 14, 4, 4)
        >>> gather_patches(pose.reshape(2, 8 * 14 * 14, 16), patch_index(8, 14, 14, 3, stride=2)).shape
        torch.Size([72, 72, 16])
    """
    batch = values.shape[0]
    if padding:  # the padding slots read one zero capsule appended to the grid
        values = torch.cat([values, values.new_zeros(batch, 1, *values.shape[2:])], dim=1)
    out = values.index_select(1, index.reshape(-1))
    return out.view(batch * index.shape[0], index.shape[1], *values.shape[2:])


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
        raise ArgumentError(f"features must be (B, T, F, H, W), got shape {tuple(features.shape)}")
    batch, types, feats, height, width = features.shape
    out_h, out_w = patch_grid(height, width, kernel_size, stride, padding)
    index = patch_index(types, height, width, kernel_size, stride, padding, features.device)
    grid = features.permute(0, 1, 3, 4, 2).reshape(batch, types * height * width, feats)
    patches = gather_patches(grid, index, padding).view(batch, out_h, out_w, types * kernel_size**2, feats)
    return patches, (out_h, out_w)
