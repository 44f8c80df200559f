"""Argument checks for capsule layers and models: errors that name the argument, its value and what it takes.

Public so that every package that builds or runs modules (``layers``, ``models``, ``losses``, ``engine``)
validates sizes, devices and image batches the same way. Every error is an :class:`ArgumentError`, which is
both a ``ValueError`` (what the command line reports as a one-line message) and a ``TypeError`` (what Python
raises for an argument of the wrong type).

Examples::

    >>> positive_int("num_classes", 10)
    10
    >>> positive_int("num_classes", 0)
    Traceback (most recent call last):
    capsnets.validation.ArgumentError: num_classes must be a positive integer, got 0
    >>> image_batch(torch.zeros(2, 1, 8, 8, dtype=torch.uint8) + 255, (1, 8, 8), dtype=torch.float32).max()
    tensor(1.)
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["ArgumentError", "available_devices", "check_device", "conv_output_size", "image_batch",
           "non_negative_int", "positive_int", "to_float_images"]


class ArgumentError(ValueError, TypeError):
    """A bad argument: its message names the argument, the value given and what is expected."""


def positive_int(name: str, value) -> int:
    """``value`` if it is an ``int`` >= 1 (not a bool); else an :class:`ArgumentError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(name: str, value) -> int:
    """``value`` if it is an ``int`` >= 0 (not a bool); else an :class:`ArgumentError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Spatial size after a convolution (floor mode): ``(size + 2 padding - kernel) // stride + 1``."""
    return (size + 2 * padding - kernel) // stride + 1


def _device_count(kind: str) -> int:
    """How many ``kind`` devices this build of PyTorch can use (0: none, or a type it cannot run on)."""
    if kind in ("cpu", "meta"):
        return 1
    if kind == "mps":
        return int(torch.backends.mps.is_available())
    module = getattr(torch, kind, None)
    if module is None or not callable(getattr(module, "is_available", None)) or not module.is_available():
        return 0
    return int(module.device_count()) if callable(getattr(module, "device_count", None)) else 1


def available_devices() -> list[str]:
    """The devices this process can run on: ``cpu``, then ``cuda:0``, ``cuda:1``..., ``xpu:0``..., ``mps``."""
    names = ["cpu"]
    for kind in ("cuda", "xpu", "mps"):
        count = _device_count(kind)
        names += [kind] if kind == "mps" and count else [f"{kind}:{index}" for index in range(count)]
    return names


def check_device(device, name: str = "device") -> torch.device:
    """``device`` (a name such as ``"cuda:0"``, a ``torch.device`` or an index) as a ``torch.device`` this build
    of PyTorch can run on (``meta`` included); else an :class:`ArgumentError` naming ``name`` and listing the
    available devices."""
    available = ", ".join(available_devices())
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise ArgumentError(f"{name} must be a device name such as 'cpu' or 'cuda:0', or a torch.device; got "
                            f"{device!r} ({type(device).__name__}); available here: {available}")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ArgumentError(f"{name}={device!r} is not a device PyTorch can name ({str(err).splitlines()[0]}); "
                            f"available here: {available}") from None
    count = _device_count(resolved.type)
    if count == 0:
        why = (f"this build of PyTorch ({torch.__version__}) has no CUDA support" if resolved.type == "cuda"
               and torch.version.cuda is None else f"no {resolved.type} device is available to this process")
        raise ArgumentError(f"{name}={device!r}: {why}; available here: {available}")
    if resolved.type not in ("cpu", "meta") and resolved.index is not None and resolved.index >= count:
        raise ArgumentError(f"{name}={device!r}: there {'is' if count == 1 else 'are'} only {count} "
                            f"{resolved.type} device{'' if count == 1 else 's'}; available here: {available}")
    return resolved


def to_float_images(images: Tensor, dtype: torch.dtype = torch.float32, name: str = "images") -> Tensor:
    """``images`` as ``dtype``: uint8 scaled from ``0..255`` to ``[0, 1]`` (as torchvision's ``ToDtype(scale=True)``),
    floating point cast as it is; other dtypes refused."""
    if images.dtype == torch.uint8:
        return images.to(dtype) / 255.0
    if not images.is_floating_point():
        raise ArgumentError(f"{name} must be floating point (values in [0, 1]) or uint8 (0..255, scaled to [0, 1]); "
                            f"got dtype {images.dtype}; convert them with {name}.float()")
    return images if images.dtype == dtype else images.to(dtype)


def image_batch(images, size: Sequence[int | None], *, dtype: torch.dtype, owner: str = "the model",
                name: str = "images", multiple: int = 1) -> Tensor:
    """A model's input batch, checked and converted: the one input check of every model's ``forward``.

    Args:
        images: the batch ``(B, C, H, W)``, ``B >= 1``; floating point (cast to ``dtype``) or uint8 (scaled to
            ``[0, 1]`` in ``dtype``).
        size: the expected ``(C, H, W)``; ``H`` / ``W`` None: any size divisible by ``multiple``.
        dtype: the model's parameter dtype.
        owner, name: who checks and what the argument is called, for the messages.

    Raises:
        ArgumentError: not a tensor, another shape, an empty batch, or a dtype other than floating point and uint8.
    """
    channels, height, width = size
    if height is None or width is None:
        expected = f"(B, {channels}, H, W) with H and W divisible by {multiple}"
    else:
        expected = f"(B, {channels}, {height}, {width})"
    if not isinstance(images, Tensor):
        raise ArgumentError(f"{owner} expects {name} as a torch.Tensor of shape {expected}, got "
                            f"{type(images).__name__}")
    shape = tuple(images.shape)
    wanted = [(channels, 1)] + [(s, multiple) if s is None else (s, 1) for s in (height, width)]
    if len(shape) != 4 or any(got != want if want is not None else got % step
                              for got, (want, step) in zip(shape[1:], wanted)):
        hint = "" if height is None else "; set input_size when creating the model"
        raise ArgumentError(f"{owner} expects {name} of shape {expected}, got {shape}{hint}")
    if shape[0] == 0:
        raise ArgumentError(f"{owner} got an empty batch: {name} of shape {shape}; pass at least one image")
    return to_float_images(images, dtype, name)
