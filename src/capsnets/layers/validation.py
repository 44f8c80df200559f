"""Argument checks for capsule layers and models: a ``ValueError`` that names the argument and its value.

Public so that every package that builds modules (``layers``, ``models``) validates its sizes the same way.

Examples::

    >>> positive_int("num_classes", 10)
    10
    >>> positive_int("num_classes", 0)
    Traceback (most recent call last):
    ValueError: num_classes must be a positive integer, got 0
"""
from __future__ import annotations

__all__ = ["conv_output_size", "non_negative_int", "positive_int"]


def positive_int(name: str, value) -> int:
    """``value`` if it is an ``int`` >= 1 (not a bool); else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(name: str, value) -> int:
    """``value`` if it is an ``int`` >= 0 (not a bool); else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Spatial size after a convolution (floor mode): ``(size + 2 padding - kernel) // stride + 1``."""
    return (size + 2 * padding - kernel) // stride + 1
