"""Capsule layers: modules that own parameters and call :mod:`capsnets.functional`.

Every layer that routes (:class:`LinearCapsules`, :class:`ConvCapsules2d`, :class:`ConvTransposeCapsules2d`,
:class:`ConvMatrixCapsules`, :class:`ClassMatrixCapsules`, :class:`HeinsenCapsules`, and
:class:`HomogeneousVectorCapsules`, whose children go whole to every parent) takes ``return_couplings=True`` in its
``forward`` and then returns ``(output, couplings)``: the routing's final couplings (EM routing's assignments), one
per child and parent, in the shape its docstring gives (as ``nn.MultiheadAttention`` returns its attention weights
with ``need_weights=True``).
"""

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
