"""Argument checks for capsule layers, models, losses and configs: errors that name the argument, its value
and what it takes.

Public, and the one place where the library checks arguments: ``functional``, ``layers``, ``models``,
``losses``, ``engine`` and the command line validate sizes, flags, choices, devices and image batches with
these helpers, in the constructors that take them (as ``torch.nn`` modules and e3nn do). Every error is an
:class:`ArgumentError`, which is both a ``ValueError`` (what the command line reports as a one-line message)
and a ``TypeError`` (what Python raises for an argument of the wrong type). Helpers that check a value return
it as the caller should keep it (a list as a tuple, an int as a float where a number is meant), so values
read from YAML or JSON work as the Python ones do.

Examples::

    >>> positive_int("num_classes", 10)
    10
    >>> positive_int("num_classes", 0)
    Traceback (most recent call last):
    capsnets.validation.ArgumentError: num_classes must be a positive integer, got 0
    >>> image_size("input_size", [1, 28, 28])
    (1, 28, 28)
    >>> image_batch(torch.zeros(2, 1, 8, 8, dtype=torch.uint8) + 255, (1, 8, 8), dtype=torch.float32).max()
    tensor(1.)
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import os
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "Argument",
    "ArgumentError",
    "DType",
    "Device",
    "ImageSize",
    "NonNegativeInt",
    "PositiveInt",
    "Probability",
    "Routing",
    "available_devices",
    "check_device",
    "choice",
    "conv_output_size",
    "describe",
    "expect",
    "flag",
    "floating_dtype",
    "image_batch",
    "image_size",
    "keyword_arguments",
    "limit_from_env",
    "non_negative_int",
    "number",
    "placement",
    "positive_int",
    "routing_iterations",
    "positive_ints",
    "reject_unknown",
    "shown",
    "to_float_images",
]

#: Annotations for the keyword arguments of builders and losses. They are the plain types (no checking rides
#: on them); their names say what the argument takes, in words, where ``capsnets list-models MODEL`` lists it
#: (:func:`describe`).
PositiveInt = int
NonNegativeInt = int
Probability = float
ImageSize = tuple[int, int, int]
Device = str | torch.device
DType = str | torch.dtype
Routing = str | Mapping | object

#: What an annotation takes, in words, by the text of the annotation.
_WORDS = {
    "bool": "true or false",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "PositiveInt": "a positive integer",
    "NonNegativeInt": "a non-negative integer",
    "Probability": "a number in [0, 1)",
    "ImageSize": "(C, H, W): a list of 3 positive integers",
    "Device": "a device this build of PyTorch has, by name ('cpu', 'cuda:0' ...) or as a torch.device",
    "DType": "a floating-point torch.dtype or its name (float32, float64, bfloat16, float16)",
    "Routing": "a routing object, its spec (a mapping with a 'type' and settings) or a routing type name; "
    "settings alone (routing.KEY=VALUE) update the model's default routing",
}


def describe(annotation) -> str:
    """What an argument annotated ``annotation`` takes, in words, read from the annotation's text (``X | None``
    adds ``None``, ``Literal["a", "b"]`` is one of its values); the text itself where it has no words here.

    Examples::

        >>> describe("PositiveInt | None")
        'a positive integer or None (YAML: null)'
    """
    if annotation is None or annotation == "" or annotation is object:
        return "any value"
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    parts = [part.strip() for part in text.split(" | ")]
    words = [
        _WORDS.get(part, "one of " + part[8:-1].replace('"', "'") if part.startswith("Literal[") else part)
        for part in parts
        if part != "None"
    ]
    if "None" in parts:
        words.append("None (YAML: null)")
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


@dataclass(frozen=True)
class Argument:
    """A keyword-only argument of a builder or constructor: its ``name``, ``default`` and ``annotation`` (the
    annotation's text); ``expects`` says in words what it takes (:func:`describe`)."""

    name: str
    default: Any
    annotation: str = ""

    @property
    def expects(self) -> str:
        return describe(self.annotation)


def keyword_arguments(function: Callable) -> dict[str, Argument]:
    """The keyword-only arguments of ``function`` (a function, a class or a ``functools.partial`` of one), from its
    signature: what :func:`~capsnets.models.model_schema` and :func:`~capsnets.losses.loss_schema` list."""
    target = function.func if isinstance(function, functools.partial) else function
    parameters = inspect.signature(function).parameters.values()
    hints = getattr(target.__init__ if isinstance(target, type) else target, "__annotations__", {})

    def text(annotation) -> str:
        return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))

    return {
        p.name: Argument(p.name, p.default, text(hints.get(p.name, "")))
        for p in parameters
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


class ArgumentError(ValueError, TypeError):
    """A bad argument: its message names the argument, the value given and what is expected.

    Args:
        message: the message.
        argument: the name of the argument at fault, where one is (callers add to the message by it, e.g.
            :func:`~capsnets.models.create_model` names the default of a model argument).
    """

    def __init__(self, message: str, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument


def shown(value, limit: int = 80) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters (ending in ``...``), in time and memory
    bounded by ``limit`` whatever the value holds.

    A ``reprlib.Repr`` writes it: containers show their first few items and four levels of nesting (a YAML
    "billion laughs" costs no more than a short value), strings and bytes are cut before their ``repr`` is taken,
    and an integer of more than ``limit`` digits is shown by its number of bits.

    Examples::

        >>> shown([1, "a", (2,), {3: None}])
        "[1, 'a', (2,), {3: None}]"
        >>> shown(list(range(100)), 20)
        '[0, 1, 2, 3, 4, 5...'
    """
    text = _Repr(limit).repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Repr(reprlib.Repr):
    """``reprlib.Repr`` with strings, bytes, integers and other values cut at ``limit`` characters."""

    repr_bytes = repr_bytearray = reprlib.Repr.repr_str

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxlong, self.maxother = 4, limit, limit, limit

    def repr_int(self, x: int, level: int) -> str:
        # Python refuses to write an integer of more than 4300 digits (sys.set_int_max_str_digits).
        return f"<an integer of {x.bit_length()} bits>" if x.bit_length() > 3 * self.maxlong else repr(x)


def expect(ok: bool, name: str, value, expected: str) -> None:
    """Raise an :class:`ArgumentError` ``"{name}={value!r} is invalid: expected {expected}"`` unless ``ok``."""
    if not ok:
        raise ArgumentError(f"{name}={shown(value)} is invalid: expected {expected}", name)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(name: str, value) -> int:
    """``value`` if it is an ``int`` >= 1 (not a bool); else an :class:`ArgumentError` naming ``name``."""
    if not _is_int(value) or value < 1:
        raise ArgumentError(f"{name} must be a positive integer, got {shown(value)}", name)
    return value


#: The most routing iterations a routing takes: the papers use 1 to 3, and a count read from a file or a command
#: line must not make one forward pass run for hours.
MAX_ROUTING_ITERATIONS = 100


def limit_from_env(variable: str, default: int, unit: str) -> int:
    """A limit that the environment variable ``variable`` may replace: its value as a positive whole number
    (``_`` separators allowed), or ``default`` when it is unset or empty.

    Raises:
        ArgumentError: the variable holds something else; the message names it and the default.

    Examples::

        >>> limit_from_env("CAPSNETS_UNSET_LIMIT", 1024, "bytes")
        1024
    """
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    digits = text.replace("_", "")
    value = int(digits) if len(digits) <= 30 and digits.isascii() and digits.isdigit() else 0
    if value < 1:
        raise ArgumentError(
            f"{variable}={shown(text, 40)} is invalid: expected a positive whole number of {unit}, "
            f"e.g. {default} (the default); Fix: set it to such a number or unset it",
            variable,
        )
    return value


def routing_iterations(name: str, value) -> int:
    """``value`` as an ``int`` from 1 to ``MAX_ROUTING_ITERATIONS`` (100) (an integral float is taken); else an
    :class:`ArgumentError` naming ``name``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or int(value) != value or not 1 <= value <= MAX_ROUTING_ITERATIONS:
        raise ArgumentError(
            f"{name} must be an integer from 1 to {MAX_ROUTING_ITERATIONS} (the papers route 1 to 3 times), "
            f"got {shown(value)}",
            name,
        )
    return int(value)


def non_negative_int(name: str, value) -> int:
    """``value`` if it is an ``int`` >= 0 (not a bool); else an :class:`ArgumentError` naming ``name``."""
    if not _is_int(value) or value < 0:
        raise ArgumentError(f"{name} must be a non-negative integer, got {shown(value)}", name)
    return value


def positive_ints(name: str, value, length: int | None = None, what: str = "") -> tuple[int, ...]:
    """``value`` (a list or tuple of positive ``int`` s, ``length`` of them where given) as a tuple; else an
    :class:`ArgumentError` naming ``name`` (``what``: the meaning of the items, e.g. ``"(C, H, W)"``)."""
    count = f"{length} " if length is not None else ""
    if (
        not isinstance(value, (list, tuple))
        or (length is not None and len(value) != length)
        or not all(_is_int(item) and item >= 1 for item in value)
    ):
        meaning = f"{what}: " if what else ""
        raise ArgumentError(f"{name} must be {meaning}a list of {count}positive integers, got {shown(value)}", name)
    return tuple(value)


def image_size(name: str, value) -> tuple[int, int, int]:
    """``value`` as an image size ``(C, H, W)`` of three positive ints (a list or tuple)."""
    return positive_ints(name, value, 3, "(C, H, W)")


def flag(name: str, value) -> bool:
    """``value`` if it is a bool; else an :class:`ArgumentError` naming ``name``."""
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be true or false, got {shown(value)}", name)
    return value


def number(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` (an int or float, not a bool) as a float within ``[low, high]`` (an end open where asked);
    else an :class:`ArgumentError` naming ``name``, the value and the range."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if ok:
        ok = (low is None or (value > low if low_open else value >= low)) and (
            high is None or (value < high if high_open else value <= high)
        )
    if not ok:
        where = ""
        if low is not None or high is not None:
            left = "(" if low_open or low is None else "["
            right = ")" if high_open or high is None else "]"
            lo, hi = ("-inf" if low is None else f"{low:g}"), ("inf" if high is None else f"{high:g}")
            where = f" in {left}{lo}, {hi}{right}"
        raise ArgumentError(f"{name} must be a number{where}, got {shown(value)}", name)
    return float(value)


def choice(name: str, value, choices: Iterable):
    """``value`` if it is one of ``choices``; else an :class:`ArgumentError` naming ``name`` and the choices."""
    choices = tuple(choices)
    if not any(value == option and type(value) is type(option) for option in choices):
        raise ArgumentError(f"{name} must be one of {', '.join(map(repr, choices))}, got {shown(value)}", name)
    return value


def floating_dtype(name: str, value) -> torch.dtype:
    """``value`` (a floating-point ``torch.dtype`` or its name, ``"float64"`` or ``"torch.float64"``) as a
    ``torch.dtype``; else an :class:`ArgumentError` naming ``name``."""
    dtype = getattr(torch, value.removeprefix("torch."), None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ArgumentError(
            f"{name} must be a floating-point torch.dtype or its name (float32, float64, bfloat16, "
            f"float16), got {shown(value)}",
            name,
        )
    return dtype


def placement(device, dtype) -> tuple[torch.device | None, torch.dtype | None]:
    """A module's ``device`` and ``dtype`` arguments checked (:func:`check_device`, :func:`floating_dtype`);
    None stays None (torch's defaults)."""
    return (None if device is None else check_device(device), None if dtype is None else floating_dtype("dtype", dtype))


def reject_unknown(owner: str, given: Iterable[str], taken: Iterable[str], *, prefix: str = "") -> None:
    """An :class:`ArgumentError` for the names in ``given`` that are not in ``taken``, with the names they may
    have meant and every name taken (``"model 'capsnet' does not take widht (did you mean width?); it takes:
    ..."``), each shown after ``prefix`` (``"routing."``: the keys of a setting of that name)."""
    taken = sorted(taken)
    unknown = sorted(set(given) - set(taken))
    if unknown:
        close = sorted({match for key in unknown for match in difflib.get_close_matches(key, taken, n=2)})
        maybe = f" (did you mean {', '.join(prefix + k for k in close)}?)" if close else ""
        takes = f"it takes: {', '.join(prefix + k for k in taken)}" if taken else "it takes no arguments"
        raise ArgumentError(
            f"{owner} does not take {', '.join(prefix + k for k in unknown)}{maybe}; {takes}", unknown[0]
        )


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
        raise ArgumentError(
            f"{name} must be a device name such as 'cpu' or 'cuda:0', or a torch.device; got "
            f"{shown(device)} ({type(device).__name__}); available here: {available}",
            name,
        )
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ArgumentError(
            f"{name}={shown(device)} is not a device PyTorch can name ({str(err).splitlines()[0]}); "
            f"available here: {available}",
            name,
        ) from None
    count = _device_count(resolved.type)
    if count == 0:
        why = (
            f"this build of PyTorch ({torch.__version__}) has no CUDA support"
            if resolved.type == "cuda" and torch.version.cuda is None
            else f"no {resolved.type} device is available to this process"
        )
        raise ArgumentError(f"{name}={shown(device)}: {why}; available here: {available}", name)
    if resolved.type not in ("cpu", "meta") and resolved.index is not None and resolved.index >= count:
        raise ArgumentError(
            f"{name}={shown(device)}: there {'is' if count == 1 else 'are'} only {count} "
            f"{resolved.type} device{'' if count == 1 else 's'}; available here: {available}",
            name,
        )
    return resolved


def to_float_images(images: Tensor, dtype: torch.dtype = torch.float32, name: str = "images") -> Tensor:
    """``images`` as ``dtype``: uint8 scaled from ``0..255`` to ``[0, 1]`` (as torchvision's ``ToDtype(scale=True)``),
    floating point cast as it is; other dtypes refused."""
    if images.dtype == torch.uint8:
        return images.to(dtype) / 255.0
    if not images.is_floating_point():
        raise ArgumentError(
            f"{name} must be floating point (values in [0, 1]) or uint8 (0..255, scaled to [0, 1]); "
            f"got dtype {images.dtype}; convert them with {name}.float()"
        )
    return images if images.dtype == dtype else images.to(dtype)


def image_batch(
    images,
    size: Sequence[int | None],
    *,
    dtype: torch.dtype,
    owner: str = "the model",
    name: str = "images",
    multiple: int = 1,
) -> Tensor:
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
        raise ArgumentError(
            f"{owner} expects {name} as a torch.Tensor of shape {expected}, got {type(images).__name__}"
        )
    shape = tuple(images.shape)
    wanted = [(channels, 1)] + [(s, multiple) if s is None else (s, 1) for s in (height, width)]
    if len(shape) != 4 or any(
        got != want if want is not None else got % step for got, (want, step) in zip(shape[1:], wanted)
    ):
        hint = "" if height is None else "; set input_size when creating the model"
        raise ArgumentError(f"{owner} expects {name} of shape {expected}, got {shape}{hint}")
    if shape[0] == 0:
        raise ArgumentError(f"{owner} got an empty batch: {name} of shape {shape}; pass at least one image")
    return to_float_images(images, dtype, name)
