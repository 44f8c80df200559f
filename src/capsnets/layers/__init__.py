"""Capsule layers: modules that own parameters and call :mod:`capsnets.functional`."""
from capsnets.layers.decoder import CapsuleDecoder
from capsnets.layers.linear import LinearCapsules
from capsnets.layers.matrix import ClassMatrixCapsules, ConvMatrixCapsules, PrimaryMatrixCapsules
from capsnets.layers.primary import PrimaryCapsules

__all__ = [
    "CapsuleDecoder", "ClassMatrixCapsules", "ConvMatrixCapsules", "LinearCapsules", "PrimaryCapsules",
    "PrimaryMatrixCapsules",
]
