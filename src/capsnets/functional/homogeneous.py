"""Homogeneous vector capsules: class capsules without routing, each child's vote an element-wise product.

Byerly, Kalganova & Dear (2021), "No Routing Needed Between Capsules", Neurocomputing 463 (arXiv:2001.09136),
Sec. 3, and the authors' code (AdamByerly/BMCNNwHFCs, ``python/models/nn_ops.py``, ``hvc_from_xyz``). A child
capsule ``u_i`` and a parent capsule have the same dimension ``D`` ("homogeneous"); the parent is the sum over
the children of the element-wise (Hadamard) product of each child with a weight vector of its own,
``s_j = sum_i W_ji * u_i``: a vote costs ``D`` weights instead of a ``D x D`` matrix, and there is no routing.
The authors' head then applies batch normalisation and a ReLU to ``s_j`` and reads a class's logit as the
length of its capsule (:class:`~capsnets.layers.HomogeneousVectorCapsules`).

Dimension legend: ``B`` batch, ``I`` child capsules, ``J`` parent capsules, ``D`` capsule dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from capsnets.validation import ArgumentError


def homogeneous_vector_capsules(u: Tensor, weight: Tensor) -> Tensor:
    """``s_j = sum_i weight[j, i] * u_i``, element-wise products summed over the children.

    Args:
        u: the child capsules.
        weight: one weight vector per (parent, child) pair.

    Shape:
        - u: ``(B, I, D)``; weight: ``(J, I, D)``.
        - output: ``(B, J, D)``.

    Examples::

        >>> homogeneous_vector_capsules(torch.randn(2, 100, 16), torch.randn(10, 100, 16)).shape
        torch.Size([2, 10, 16])
    """
    if not isinstance(u, Tensor) or u.dim() != 3:
        shape = tuple(u.shape) if isinstance(u, Tensor) else type(u).__name__
        raise ArgumentError(
            f"homogeneous_vector_capsules expects u of shape (B, I, D) (batch, children, dim); got {shape}"
        )
    if not isinstance(weight, Tensor) or weight.dim() != 3 or tuple(weight.shape[1:]) != tuple(u.shape[1:]):
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ArgumentError(
            f"homogeneous_vector_capsules expects weight of shape (J, {u.shape[1]}, {u.shape[2]}) (parents, and I and D "
            f"of u {tuple(u.shape)}); got {shape}"
        )
    return torch.einsum("bid,jid->bjd", u, weight)
