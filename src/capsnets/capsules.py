"""Typed containers for capsules that travel as more than one tensor.

Matrix capsules (Hinton, Sabour & Frosst 2018, "Matrix capsules with EM routing") carry a pose matrix
and an activation per capsule. :class:`MatrixCapsules` keeps the two together with their layout named,
instead of packing ``types * (P*P + 1)`` channels that every layer slices by hand (the pattern of
escnn's ``GeometricTensor``).

Dimension legend: ``B`` batch, ``T`` capsule types, ``H``/``W`` grid rows/columns, ``P`` pose side (4).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class MatrixCapsules:
    """A grid of matrix capsules.

    Attributes:
        pose: ``(B, T, H, W, P, P)`` pose matrices.
        activation: ``(B, T, H, W)`` presence probabilities in ``[0, 1]``.

    A layer of class capsules (no grid) uses ``H = W = 1``.
    """

    pose: Tensor
    activation: Tensor

    def __post_init__(self) -> None:
        pose, act = self.pose, self.activation
        if pose.dim() != 6 or pose.shape[-1] != pose.shape[-2]:
            raise ValueError(f"pose must be (B, T, H, W, P, P), got shape {tuple(pose.shape)}")
        if act.shape != pose.shape[:4]:
            raise ValueError(
                f"activation must be (B, T, H, W) = {tuple(pose.shape[:4])} to match the pose, got {tuple(act.shape)}"
            )

    @property
    def batch(self) -> int:
        return self.pose.shape[0]

    @property
    def types(self) -> int:
        return self.pose.shape[1]

    @property
    def grid(self) -> tuple[int, int]:
        return self.pose.shape[2], self.pose.shape[3]

    @property
    def pose_size(self) -> int:
        return self.pose.shape[-1]

    def to(self, *args, **kwargs) -> MatrixCapsules:
        return MatrixCapsules(self.pose.to(*args, **kwargs), self.activation.to(*args, **kwargs))

    def flat(self) -> tuple[Tensor, Tensor]:
        """Every capsule as a row: poses ``(B, T*H*W, P*P)`` and activations ``(B, T*H*W)``."""
        batch = self.batch
        return self.pose.reshape(batch, -1, self.pose_size**2), self.activation.reshape(batch, -1)

    def __repr__(self) -> str:
        b, t, h, w = self.activation.shape
        return f"MatrixCapsules(batch={b}, types={t}, grid={h}x{w}, pose={self.pose_size}x{self.pose_size})"
