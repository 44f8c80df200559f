"""Stateless capsule math: squash, safe lengths, routing, masking."""
from capsnets.functional.masking import mask_capsules
from capsnets.functional.routing import DynamicRouting, dynamic_routing
from capsnets.functional.squash import capsule_length, safe_norm, squash

__all__ = [
    "DynamicRouting",
    "capsule_length",
    "dynamic_routing",
    "mask_capsules",
    "safe_norm",
    "squash",
]
