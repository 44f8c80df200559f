"""Checkpoints of capsnets 0.2, which recorded a matrix capsule network's ``formulation`` (and could take its
``class_routing``) beside its routing, and Heinsen's classifier's ``iterations``, load as the models they recorded:
their arguments are translated once, where recorded arguments are rebuilt (models/legacy_args.py)."""

import pytest
import torch

import capsnets
from capsnets.checkpoints import CheckpointError, load_checkpoint, write_checkpoint
from capsnets.functional import EMRouting
from capsnets.models.hub import model_tensors
from capsnets.models.legacy_args import upgrade_model_args


def _old_checkpoint(path, model, old_args):
    """``model``'s weights in a checkpoint whose sidecar records the arguments ``old_args`` (as capsnets 0.2 did)."""
    return write_checkpoint(path, model_tensors(model), {"model": model.model_name, "model_args": old_args})


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # the released code's routing per layer, the model's default 2 iterations
        ({"formulation": "official"}, {"routing": {"formulation": "official"}}),
        ({"formulation": "official", "routing": "em"}, {"routing": {"type": "em", "formulation": "official"}}),
        # settings alone (a run's config.yaml) over 0.2's default routing, 2 iterations
        (
            {"formulation": "official", "routing": {"iterations": 3}},
            {"routing": {"formulation": "official", "iterations": 3}},
        ),
        # a routing other than the released code's was every layer's in 0.2
        (
            {"formulation": "official", "routing": {"type": "em", "inverse_temperature": 1.0}},
            {"routing": EMRouting(3, 1.0, eps=1e-7, formulation="official")},  # a type: not over the default
        ),
        ({"formulation": "paper", "routing": {"type": "em", "iterations": 3}}, {"routing": EMRouting(3)}),
        (
            {"class_routing": {"type": "em", "iterations": 1}},
            {"routing": {"type": "em", "iterations": 2, "class_layer": EMRouting(1).to_config()}},
        ),
    ],
)
def test_matrix_models_of_0_2_are_rebuilt_with_their_routing_in_each_layer(old, new):
    upgraded = upgrade_model_args("matrix_capsnet_small", {"num_classes": 10, **old})
    assert "formulation" not in upgraded and "class_routing" not in upgraded
    got = capsnets.create_model("matrix_capsnet_small", **upgraded, device="meta")
    expected = capsnets.create_model("matrix_capsnet_small", num_classes=10, **new, device="meta")
    assert got.model_args == expected.model_args
    assert got.formulation == expected.formulation
    for layer in ("conv_caps1", "conv_caps2", "class_capsules"):
        assert getattr(got, layer).routing == getattr(expected, layer).routing, layer


def test_an_official_checkpoint_of_0_2_loads_with_the_released_class_routing(tmp_path):
    torch.manual_seed(0)
    model = capsnets.create_model("matrix_capsnet_small", routing={"formulation": "official"})
    path = _old_checkpoint(tmp_path / "old.safetensors", model, {"formulation": "official"})
    loaded = capsnets.load_model(path)
    assert loaded.model_args == model.model_args and loaded.formulation == "official"
    assert loaded.class_capsules.routing == EMRouting.official(2, layer="class")
    assert loaded.checkpoint_meta["model_args"] == {"formulation": "official"}  # the record itself, as it was
    images = torch.rand(2, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images).scores, model.eval()(images).scores, rtol=0, atol=0)


def test_the_matrix_weight_that_0_2_shipped_loads_with_its_routing_in_every_layer(tmp_path):
    # the arguments the matrix_capsnet_small-mnist weight of capsnets 0.2 recorded, word for word
    recorded = {
        "num_classes": 10,
        "input_size": [1, 28, 28],
        "routing": {
            "type": "em",
            "iterations": 2,
            "inverse_temperature": [0.0005000000000000004, 0.0009750000000000003],
            "eps": 1e-06,
            "cost_normalization": None,
            "detach_routing": False,
            "formulation": "paper",
            "variance_floor": None,
        },
        "coordinate_addition": True,
        "checkpoint_chunks": 0,
        "assignment_scope": None,
        "formulation": "paper",
    }
    torch.manual_seed(0)
    model = capsnets.create_model("matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28))
    path = _old_checkpoint(tmp_path / "old.safetensors", model, recorded)
    assert load_checkpoint(path).meta["model_args"] == recorded  # the record itself, unchanged
    loaded = capsnets.load_model(path)
    assert "formulation" not in loaded.model_args and loaded.model_args["routing"]["class_layer"]["iterations"] == 2
    assert loaded.class_capsules.routing == loaded.conv_caps1.routing == EMRouting(2)
    images = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images).scores, model.eval()(images).scores, rtol=0, atol=0)


def test_heinsen_models_of_0_2_take_their_iterations_as_their_routing(tmp_path):
    assert upgrade_model_args("heinsen_capsnet", {"iterations": 2, "parts": 8}) == {
        "parts": 8,
        "routing": {"type": "heinsen", "iterations": 2},
    }
    torch.manual_seed(0)
    model = capsnets.create_model("heinsen_capsnet", parts=8, channels=8, routing={"iterations": 2})
    loaded = capsnets.load_model(
        _old_checkpoint(tmp_path / "old.safetensors", model, {"iterations": 2, "parts": 8, "channels": 8})
    )
    assert loaded.model_args == model.model_args
    assert loaded.route_classes.routing.spec.iterations == 2


def test_todays_arguments_pass_unchanged():
    for name, args in (
        ("matrix_capsnet_small", {"routing": {"type": "em", "formulation": "official"}, "num_classes": 3}),
        ("heinsen_capsnet", {"routing": {"type": "heinsen", "iterations": 1}}),
        ("capsnet_small", {"num_classes": 5}),
    ):
        assert upgrade_model_args(name, args) == args
    assert upgrade_model_args("capsnet_small", None) == {}


def test_a_formulation_apart_from_its_routings_is_refused_clearly(tmp_path):
    # 0.2 built the released code's initialisation around the paper's EM equations; no model of today does
    model = capsnets.create_model("matrix_capsnet_small", routing={"formulation": "official"})
    old = {"formulation": "official", "routing": {"type": "em", "formulation": "paper"}}
    with pytest.raises(
        CheckpointError, match=r"formulation='official' and a routing of the 'paper' formulation.*Retrain"
    ):
        capsnets.load_model(_old_checkpoint(tmp_path / "old.safetensors", model, old))
