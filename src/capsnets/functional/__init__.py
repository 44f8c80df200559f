"""Stateless capsule math: squash, safe lengths, routing (and routing specs), masking."""

from capsnets.functional.child_groups import ChildGroups, grid_child_groups, group_softmax
from capsnets.functional.dynamic_routing import DynamicRouting, dynamic_routing
from capsnets.functional.em import EMRouting, em_inverse_temperatures, em_routing, em_routing_poses
from capsnets.functional.heinsen_routing import HeinsenOutput, HeinsenRouting, heinsen_routing
from capsnets.functional.homogeneous import homogeneous_vector_capsules
from capsnets.functional.inverted_attention_routing import (
    InvertedAttentionRouting,
    concurrent_inverted_attention_routing,
    inverted_attention_routing,
)
from capsnets.functional.masking import mask_capsules
from capsnets.functional.routing_common import BoundRouting, bind_routing, efficient_squash
from capsnets.functional.routing_spec import (
    ROUTING_TYPES,
    VECTOR_ROUTING_TYPES,
    LayerwiseEMRouting,
    as_routing,
    layerwise_em_routing,
    local_dynamic_routing,
    local_routing,
    routing_config,
    routing_from_config,
)
from capsnets.functional.self_attention_routing import SelfAttentionRouting, self_attention_routing
from capsnets.functional.self_routing import SelfRouting, self_routing
from capsnets.functional.squash import capsule_length, safe_norm, squash
from capsnets.functional.uniform_routing import UniformRouting, uniform_routing

__all__ = [
    "BoundRouting",
    "ChildGroups",
    "DynamicRouting",
    "EMRouting",
    "HeinsenOutput",
    "HeinsenRouting",
    "InvertedAttentionRouting",
    "LayerwiseEMRouting",
    "ROUTING_TYPES",
    "SelfAttentionRouting",
    "SelfRouting",
    "UniformRouting",
    "VECTOR_ROUTING_TYPES",
    "as_routing",
    "bind_routing",
    "capsule_length",
    "concurrent_inverted_attention_routing",
    "dynamic_routing",
    "efficient_squash",
    "em_inverse_temperatures",
    "em_routing",
    "em_routing_poses",
    "grid_child_groups",
    "group_softmax",
    "heinsen_routing",
    "homogeneous_vector_capsules",
    "inverted_attention_routing",
    "layerwise_em_routing",
    "local_dynamic_routing",
    "local_routing",
    "mask_capsules",
    "routing_config",
    "routing_from_config",
    "safe_norm",
    "self_attention_routing",
    "self_routing",
    "squash",
    "uniform_routing",
]
