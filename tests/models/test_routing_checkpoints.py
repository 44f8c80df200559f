"""A routing passed to a model builder survives a checkpoint: it is recorded as its spec and rebuilt, and a
routing the library cannot describe is recorded as such and refuses to be rebuilt (never the default)."""

import json

import pytest
import torch

import capsnets
from capsnets.checkpoints import load_checkpoint
from capsnets.engine.checkpoint import save_checkpoint
from capsnets.functional import DynamicRouting, EMRouting
from capsnets.models.hub import load_model, restore_model


def _routings(model):
    return {name: repr(module.routing) for name, module in model.named_modules() if hasattr(module, "routing")}


def _save(model, path):
    save_checkpoint(path, model=model, meta={"model": model.model_name, "model_args": model.model_args})
    return path


CASES = {
    "dynamic, 2 iterations": ("capsnet_digits", {"routing": DynamicRouting(2)}, (1, 8, 8)),
    "EM paper formulation": ("matrix_capsnet_small", {"routing": EMRouting(detach_routing=True)}, (1, 32, 32)),
    "EM official, 2 iterations": (
        "matrix_capsnet_small",
        {"routing": EMRouting.official(2, layer="class")},
        (1, 32, 32),
    ),
    "EM official spec": (
        "matrix_capsnet_small",
        {"routing": {"type": "em", "iterations": 1, "formulation": "official"}},
        (1, 32, 32),
    ),
    "dynamic spec, SegCaps": (
        "segcaps_small",
        {"routing": {"type": "dynamic", "iterations": 2, "detach_routing": False}},
        (1, 16, 16),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_checkpoint_rebuilds_the_routing_it_was_saved_with(case, tmp_path):
    name, kwargs, shape = CASES[case]
    torch.manual_seed(0)
    model = capsnets.create_model(name, **kwargs).eval()
    assert _routings(model) != _routings(capsnets.create_model(name))  # not the default: the test can fail
    rebuilt = load_model(_save(model, tmp_path / "m.safetensors"))
    assert rebuilt.checkpoint_meta["model_args"]["routing"]["type"] in ("dynamic", "em")
    assert _routings(rebuilt) == _routings(model)
    images = torch.rand(2, *shape)
    with torch.no_grad():
        before, after = model(images), rebuilt(images)
    got = after.scores if hasattr(after, "scores") else after.probabilities
    expected = before.scores if hasattr(before, "scores") else before.probabilities
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_the_recorded_spec_is_complete_and_json():
    routing = EMRouting.official(2, layer="class")
    model = capsnets.create_model("matrix_capsnet_small", routing=routing)
    spec = model.model_args["routing"]  # the convolutional layers' spec, the class layer's settings under its key
    settings = {key: value for key, value in routing.to_config().items() if key != "type"}
    assert spec == {**routing.to_config(), "class_layer": settings}
    assert spec["eps"] == 1e-5 and len(spec["inverse_temperature"]) == 2
    assert json.loads(json.dumps(spec)) == spec
    assert capsnets.create_model("capsnet_small", routing=DynamicRouting(2)).model_args == {
        "routing": {"type": "dynamic", "iterations": 2, "detach_routing": True, "none_of_the_above": False}
    }
    partial = capsnets.create_model("capsnet_small", routing={"type": "dynamic", "iterations": 2})
    assert partial.model_args["routing"] == DynamicRouting(2).to_config()  # the defaults filled in


class _Halved:
    """A routing the library cannot describe: dynamic routing's output, halved."""

    def __call__(self, u_hat, *, return_couplings=False):
        return DynamicRouting()(u_hat) / 2

    def __repr__(self):
        return "Halved()"


def test_an_undescribed_routing_is_recorded_and_refuses_to_be_rebuilt(tmp_path):
    torch.manual_seed(0)
    model = capsnets.create_model("capsnet_digits", routing=_Halved())
    assert model.model_args["routing"] == {"type": "opaque", "repr": "Halved()"}
    path = _save(model, tmp_path / "m.safetensors")  # the weights are kept ...
    with pytest.raises(ValueError, match=r"Halved\(\).*cannot be rebuilt.*restore_model"):
        load_model(path)  # ... but never loaded into a model with the default routing
    same = capsnets.create_model("capsnet_digits", routing=_Halved())
    restore_model(same, load_checkpoint(path))  # the way the error names
    images = torch.rand(2, 1, 8, 8)
    torch.testing.assert_close(same(images).scores, model(images).scores, rtol=0, atol=0)


def test_routing_settings_alone_update_the_models_default_routing():
    assert capsnets.create_model("capsnet_digits", routing={"iterations": 2}).class_capsules.routing == DynamicRouting(
        2
    )
    assert capsnets.create_model("segcaps_small", routing={"detach_routing": False}).enc1.routing == DynamicRouting(
        detach_routing=False
    )
    assert capsnets.create_model(
        "matrix_capsnet_small", routing={"formulation": "official", "iterations": 3}
    ).conv_caps1.routing == EMRouting.official(3)
    assert capsnets.create_model("matrix_capsnet_small", routing={"iterations": 3}).conv_caps1.routing == EMRouting()


def test_builders_leave_the_routing_defaults_to_the_routing():
    # a builder names its routing's type (the matrix networks their iterations too): the other defaults live in
    # capsnets.functional alone
    for name in ("capsnet", "capsnet_small", "segcaps_small", "capspix2pix_small", "matrix_capsnet_small"):
        args = capsnets.models.model_arguments(name)
        assert args["routing"] in ("dynamic", "em") or dict(args["routing"]) == {"type": "em", "iterations": 2}
        assert not any(key.startswith("routing_") for key in args)
    assert capsnets.create_model("capsnet_digits").class_capsules.routing == DynamicRouting()
    assert capsnets.create_model("matrix_capsnet_small").class_capsules.routing == EMRouting(2)
    official = capsnets.create_model("matrix_capsnet_small", routing={"formulation": "official"})
    assert official.conv_caps1.routing == EMRouting.official(2, layer="conv")
    assert official.class_capsules.routing == EMRouting.official(2, layer="class")
