"""Argument checks shared by the layers: a ValueError that names the argument and its value."""
from __future__ import annotations


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Spatial size after a convolution (floor mode)."""
    return (size + 2 * padding - kernel) // stride + 1
