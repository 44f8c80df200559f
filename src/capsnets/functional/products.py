"""Batched products shaped for PyTorch's kernels (same sums as the plain ``@``, faster).

A batched matrix times a column, ``(..., M, K) @ (..., K, 1)``, runs at about a third of the speed of memory
in PyTorch's CPU kernels (torch 2.13), while a row times a matrix reads the matrix at the speed of memory. The
routing procedures' agreements and E-step products are of the first kind; :func:`matvec` computes them as the
second (``benchmarks/README.md`` has the measurements).
"""
from __future__ import annotations

from torch import Tensor


def matvec(matrix: Tensor, column: Tensor) -> Tensor:
    """``matrix @ column`` computed as ``(column^T @ matrix^T)^T``.

    Shape:
        matrix ``(..., M, K)``, column ``(..., K, 1)`` -> ``(..., M, 1)`` (a transposed view of a
        ``(..., 1, M)`` tensor).
    """
    return (column.mT @ matrix.mT).mT
