"""Batched products shaped for PyTorch's kernels (same sums as the plain ``@``).

The routing procedures' agreements and E-step products are a batched matrix times a column,
``(..., M, K) @ (..., K, 1)``; :func:`matvec` computes them as a row times the transposed matrix, a form
PyTorch's CPU kernels read at the speed of memory (``benchmarks/README.md`` has the measurements).
"""
from __future__ import annotations

from torch import Tensor


def matvec(matrix: Tensor, column: Tensor) -> Tensor:
    """``matrix @ column`` computed as ``(column^T @ matrix^T)^T``.

    Shape:
        matrix ``(..., M, K)``, column ``(..., K, 1)`` -> ``(..., M, 1)`` (a transposed view of a
        ``(..., 1, M)`` tensor).

    Examples::

        >>> matrix, column = torch.randn(8, 5, 3), torch.randn(8, 3, 1)
        >>> torch.allclose(matvec(matrix, column), matrix @ column)
        True
    """
    return (column.mT @ matrix.mT).mT
