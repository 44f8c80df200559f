"""Routings as values that survive a checkpoint: a JSON-able spec for every routing class.

A routing object is what a capsule layer calls; its spec is a plain dict that names its type and every
setting, e.g. ``{"type": "dynamic", "iterations": 2, "detach_routing": True}``, so a model's recorded
arguments (``model.model_args``, a checkpoint's sidecar, a run's ``config.yaml``) can rebuild it. Wherever a
routing is accepted (layers, models, :func:`create_model`), its spec is accepted too.

A routing the library cannot describe (any other callable, e.g. a naive baseline) is recorded as
``{"type": "opaque", "repr": ...}``: the record says which routing the model had, and rebuilding a model
from it raises instead of silently falling back to the default routing.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from capsnets.functional.em import EMRouting
from capsnets.functional.inverted_attention_routing import InvertedAttentionRouting
from capsnets.functional.routing import DynamicRouting
from capsnets.functional.self_attention_routing import SelfAttentionRouting
from capsnets.functional.self_routing import SelfRouting
from capsnets.functional.uniform_routing import UniformRouting

#: The routing classes by the ``type`` of their spec.
ROUTING_TYPES: dict[str, type] = {"dynamic": DynamicRouting, "em": EMRouting, "self_attention": SelfAttentionRouting,
                                  "inverted_attention": InvertedAttentionRouting, "self_routing": SelfRouting,
                                  "uniform": UniformRouting}
#: The spec types of the routings of vector capsules (``(B, I, J, D)`` votes), as :class:`LinearCapsules` calls them.
VECTOR_ROUTING_TYPES = ("dynamic", "self_attention", "inverted_attention", "self_routing", "uniform")
#: The ``type`` recorded for a routing the library cannot describe.
OPAQUE = "opaque"


def routing_config(routing, *, strict: bool = True) -> dict:
    """The JSON-able spec of ``routing`` (``routing.to_config()``).

    Args:
        routing: a routing object of one of :data:`ROUTING_TYPES`, or the module one builds for its layer
            (``routing.spec`` is then such an object).
        strict: raise for any other callable; else record it as ``{"type": "opaque", "repr": repr(routing)}``,
            which :func:`routing_from_config` refuses to rebuild.

    Raises:
        TypeError: ``routing`` is not a routing the library can describe (and ``strict``).

    Examples::

        >>> routing_config(DynamicRouting(2))
        {'type': 'dynamic', 'iterations': 2, 'detach_routing': True}
    """
    if type(routing) in ROUTING_TYPES.values():
        return routing.to_config()
    if type(getattr(routing, "spec", None)) in ROUTING_TYPES.values():  # a routing bound to its layer's sizes
        return routing.spec.to_config()
    if strict:
        raise TypeError(f"{routing!r} is not a routing capsnets can describe (one of "
                        f"{', '.join(cls.__name__ for cls in ROUTING_TYPES.values())}), so it has no spec")
    return {"type": OPAQUE, "repr": repr(routing)}


def routing_from_config(config: Mapping) -> Callable:
    """The routing object a spec describes (the inverse of :func:`routing_config`).

    Args:
        config: ``{"type": one of ROUTING_TYPES, **settings}``; settings left out take the class's defaults.

    Raises:
        ValueError: an unknown type or setting, or the record of a routing the library cannot describe.

    Examples::

        >>> routing_from_config({"type": "dynamic", "iterations": 2})
        DynamicRouting(iterations=2, detach_routing=True)
        >>> routing_from_config(EMRouting.official(2).to_config()) == EMRouting.official(2)
        True
    """
    if not isinstance(config, Mapping) or "type" not in config:
        raise ValueError(f"a routing spec is a mapping with a 'type' ({', '.join(ROUTING_TYPES)}); got {config!r}")
    kind, settings = config["type"], {k: v for k, v in config.items() if k != "type"}
    if kind == OPAQUE:
        raise ValueError(f"the model was recorded with the routing {config.get('repr', '?')}, which capsnets cannot "
                         f"describe, so it cannot be rebuilt from its record; build it with that routing passed in "
                         f"(routing=...) and load the weights into it (capsnets.engine.checkpoint.restore_model)")
    if kind not in ROUTING_TYPES:
        raise ValueError(f"unknown routing type {kind!r}; known types: {', '.join(ROUTING_TYPES)}")
    cls = ROUTING_TYPES[kind]
    names = [field.name for field in dataclasses.fields(cls) if field.name != "_"]
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise ValueError(f"routing type {kind!r} takes {', '.join(names) or 'no settings'}; got {', '.join(unknown)}")
    return cls(**settings)


def as_routing(routing, default: Callable, **settings) -> Callable:
    """The routing for an argument that takes a routing object, its spec or None.

    Args:
        routing: a routing callable (used as it is), a spec (:func:`routing_from_config`), or None.
        default: the routing class (or factory, e.g. :meth:`EMRouting.official`) that None stands for.
        **settings: settings for ``default``, e.g. ``iterations=2`` (those that are None are left out, so the
            routing's own defaults apply). With a given ``routing`` they must agree with its attributes.

    Raises:
        ValueError: a setting disagrees with the given ``routing`` (the record of a model must not name two
            routings) or is one that routing does not have, or ``routing`` is neither a callable, a spec nor None.

    Examples::

        >>> as_routing(None, DynamicRouting, iterations=None, detach_routing=False)
        DynamicRouting(iterations=3, detach_routing=False)
        >>> as_routing({"type": "dynamic", "iterations": 2}, DynamicRouting, iterations=2)
        DynamicRouting(iterations=2, detach_routing=True)
    """
    settings = {name: value for name, value in settings.items() if value is not None}
    if routing is None:
        return default(**settings)
    if isinstance(routing, Mapping):
        routing = routing_from_config(routing)
    elif not callable(routing):
        raise ValueError(f"routing must be a routing callable, its spec (a dict with a 'type') or None; "
                         f"got {routing!r}")
    if settings:
        wanted = default(**settings)  # the settings validated and resolved (e.g. an inverse temperature schedule)
        differ = [name for name in settings
                  if hasattr(routing, name) and getattr(routing, name) != getattr(wanted, name)]
        if differ:
            raise ValueError(f"routing={routing!r} disagrees with " + ", ".join(f"{name}={settings[name]!r}"
                             for name in differ) + "; pass the routing alone or leave those settings out")
        lacking = [name for name in settings if type(routing) in ROUTING_TYPES.values() and not hasattr(routing, name)]
        if lacking:  # e.g. routing iterations for a routing without iterations: they would be silently ignored
            raise ValueError(f"routing={routing!r} has no " + ", ".join(f"{name} (given {settings[name]!r})"
                             for name in lacking) + "; leave those settings out")
    return routing
