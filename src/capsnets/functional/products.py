"""Batched products shaped for PyTorch's kernels (same sums as the plain ``@``).

The routing procedures' agreements and E-step products are a batched matrix times a column,
``(..., M, K) @ (..., K, 1)``; :func:`matvec` computes them as a row times the transposed matrix, a form
PyTorch's CPU kernels read at the speed of memory (``benchmarks/README.md`` has the measurements).
:func:`matrix_votes` forms matrix capsules' votes with one batched product over the children.
"""

from __future__ import annotations

import torch
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


def matrix_votes(poses: Tensor, weight: Tensor) -> Tensor:
    """Votes ``V[n, i, j] = M[n, i] @ W[i, j]`` of every child ``i`` for every parent ``j``.

    Shape:
        - poses: ``(N, I, P, P)``; weight: ``(I, J, P, P)``
        - output: ``(N, I, J, P * P)``, a view of a tensor stored as ``(N, J, I, P * P)``: the layout
          EM routing works in, so it needs no copy of its own.
    """
    n, children, side, _ = poses.shape
    parents = weight.shape[1]
    # One batched matmul over children: (I, N*P, P) @ (I, P, J*P) -> (I, N*P, J*P)
    lhs = poses.transpose(0, 1).reshape(children, n * side, side)
    rhs = weight.permute(0, 2, 1, 3).reshape(children, side, parents * side)
    votes = torch.bmm(lhs, rhs).view(children, n, side, parents, side)
    votes = votes.permute(1, 3, 0, 2, 4).reshape(n, parents, children, side * side)  # (N, J, I, P*P)
    return votes.transpose(1, 2)
