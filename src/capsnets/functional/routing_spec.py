"""Routings as values that survive a checkpoint: a JSON-able spec for every routing class.

A routing object is what a capsule layer calls; its spec is a plain dict that names its type and every
setting, e.g. ``{"type": "dynamic", "iterations": 2, "detach_routing": True}``, so a model's recorded
arguments (``model.model_args``, a checkpoint's sidecar, a run's ``config.yaml``) can rebuild it. Wherever a
routing is accepted (layers, models, :func:`create_model`), its spec is accepted too.

A routing the library cannot describe (any other callable, e.g. a naive baseline) is recorded as
``{"type": "opaque", "repr": ...}``: the record says which routing the model had, and rebuilding a model
from it raises instead of silently falling back to the default routing.

A matrix capsule network routes by EM in its convolutional and its class capsule layers, and the two may differ
(the released code of Hinton, Sabour & Frosst 2018 divides the class layer's inverse temperature by 4): its
routing is a :class:`LayerwiseEMRouting`, whose spec is an EM spec with a ``"class_layer"`` key holding the class
layer's settings, e.g. ``{"type": "em", "iterations": 2, "formulation": "official", "class_layer":
{"iterations": 1}}`` (:func:`layerwise_em_routing`).

Convolutional capsules route *locally* (LaLonde & Bagci 2018, "Capsules for Object Segmentation", Sec. 3.1):
:func:`local_routing` runs any routing independently at every output position, between the child and parent
capsule types there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor

from capsnets.functional.dynamic_routing import DynamicRouting
from capsnets.functional.em import EMRouting
from capsnets.functional.em.spec import CLASS_LAYER, LAYERS, layer_spec
from capsnets.functional.heinsen_routing import HeinsenRouting
from capsnets.functional.inverted_attention_routing import InvertedAttentionRouting
from capsnets.functional.self_attention_routing import SelfAttentionRouting
from capsnets.functional.self_routing import SelfRouting
from capsnets.functional.uniform_routing import UniformRouting
from capsnets.validation import ArgumentError, reject_unknown, routing_iterations, shown

#: The routing classes by the ``type`` of their spec.
ROUTING_TYPES: dict[str, type] = {
    "dynamic": DynamicRouting,
    "em": EMRouting,
    "self_attention": SelfAttentionRouting,
    "inverted_attention": InvertedAttentionRouting,
    "self_routing": SelfRouting,
    "uniform": UniformRouting,
    "heinsen": HeinsenRouting,
}
#: The spec types of the routings of vector capsules (``(B, I, J, D)`` votes), as
#: :class:`~capsnets.layers.LinearCapsules` calls them.
VECTOR_ROUTING_TYPES = ("dynamic", "self_attention", "inverted_attention", "self_routing", "uniform")
#: The ``type`` recorded for a routing the library cannot describe.
OPAQUE = "opaque"


def routing_config(routing, *, strict: bool = True) -> dict:
    """The JSON-able spec of ``routing`` (``routing.to_config()``).

    Args:
        routing: a routing object of one of :data:`ROUTING_TYPES`, the module one builds for its layer
            (``routing.spec`` is then such an object), or a :class:`LayerwiseEMRouting` of two EM routings.
        strict: raise for any other callable; else record it as ``{"type": "opaque", "repr": repr(routing)}``,
            which :func:`routing_from_config` refuses to rebuild.

    Raises:
        TypeError: ``routing`` is not a routing the library can describe (and ``strict``).

    Examples::

        >>> routing_config(DynamicRouting(2))
        {'type': 'dynamic', 'iterations': 2, 'detach_routing': True, 'none_of_the_above': False}
    """
    if type(routing) in ROUTING_TYPES.values() or (isinstance(routing, LayerwiseEMRouting) and routing.describable):
        return routing.to_config()
    if type(getattr(routing, "spec", None)) in ROUTING_TYPES.values():  # a routing bound to its layer's sizes
        return routing.spec.to_config()
    if strict:
        raise ArgumentError(
            f"{shown(routing)} is not a routing capsnets can describe (one of "
            f"{', '.join(cls.__name__ for cls in ROUTING_TYPES.values())}), so it has no spec"
        )
    return {"type": OPAQUE, "repr": repr(routing)}


def routing_from_config(config: Mapping) -> Callable:
    """The routing object a spec describes (the inverse of :func:`routing_config`).

    Args:
        config: ``{"type": one of ROUTING_TYPES, **settings}``; settings left out take the class's defaults. An EM
            spec with a ``"class_layer"`` gives a :class:`LayerwiseEMRouting` (:func:`layerwise_em_routing`).

    Raises:
        ValueError: an unknown type or setting, or the record of a routing the library cannot describe.

    Examples::

        >>> routing_from_config({"type": "dynamic", "iterations": 2})
        DynamicRouting(iterations=2, detach_routing=True, none_of_the_above=False)
        >>> routing_from_config(EMRouting.official(2).to_config()) == EMRouting.official(2)
        True
        >>> routing_from_config({"type": "em", "iterations": 2, "class_layer": {"iterations": 1}}).class_layer
        EMRouting(iterations=1, inverse_temperature=[0.0005], eps=1e-06, cost_normalization=None, detach_routing=False)
    """
    if not isinstance(config, Mapping) or "type" not in config:
        raise ArgumentError(
            f"a routing spec is a mapping with a 'type' ({', '.join(ROUTING_TYPES)}); got {shown(config)}"
        )
    kind, settings = config["type"], {k: v for k, v in config.items() if k != "type"}
    if kind == OPAQUE:
        raise ArgumentError(
            f"the model was recorded with the routing {config.get('repr', '?')}, which capsnets cannot "
            f"describe, so it cannot be rebuilt from its record; build it with that routing passed in "
            f"(routing=...) and load the weights into it (capsnets.models.hub.restore_model)"
        )
    if kind not in ROUTING_TYPES:
        raise ArgumentError(f"unknown routing type {kind!r}; known types: {', '.join(ROUTING_TYPES)}")
    if kind == "em" and CLASS_LAYER in settings:
        return layerwise_em_routing(config)
    cls = ROUTING_TYPES[kind]
    names = [field.name for field in dataclasses.fields(cls) if field.name != "_"]
    reject_unknown(f"routing type {kind!r}", settings, names)
    return cls(**settings)


def as_routing(
    routing,
    default: Callable | None,
    *,
    types: Sequence[str] | None = None,
    name: str = "routing",
    defaults: Mapping | None = None,
) -> Callable:
    """The routing object for an argument that takes a routing object, its spec, a spec type name or None.

    Args:
        routing: a routing callable (used as it is), a spec (:func:`routing_from_config`), a spec type
            (``"dynamic"``: that routing with its defaults), or None (``default()``).
        default: the routing class (or factory) that None stands for; None: None is refused.
        types: the spec types (:data:`ROUTING_TYPES`) the caller's layers can call, e.g.
            :data:`VECTOR_ROUTING_TYPES`; a routing of another known type is refused. None: any.
        name: the argument's name, for the messages.
        defaults: settings for a spec (or type name) that leaves them out, instead of the routing class's.

    Raises:
        ArgumentError: ``routing`` is none of these, its spec is not one the library can build, it is of a
            type the caller cannot call, or it is a network's EM spec with a ``"class_layer"``
            (:func:`layerwise_em_routing`), where one routing is called.

    Examples::

        >>> as_routing(None, DynamicRouting)
        DynamicRouting(iterations=3, detach_routing=True, none_of_the_above=False)
        >>> as_routing({"type": "dynamic", "iterations": 2}, DynamicRouting)
        DynamicRouting(iterations=2, detach_routing=True, none_of_the_above=False)
        >>> as_routing("em", DynamicRouting, types=VECTOR_ROUTING_TYPES)
        Traceback (most recent call last):
        capsnets.validation.ArgumentError: routing='em': its type is 'em', and these capsule layers route with ...
    """
    given = routing
    if routing is None and default is not None:
        return default()
    if isinstance(routing, str):
        routing = {"type": routing}
    if isinstance(routing, Mapping):
        kind = routing.get("type")
        if types is not None and isinstance(kind, str) and kind in ROUTING_TYPES and kind not in types:
            raise _wrong_type(name, given, kind, types)
        if CLASS_LAYER in routing:
            raise ArgumentError(
                f"{name}={shown(given)}: {CLASS_LAYER!r} sets the class capsule layer of a matrix capsule network; "
                f"give this spec to the network (MatrixCapsNet), and one layer's settings to a layer",
                name,
            )
        try:
            return routing_from_config({**(defaults or {}), **routing})
        except (ValueError, TypeError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ArgumentError(f"{name}={shown(given)}: {reason}", name) from None
    if not callable(routing):
        raise ArgumentError(
            f"{name} must be a routing object, its spec (a mapping with a 'type': "
            f"{', '.join(types or ROUTING_TYPES)}) or a routing type name; got {shown(given)}",
            name,
        )
    kind = next((key for key, cls in ROUTING_TYPES.items() if type(routing) is cls), None)
    if types is not None and kind is not None and kind not in types:
        raise _wrong_type(name, given, kind, types)
    return routing


@dataclass(frozen=True)
class LayerwiseEMRouting:
    """The EM routing of a matrix capsule network (Hinton, Sabour & Frosst 2018, Sec. 4): one routing for its
    convolutional capsule layers and one for its class capsule layer.

    Its spec is the convolutional layers' EM spec with the class layer's settings under ``"class_layer"``, e.g.
    ``{"type": "em", "iterations": 2, "formulation": "official", "class_layer": {"iterations": 1}}``;
    :func:`layerwise_em_routing` builds one from a spec, a single routing or a type name.

    Args:
        conv: the routing of the convolutional capsule layers (an :class:`EMRouting`, or another routing callable
            of matrix capsules' votes, which has no spec).
        class_layer: the routing of the class capsule layer (the same kinds).

    Examples::

        >>> routing = layerwise_em_routing({"type": "em", "iterations": 2, "formulation": "official"})
        >>> routing.conv == EMRouting.official(2, layer="conv"), routing.class_layer == EMRouting.official(2, layer="class")
        (True, True)
        >>> routing_from_config(routing_config(routing)) == routing
        True
    """

    conv: Callable
    class_layer: Callable

    @property
    def formulation(self) -> str:
        """The convolutional layers' EM formulation (``"paper"`` for a routing without one)."""
        return getattr(self.conv, "formulation", "paper")

    @property
    def describable(self) -> bool:
        """Whether both routings are :class:`EMRouting` (and so this routing has a spec)."""
        return type(self.conv) is EMRouting and type(self.class_layer) is EMRouting

    def to_config(self) -> dict:
        """The JSON-able spec: the convolutional layers' complete EM spec, the class layer's complete settings
        under ``"class_layer"`` (:func:`routing_from_config` rebuilds it)."""
        if not self.describable:
            raise ArgumentError(f"{self!r} routes with a routing capsnets cannot describe, so it has no spec")
        settings = {key: value for key, value in self.class_layer.to_config().items() if key != "type"}
        return {**self.conv.to_config(), CLASS_LAYER: settings}


def layerwise_em_routing(routing, *, name: str = "routing") -> LayerwiseEMRouting:
    """The routing of a matrix capsule network's layers, from a :class:`LayerwiseEMRouting` (as it is), a single
    routing (every layer routes with it), an EM spec or ``"em"``.

    A spec's settings are the convolutional capsule layers'; its ``"class_layer"``, a mapping of settings, changes
    some of them for the class capsule layer (``capsnets.functional.em.spec.layer_spec``). Settings that
    neither gives take the defaults of the layer's ``formulation``: :class:`EMRouting`'s for ``"paper"``, the
    released code's per layer for ``"official"`` (:meth:`EMRouting.official`: the inverse temperature schedule,
    divided by 4 in the class layer, and the mass guard of a convolutional or class layer).

    Raises:
        ArgumentError: not an EM routing, its spec or ``"em"``, or a spec with settings that do not build one.

    Examples::

        >>> routing = layerwise_em_routing({"type": "em", "iterations": 3, "class_layer": {"iterations": 1}})
        >>> routing.conv.iterations, routing.class_layer.iterations
        (3, 1)
        >>> single = EMRouting(2)
        >>> layerwise_em_routing(single) == LayerwiseEMRouting(single, single)
        True
    """
    if isinstance(routing, LayerwiseEMRouting):
        return routing
    if not isinstance(routing, (str, Mapping)):
        routing = as_routing(routing, None, types=("em",), name=name)
        return LayerwiseEMRouting(routing, routing)
    spec = {"type": routing} if isinstance(routing, str) else routing
    if spec.get("type") != "em":  # as_routing names what is wrong with a spec of another or no type
        as_routing({k: v for k, v in spec.items() if k != CLASS_LAYER}, None, types=("em",), name=name)
        raise ArgumentError(f"{name}={shown(routing)}: a matrix capsule network routes by EM ('em')", name)
    try:
        return LayerwiseEMRouting(*(_em_layer(spec, layer) for layer in LAYERS))
    except (ValueError, TypeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ArgumentError(f"{name}={shown(routing)}: {reason}", name) from None


def _em_layer(spec: Mapping, layer: str) -> EMRouting:
    """The EM routing of one layer (``"conv"`` or ``"class"``) of a network's spec, with its formulation's defaults."""
    settings = layer_spec(spec, layer)
    if settings.get("formulation") == "official":
        iterations = routing_iterations("iterations", settings.get("iterations", EMRouting.iterations))
        released = EMRouting.official(iterations, layer=layer)
        settings = {**released.to_config(), **settings}
    return routing_from_config(settings)


def _wrong_type(name: str, given, kind: str, types: Sequence[str]) -> ArgumentError:
    return ArgumentError(
        f"{name}={shown(given)}: its type is {kind!r}, and these capsule layers route with {' or '.join(map(repr, types))}",
        name,
    )


def local_routing(u_hat: Tensor, routing=None, *, return_couplings: bool = False):
    """Route independently at every output position of a convolutional capsule layer.

    LaLonde & Bagci (2018), Sec. 3.1: each example and position ``(h, w)`` is one routing problem between
    the ``I`` child types and the ``J`` parent types there (logits ``b`` of shape ``(I, H, W, J)`` per
    example, reset per forward, softmax over parents at each position). The positions are folded into the
    batch, so any routing callable for ``(B, I, J, D)`` routes locally.

    Args:
        u_hat: every child type's prediction for every parent type at every position.
        routing: a routing callable, or its spec (a dict, :func:`~capsnets.functional.routing_from_config`);
            None: ``DynamicRouting()``.
        return_couplings: also return the couplings of the last iteration.

    Shape:
        - u_hat: ``(B, I, J, D, H, W)``; ``J, D >= 1`` (else the routing's ``ValueError`` names the empty
          size); no child types give parents with no input, an empty batch or grid empty results.
        - output: ``(B, J, D, H, W)``; couplings ``(B, I, J, H, W)``, summing to 1 over ``J``.

    Examples::

        >>> local_routing(torch.randn(2, 4, 8, 16, 6, 6), DynamicRouting(3)).shape
        torch.Size([2, 8, 16, 6, 6])
    """
    if u_hat.dim() != 6:
        raise ArgumentError(
            f"local_routing expects u_hat of shape (B, I, J, D, H, W) (batch, child types, parent "
            f"types, parent dim, rows, columns); got shape {tuple(u_hat.shape)}"
        )
    if not callable(routing):  # None or a spec (the layers pass routing objects)
        routing = as_routing(routing, DynamicRouting)
    batch, children, parents, dim, height, width = u_hat.shape
    # (B, I, J, D, H, W) -> (B, H, W, I, J, D) -> (B*H*W, I, J, D): one routing problem per position
    flat = u_hat.permute(0, 4, 5, 1, 2, 3).reshape(batch * height * width, children, parents, dim)
    v, couplings = routing(flat, return_couplings=True) if return_couplings else (routing(flat), None)
    v = v.view(batch, height, width, parents, dim).permute(0, 3, 4, 1, 2)  # (B, J, D, H, W)
    if not return_couplings:
        return v
    return v, couplings.view(batch, height, width, children, parents).permute(0, 3, 4, 1, 2)


def local_dynamic_routing(
    u_hat: Tensor,
    iterations: int = DynamicRouting.iterations,
    *,
    detach_routing: bool = DynamicRouting.detach_routing,
    none_of_the_above: bool = DynamicRouting.none_of_the_above,
    return_couplings: bool = False,
):
    """:func:`dynamic_routing` at every position of a capsule grid; see :func:`local_routing` for shapes."""
    return local_routing(
        u_hat, DynamicRouting(iterations, detach_routing, none_of_the_above), return_couplings=return_couplings
    )
