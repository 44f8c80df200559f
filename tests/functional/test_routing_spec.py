"""Routing specs: every routing class round-trips through a JSON-able dict, and a spec is accepted wherever a
routing is."""

import json

import pytest
import torch

from capsnets.functional import (
    DynamicRouting,
    EMRouting,
    LayerwiseEMRouting,
    as_routing,
    layerwise_em_routing,
    local_routing,
    routing_config,
    routing_from_config,
)
from capsnets.layers import ClassMatrixCapsules, ConvCapsules2d, ConvMatrixCapsules, LinearCapsules
from capsnets.validation import ArgumentError

ROUTINGS = [
    DynamicRouting(),
    DynamicRouting(2, detach_routing=False),
    EMRouting(),
    EMRouting(2, 0.5, detach_routing=True),
    EMRouting(cost_normalization="mean_std", eps=1e-4),
    EMRouting.official(),
    EMRouting.official(4, layer="class"),
    LayerwiseEMRouting(EMRouting(3), EMRouting(1, 0.5, detach_routing=True)),
    LayerwiseEMRouting(EMRouting.official(2), EMRouting.official(2, layer="class")),
    LayerwiseEMRouting(EMRouting.official(2), EMRouting(2, cost_normalization="mean_std")),
]


@pytest.mark.parametrize("routing", ROUTINGS, ids=repr)
def test_every_routing_round_trips_through_json(routing):
    spec = json.loads(json.dumps(routing_config(routing)))
    rebuilt = routing_from_config(spec)
    assert rebuilt == routing and repr(rebuilt) == repr(routing) and rebuilt.to_config() == spec


def test_the_function_defaults_are_the_classes_defaults():
    import inspect

    from capsnets.functional import dynamic_routing, em_routing, local_dynamic_routing

    for function, cls in (
        (dynamic_routing, DynamicRouting),
        (local_dynamic_routing, DynamicRouting),
        (em_routing, EMRouting),
    ):
        parameters = inspect.signature(function).parameters
        for name in ("iterations", "detach_routing"):
            assert parameters[name].default == getattr(cls(), name), (function.__name__, name)
    assert inspect.signature(em_routing).parameters["formulation"].default == EMRouting().formulation


def test_specs_are_validated():
    with pytest.raises(ValueError, match="unknown routing type 'vector'"):
        routing_from_config({"type": "vector"})
    with pytest.raises(
        ValueError,
        match=r"does not take detach \(did you mean detach_routing\?\); it takes: detach_routing, iterations, none_of",
    ):
        routing_from_config({"type": "dynamic", "detach": True})
    with pytest.raises(ValueError, match="mapping with a 'type'"):
        routing_from_config({"iterations": 3})
    with pytest.raises(ValueError, match="iterations must be an integer from 1 to 100"):
        routing_from_config({"type": "em", "iterations": 0})
    with pytest.raises(TypeError, match="not a routing capsnets can describe"):
        routing_config(lambda u_hat: u_hat.sum(1))
    opaque = routing_config(print, strict=False)
    assert opaque["type"] == "opaque"
    with pytest.raises(ValueError, match="cannot be rebuilt"):
        routing_from_config(opaque)
    with pytest.raises(ValueError, match="routing must be"):
        as_routing(3, DynamicRouting)


def test_a_spec_is_accepted_wherever_a_routing_is():
    spec = {"type": "dynamic", "iterations": 2}
    assert LinearCapsules(6, 2, 4, 3, routing=spec).routing == DynamicRouting(2)
    assert ConvCapsules2d(2, 3, 2, 3, routing=spec).routing == DynamicRouting(2)
    em = {"type": "em", "iterations": 2}
    assert ConvMatrixCapsules(2, 3, routing=em).routing == ClassMatrixCapsules(2, 3, routing=em).routing == EMRouting(2)
    u_hat = torch.randn(2, 3, 4, 5, 2, 2, dtype=torch.float64)
    torch.testing.assert_close(local_routing(u_hat, spec), local_routing(u_hat, DynamicRouting(2)), rtol=0, atol=0)
    assert LinearCapsules(6, 2, 4, 3).routing == DynamicRouting()  # None: the routing's defaults
    assert ConvMatrixCapsules(2, 3).routing == EMRouting()


def test_routings_are_frozen_values():
    routing = EMRouting(2)
    with pytest.raises(AttributeError):
        routing.iterations = 3
    assert routing.inverse_temperatures == list(routing.inverse_temperature) and len(routing.inverse_temperature) == 2
    assert {DynamicRouting(2), DynamicRouting(2)} == {DynamicRouting(2)}


def test_a_networks_em_spec_gives_its_class_layer_the_settings_of_its_own_key():
    spec = {"type": "em", "iterations": 3, "detach_routing": True, "class_layer": {"iterations": 1}}
    routing = routing_from_config(spec)
    assert routing == LayerwiseEMRouting(EMRouting(3, detach_routing=True), EMRouting(1, detach_routing=True))
    assert routing_config(routing)["class_layer"] == {
        key: value for key, value in EMRouting(1, detach_routing=True).to_config().items() if key != "type"
    }
    # settings neither gives: the formulation's per layer (the released code's for "official")
    official = layerwise_em_routing({"type": "em", "iterations": 2, "formulation": "official"})
    assert official == LayerwiseEMRouting(EMRouting.official(2), EMRouting.official(2, layer="class"))
    assert layerwise_em_routing("em") == LayerwiseEMRouting(EMRouting(), EMRouting())
    single = EMRouting(2)
    assert layerwise_em_routing(single).conv is single and layerwise_em_routing(single).class_layer is single


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "dynamic"}, "its type is 'dynamic'"),
        ({"iterations": 2}, "a mapping with a 'type'"),
        ({"type": "em", "class_layer": {"type": "dynamic"}}, "class_layer must be a mapping of EM settings"),
        ({"type": "em", "class_layer": [1]}, "class_layer must be a mapping"),
        ({"type": "em", "class_layer": {"eps": -1}}, "eps must be"),
        (
            {"type": "em", "class_layer": {"pose": 4}},
            "'em' does not take pose; it takes: cost_normalization, .*iterations",
        ),
        ({"type": "em", "formulation": "official", "iterations": "abc"}, "iterations must be an integer"),
    ],
)
def test_a_networks_em_spec_is_checked(spec, message):
    with pytest.raises(ArgumentError, match=message):
        layerwise_em_routing(spec)


def test_a_layer_takes_one_routing_not_a_networks():
    with pytest.raises(ArgumentError, match="'class_layer' sets the class capsule layer of a matrix capsule network"):
        ClassMatrixCapsules(4, 3, routing={"type": "em", "class_layer": {"iterations": 1}})
