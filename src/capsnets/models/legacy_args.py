"""Model arguments recorded before every model took its routing as one argument, in today's form.

capsnets 0.2 recorded beside a matrix capsule network's ``routing`` its ``formulation`` (which also chose the
routing's defaults, and the class capsule layer's routing) and could be given a ``class_routing``; Heinsen's
classifier recorded its ``iterations``. Today the formulation and the class layer's settings are part of the routing
spec (:func:`~capsnets.functional.layerwise_em_routing`) and Heinsen's classifier takes a ``routing``.
:func:`upgrade_model_args` translates such a record (a checkpoint's sidecar, a run's ``config.yaml``) where recorded
arguments are rebuilt (:func:`capsnets.models.hub.build_model`), to the arguments that build the same model.

A matrix capsule network whose recorded ``formulation`` differs from its routing's (e.g. the released code's
initialisation with the paper's EM equations) cannot be built any more: its record is refused with an
:class:`~capsnets.validation.ArgumentError` that says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from capsnets.functional import EMRouting, LayerwiseEMRouting, as_routing, routing_config
from capsnets.validation import ArgumentError, shown

#: The default routing of the matrix capsule networks' builders in capsnets 0.2, which a record without a
#: ``routing`` was built with.
_MATRIX_ROUTING_0_2 = {"type": "em", "iterations": 2}


def upgrade_model_args(name: str, args: Mapping | None) -> dict:
    """The arguments of model ``name`` in today's form, from a record that may hold arguments of capsnets 0.2.

    Args:
        name: the registered model's name.
        args: the recorded builder arguments (None: none).

    Raises:
        ArgumentError: a record that no model of today rebuilds (a matrix capsule network with one formulation's
            initialisation and the other's routing).

    Examples::

        >>> upgrade_model_args("heinsen_capsnet", {"iterations": 2})
        {'routing': {'type': 'heinsen', 'iterations': 2}}
        >>> upgrade_model_args("matrix_capsnet_small", {"formulation": "official"})["routing"]["class_layer"]["eps"]
        1e-05
        >>> upgrade_model_args("capsnet_small", {"num_classes": 5})
        {'num_classes': 5}
    """
    args = dict(args or {})
    upgrade = _UPGRADES.get(name)
    return upgrade(name, args) if upgrade is not None else args


def _matrix(name: str, args: dict) -> dict:
    """capsnets 0.2's ``formulation`` and ``class_routing`` of a matrix capsule network, into its routing spec."""
    if "formulation" not in args and "class_routing" not in args:
        return args
    formulation = args.pop("formulation", "paper")  # 0.2's default
    class_routing = args.pop("class_routing", None)
    routing = args.get("routing", _MATRIX_ROUTING_0_2)
    if isinstance(routing, Mapping) and "type" not in routing:  # settings alone, over 0.2's default
        routing = {**_MATRIX_ROUTING_0_2, **routing}
    conv, classes = _routings_0_2(routing, formulation)
    if class_routing is not None:
        classes = as_routing(class_routing, EMRouting, types=("em",), name="class_routing")
    if getattr(conv, "formulation", "paper") != formulation:
        raise ArgumentError(
            f"model {name!r} was recorded by capsnets 0.2 with formulation={formulation!r} and a routing of the "
            f"{conv.formulation!r} formulation ({shown(routing)}); a matrix capsule network's formulation is now "
            f"its routing's, which chooses its initialisation and primary capsules too, so no model of today "
            f"rebuilds this one. Retrain it with routing={{'type': 'em', 'formulation': ...}}",
            "routing",
        )
    args["routing"] = routing_config(LayerwiseEMRouting(conv, classes), strict=False)
    return args


def _routings_0_2(routing, formulation: str) -> tuple[EMRouting, EMRouting]:
    """The routings of the convolutional and class capsule layers that capsnets 0.2 built from ``routing`` and
    ``formulation``: with ``"official"``, the settings a spec left out were the released code's convolutional
    layers', and the released code's convolutional routing gave the class layer the released class routing; any
    other routing was used in every layer."""
    defaults = {}
    if formulation == "official" and (
        isinstance(routing, str)
        or (isinstance(routing, Mapping) and routing.get("formulation", "official") == "official")
    ):
        defaults = {"formulation": "official", "eps": EMRouting.official(layer="conv").eps}
    conv = as_routing(routing, None, types=("em",), defaults=defaults)
    if not isinstance(conv, EMRouting):
        return conv, conv
    released = conv == EMRouting.official(conv.iterations, layer="conv", detach_routing=conv.detach_routing)
    if formulation == "official" and released:
        return conv, EMRouting.official(conv.iterations, layer="class", detach_routing=conv.detach_routing)
    return conv, conv


def _heinsen(name: str, args: dict) -> dict:
    """capsnets 0.2's ``iterations`` of Heinsen's classifier, into its routing spec."""
    if "iterations" not in args:
        return args
    routing = args.get("routing", "heinsen")
    routing = {"type": routing} if isinstance(routing, str) else dict(routing)
    args["routing"] = {**routing, "iterations": args.pop("iterations")}
    return args


_UPGRADES: dict[str, Callable[[str, dict], dict]] = {
    "matrix_capsnet": _matrix,
    "matrix_capsnet_small": _matrix,
    "heinsen_capsnet": _heinsen,
}
