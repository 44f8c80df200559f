"""Capsule layers: modules that own parameters and call :mod:`capsnets.functional`."""

from capsnets.layers.conv import ConvCapsules2d, ConvTransposeCapsules2d
from capsnets.layers.decoder import CapsuleDecoder
from capsnets.layers.heinsen import HeinsenCapsules
from capsnets.layers.homogeneous import HomogeneousVectorCapsules, OffsetBatchNorm
from capsnets.layers.linear import LinearCapsules
from capsnets.layers.matrix import ClassMatrixCapsules, ConvMatrixCapsules, MatrixCapsules, PrimaryMatrixCapsules
from capsnets.layers.primary import PrimaryCapsules

__all__ = [
    "CapsuleDecoder",
    "ClassMatrixCapsules",
    "ConvCapsules2d",
    "ConvTransposeCapsules2d",
    "ConvMatrixCapsules",
    "HeinsenCapsules",
    "HomogeneousVectorCapsules",
    "LinearCapsules",
    "OffsetBatchNorm",
    "PrimaryCapsules",
    "MatrixCapsules",
    "PrimaryMatrixCapsules",
]
