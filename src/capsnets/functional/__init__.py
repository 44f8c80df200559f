"""Stateless capsule math: squash, safe lengths, routing (and routing specs), masking."""
from capsnets.functional.child_groups import ChildGroups, grid_child_groups, group_softmax
from capsnets.functional.em_routing import EMRouting, em_inverse_temperatures, em_routing
from capsnets.functional.masking import mask_capsules
from capsnets.functional.routing import DynamicRouting, dynamic_routing, local_dynamic_routing, local_routing
from capsnets.functional.routing_spec import ROUTING_TYPES, as_routing, routing_config, routing_from_config
from capsnets.functional.squash import capsule_length, safe_norm, squash

__all__ = [
    "ChildGroups",
    "DynamicRouting",
    "EMRouting",
    "ROUTING_TYPES",
    "as_routing",
    "capsule_length",
    "dynamic_routing",
    "em_inverse_temperatures",
    "em_routing",
    "grid_child_groups",
    "group_softmax",
    "local_dynamic_routing",
    "local_routing",
    "mask_capsules",
    "routing_config",
    "routing_from_config",
    "safe_norm",
    "squash",
]
