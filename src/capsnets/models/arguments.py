"""The declared arguments of builders: a schema read from the signature, checked before the builder runs.

A builder's keyword-only parameters, their defaults and their type annotations are its schema
(:func:`signature_schema`); :func:`~capsnets.models.create_model` and :func:`~capsnets.losses.create_loss`
check every override against it, so the Python API, the command line, a config file and a checkpoint's record
all get the same errors, and ``capsnets list-models MODEL`` lists the same arguments. A value is converted
where that is unambiguous: an int where a float is expected (``inverse_temperature=1``), a list where a tuple
is (YAML and JSON have no tuples). Constraints ride in ``typing.Annotated``; the types builders use:

- :data:`PositiveInt`, :data:`NonNegativeInt`, :data:`ImageSize` ``(C, H, W)``, :data:`Probability` ``[0, 1)``;
- :data:`Routing`: a routing object, its spec (a mapping with a ``type``) or None; :data:`VectorRouting` and
  :data:`MatrixRouting` take only the routings of vector capsules (``dynamic``, ``self_attention``,
  ``inverted_attention``, ``self_routing``, ``uniform``) or of matrix capsules (``em``);
- :data:`Device`: a device this build of PyTorch has; :data:`DType`: a floating-point ``torch.dtype`` (or its name).

Examples::

    >>> def builder(*, num_classes: PositiveInt = 10, detach_routing: bool | None = None): ...
    >>> schema = signature_schema(builder)
    >>> schema["detach_routing"].expects
    'true, false or None (YAML: null)'
    >>> check_arguments(schema, {"num_classes": 5}, owner="model 'm'")
    {'num_classes': 5}
    >>> check_arguments(schema, {"detach_routing": "abc"}, owner="model 'm'")
    Traceback (most recent call last):
    capsnets.validation.ArgumentError: model 'm': detach_routing must be true, false or None (YAML: null), ...
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import numbers
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import torch

from capsnets.functional import routing_from_config
from capsnets.functional.routing_spec import ROUTING_TYPES, VECTOR_ROUTING_TYPES
from capsnets.validation import ArgumentError, check_device

__all__ = ["Argument", "Custom", "DType", "Device", "Expects", "ImageSize", "MatrixRouting", "NonNegativeInt",
           "PositiveInt", "Probability", "Range", "Routing", "VectorRouting", "check_arguments", "describe",
           "signature_schema"]


class _Mismatch(Exception):
    """A value that does not fit a type (internal: turned into an :class:`ArgumentError` by :class:`Argument`)."""


@dataclass(frozen=True)
class Range:
    """``Annotated`` constraint: ``low <= value`` and ``value <= high`` (``< high`` when ``high_open``)."""

    low: float | None = None
    high: float | None = None
    high_open: bool = False

    def holds(self, value) -> bool:
        above = self.low is None or value >= self.low
        return above and (self.high is None or (value < self.high if self.high_open else value <= self.high))


@dataclass(frozen=True)
class Expects:
    """``Annotated`` description of the values a type takes (singular, and plural for lists of them)."""

    text: str
    plural: str | None = None


@dataclass(frozen=True)
class Custom:
    """``Annotated`` check of its own: ``check(value)`` returns the value to use or raises ``ValueError`` /
    ``TypeError`` with the reason; ``expects`` describes the values it takes."""

    check: Callable[[Any], Any]
    expects: str


def _check_routing(value, types: tuple[str, ...] | None = None):
    """A routing object as it is, or a spec with its settings checked against the routing class's fields;
    ``types``: the spec types (:data:`ROUTING_TYPES`) the model's layers can call, None for any."""
    if not isinstance(value, Mapping):
        if not callable(value):
            raise TypeError("")
        known = next((name for name, cls in ROUTING_TYPES.items() if type(value) is cls), None)
        if types is not None and known is not None and known not in types:
            raise ValueError(f"its type is {known!r}, and this model's capsule layers route with "
                             f"{' or '.join(map(repr, types))}")
        return value
    cls = ROUTING_TYPES.get(value.get("type")) if isinstance(value.get("type"), str) else None
    if types is not None and cls is not None and value["type"] not in types:
        raise ValueError(f"its type is {value['type']!r}, and this model's capsule layers route with "
                         f"{' or '.join(map(repr, types))}")
    try:
        hints = typing.get_type_hints(cls) if cls is not None else {}
    except (NameError, TypeError):  # annotations that cannot be resolved: the routing checks its settings alone
        hints = {}
    fields = {field.name for field in dataclasses.fields(cls)} - {"_"} if cls is not None else set()
    for key, setting in value.items():
        if key in fields and key in hints:
            try:
                _convert(hints[key], setting)
            except _Mismatch:
                raise ValueError(f"its {key} must be {describe(hints[key])}, got {setting!r}") from None
    routing_from_config(value)  # the spec's type, its unknown keys and its values' ranges
    return dict(value)


def _check_dtype(value):
    if isinstance(value, str):
        value = getattr(torch, value.removeprefix("torch."), value)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise TypeError("")
    return value


PositiveInt = Annotated[int, Range(low=1), Expects("a positive integer", "positive integers")]
NonNegativeInt = Annotated[int, Range(low=0), Expects("a non-negative integer", "non-negative integers")]
Probability = Annotated[float, Range(0.0, 1.0, high_open=True), Expects("a number in [0, 1)")]
ImageSize = Annotated[tuple[PositiveInt, PositiveInt, PositiveInt], Expects("(C, H, W): a list of 3 positive integers")]
Routing = Annotated[object, Custom(_check_routing, "a routing object, its spec (a mapping with a 'type': "
                                                   f"{' or '.join(ROUTING_TYPES)}, and its settings)")]
VectorRouting = Annotated[object, Custom(functools.partial(_check_routing, types=VECTOR_ROUTING_TYPES),
                                         "a routing object of vector capsules (DynamicRouting, SelfAttentionRouting, "
                                         "InvertedAttentionRouting, SelfRouting, UniformRouting) or its spec "
                                         f"(a mapping with type {' or '.join(map(repr, VECTOR_ROUTING_TYPES))} and "
                                         "its settings)")]
MatrixRouting = Annotated[object, Custom(functools.partial(_check_routing, types=("em",)),
                                         "a routing object of matrix capsules (EMRouting) or its spec "
                                         "(a mapping with type 'em' and its settings)")]
Device = Annotated[object, Custom(check_device, "a device this build of PyTorch has, by name ('cpu', 'cuda:0' ...) "
                                                "or as a torch.device")]
DType = Annotated[object, Custom(_check_dtype, "a floating-point torch.dtype or its name (float32, float64, "
                                               "bfloat16, float16)")]

_SCALARS = {bool: bool, int: numbers.Integral, float: numbers.Real, str: str}
_NAMES = {bool: ("true or false", "booleans"), int: ("an integer", "integers"), float: ("a number", "numbers"),
          str: ("a string", "strings")}


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def describe(tp, plural: bool = False) -> str:
    """The values ``tp`` takes, in words (``'a positive integer or None (YAML: null)'``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        for meta in args[1:]:
            if isinstance(meta, (Expects, Custom)):
                text = meta.text if isinstance(meta, Expects) else meta.expects
                return (getattr(meta, "plural", None) or f"values each {text}") if plural else text
        return describe(args[0], plural)
    if plural:
        return _NAMES[tp][1] if tp in _NAMES else f"values each {describe(tp)}"
    if _is_union(tp):
        parts = [describe(a) for a in args if a is not type(None)]
        if bool in args and len(parts) == 1:
            parts = ["true", "false"]
        parts += ["None (YAML: null)"] if type(None) in args else []
        return ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else parts[0]
    if tp is type(None):
        return "None (YAML: null)"
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {describe(args[0], plural=True)}"
        return f"a list of {len(args)} {describe(args[0], plural=True)}"
    if origin in (Sequence, list):
        return f"a list of {describe(args[0], plural=True)}" if args else "a list"
    if origin in (Mapping, dict) or tp in (Mapping, dict):
        return "a mapping with string keys"
    if tp in _NAMES:
        return _NAMES[tp][0]
    return getattr(tp, "__name__", str(tp)) if tp not in (Any, object) else "any value"


def _convert(tp, value):
    """``value`` as ``tp`` takes it (lists as tuples, ints as floats), or :class:`_Mismatch`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        custom = [meta for meta in args[1:] if isinstance(meta, Custom)]
        if custom:
            try:
                return custom[0].check(value)
            except (ValueError, TypeError) as err:
                raise _Mismatch(str(err).splitlines()[0] if str(err) else "") from None
        value = _convert(args[0], value)
        if not all(meta.holds(value) for meta in args[1:] if isinstance(meta, Range)):
            raise _Mismatch("")
        return value
    if _is_union(tp):
        if value is None and type(None) in args:
            return None
        reasons = []
        for alternative in args:
            try:
                return _convert(alternative, value)
            except _Mismatch as err:
                reasons.append(str(err))
        raise _Mismatch(next((reason for reason in reasons if reason), ""))
    if tp in (Any, object):
        return value
    if tp is type(None) or origin is Literal:
        if any(value == choice and type(value) is type(choice) for choice in (args or (None,))):
            return value
        raise _Mismatch("")
    if tp in _SCALARS:
        if isinstance(value, _SCALARS[tp]) and (tp is bool or not isinstance(value, bool)):
            return tp(value)
        raise _Mismatch("")
    if origin in (tuple, Sequence, list):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch("")
        items = args[:1] * len(value) if origin is not tuple or (len(args) == 2 and args[1] is Ellipsis) else args
        if len(items) != len(value):
            raise _Mismatch(f"{len(value)} items")
        return tuple(_convert(item, v) for item, v in zip(items, value))
    if origin in (Mapping, dict) or tp in (Mapping, dict):
        if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
            return dict(value)
        raise _Mismatch("")
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Mismatch("")
    return value  # an annotation this checker does not read (e.g. a Callable): the builder checks the value


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Argument:
    """One keyword-only argument of a builder: its ``name``, ``default`` and ``annotation`` (a type)."""

    name: str
    default: Any
    annotation: Any = Any

    @property
    def expects(self) -> str:
        """The values it takes, in words."""
        return describe(self.annotation)

    def check(self, value, owner: str = "", hint: str = ""):
        """``value`` as the builder takes it; else an :class:`ArgumentError` naming ``owner``, the argument, the
        value and what it takes."""
        try:
            return _convert(self.annotation, value)
        except _Mismatch as err:
            given = f"{type(value).__name__}; {err}" if str(err) else type(value).__name__
            default = ("" if self.default is inspect.Parameter.empty
                       else f"; leave it out to use its default, {self.default!r}")
            raise ArgumentError(f"{owner}: {self.name} must be {self.expects}, got {_shown(value)} ({given})"
                                f"{default}{hint}") from None


def signature_schema(builder: Callable) -> dict[str, Argument]:
    """The keyword-only arguments of ``builder`` (a function, a class or a ``functools.partial`` of one), with
    their defaults and their annotations resolved (``Any`` where there is none)."""
    target = builder.func if isinstance(builder, functools.partial) else builder
    try:
        hints = typing.get_type_hints(target.__init__ if isinstance(target, type) else target, include_extras=True)
    except (NameError, TypeError):
        hints = {}
    return {p.name: Argument(p.name, p.default, hints.get(p.name, Any))
            for p in inspect.signature(builder).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def check_arguments(schema: Mapping[str, Argument], values: Mapping[str, Any], *, owner: str,
                    hint: str = "") -> dict[str, Any]:
    """``values`` checked against ``schema`` and converted; an :class:`ArgumentError` for an unknown name (with the
    names it might have meant and every name taken) or a value of the wrong type. ``hint``: appended to
    the message of a bad value (e.g. where to read the schema)."""
    unknown = sorted(set(values) - set(schema))
    if unknown:
        close = sorted({match for key in unknown for match in difflib.get_close_matches(key, schema, n=2)})
        maybe = f" (did you mean {', '.join(close)}?)" if close else ""
        takes = f"it takes: {', '.join(sorted(schema))}" if schema else "it takes no arguments"
        raise ArgumentError(f"{owner} does not take {', '.join(unknown)}{maybe}; {takes}")
    return {key: schema[key].check(value, owner, hint) for key, value in values.items()}
