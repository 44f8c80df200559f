"""matrix_capsnet's two formulations, the paper's text and the authors' released code, chosen by the routing's."""

import pytest
import torch

import capsnets
from capsnets.functional import EMRouting, LayerwiseEMRouting, em_inverse_temperatures
from capsnets.models.matrix_capsnet import receptive_field_centres

OFFICIAL = {"formulation": "official"}  # routing settings alone: over the builders' default spec


def test_official_model_uses_the_released_routing_in_each_layer():
    model = capsnets.create_model(
        "matrix_capsnet_small", routing={"formulation": "official", "iterations": 3, "detach_routing": True}
    )
    assert model.formulation == "official"
    for layer in (model.conv_caps1, model.conv_caps2):
        r = layer.routing
        assert (r.formulation, r.eps, r.variance_floor, r.detach_routing) == ("official", 1e-7, 5e-4, True)
        assert r.inverse_temperatures == pytest.approx(em_inverse_temperatures(3, final=0.01))
        assert layer.assignment_scope == "per_type"
    r = model.class_capsules.routing
    assert (r.formulation, r.eps, r.variance_floor) == ("official", 1e-5, 5e-4)
    assert r.inverse_temperatures == pytest.approx(em_inverse_temperatures(3, final=0.0025))
    two = capsnets.create_model("matrix_capsnet_small", routing=OFFICIAL)
    assert two.conv_caps1.routing.iterations == two.class_capsules.routing.iterations == 2
    assert two.class_capsules.routing == EMRouting.official(2, layer="class")
    # the released routings as objects, one per layer
    given = capsnets.create_model(
        "matrix_capsnet_small",
        routing=LayerwiseEMRouting(EMRouting.official(2), EMRouting.official(2, layer="class")),
        device="meta",
    )
    assert given.model_args == two.model_args


def test_the_class_layer_takes_the_settings_of_its_own_key_over_the_specs():
    spec = {"type": "em", "iterations": 3, "detach_routing": True, "class_layer": {"iterations": 1}}
    model = capsnets.create_model("matrix_capsnet_small", routing=spec, device="meta")
    assert model.conv_caps2.routing == EMRouting(3, detach_routing=True)
    assert model.class_capsules.routing == EMRouting(1, detach_routing=True)
    # the official formulation's defaults per layer fill what neither gives: the class layer's final lambda / 4
    official = capsnets.create_model(
        "matrix_capsnet_small", routing={**OFFICIAL, "class_layer": {"iterations": 3}}, device="meta"
    )
    assert official.conv_caps1.routing == EMRouting.official(2, layer="conv")
    assert official.class_capsules.routing == EMRouting.official(3, layer="class")
    with pytest.raises(ValueError, match="class_layer must be a mapping of EM settings"):
        capsnets.create_model("matrix_capsnet_small", routing={"class_layer": {"type": "dynamic"}})
    with pytest.raises(ValueError, match="cost_normalization must be one of"):
        capsnets.create_model("matrix_capsnet_small", routing={"class_layer": {"cost_normalization": "layer"}})


def test_official_initialisation():
    torch.manual_seed(0)
    model = capsnets.create_model("matrix_capsnet", routing=OFFICIAL)
    assert model.primary.pose.bias is None and model.primary.activation.bias is None
    assert model.primary.activation_offset == -1.0
    assert torch.all(model.conv.bias == 0.1)
    for param, std in (
        (model.conv.weight, 0.05),
        (model.primary.pose.weight, 0.5),
        (model.primary.activation.weight, 3.0),
        (model.conv_caps1.weight, 0.3),
        (model.conv_caps2.weight, 0.3),
        (model.class_capsules.weight, 0.01),
    ):
        assert param.abs().max() <= 2 * std + 1e-7  # truncated at two standard deviations
        # a normal truncated at +-2 std has a standard deviation of 0.880 std
        assert param.std().item() == pytest.approx(0.880 * std, rel=0.1), param.shape
    for layer, beta_a, beta_v in (
        (model.conv_caps1, 0.5, 0.5),
        (model.conv_caps2, 0.5, 0.5),
        (model.class_capsules, 1.0, 2.0),
    ):
        assert torch.all(layer.beta_a == beta_a) and torch.all(layer.beta_v == beta_v)


def test_official_coordinate_addition_is_the_receptive_field_centre_in_pixels_over_100():
    # 32 px, VALID convolutions: Conv1 5x5/2, ConvCaps1 3x3/2, ConvCaps2 3x3/1 -> centres -8, -4, 0, 4 px
    centres = receptive_field_centres(32, [(5, 2, 0), (3, 2, 0), (3, 1, 0)])
    assert centres.tolist() == [-8.0, -4.0, 0.0, 4.0]
    # by hand: pixels -3..2 of a 6-pixel line; a 3x3/1 convolution centres on -2..1, one padded by 1 on -3..2
    assert receptive_field_centres(6, [(3, 1, 0)]).tolist() == [-2.0, -1.0, 0.0, 1.0]
    assert receptive_field_centres(6, [(3, 1, 1)]).tolist() == [-3.0, -2.0, -1.0, 0.0, 1.0, 2.0]
    model = capsnets.create_model("matrix_capsnet_small", routing=OFFICIAL)
    coords = model.class_capsules.coordinates(4, 4)
    expected = torch.tensor([-0.08, -0.04, 0.0, 0.04])
    torch.testing.assert_close(coords[..., 0], expected.expand(4, 4))  # the column, in every row
    torch.testing.assert_close(coords[..., 1], expected.unsqueeze(1).expand(4, 4))  # the row
    mnist = capsnets.create_model("matrix_capsnet_small", routing=OFFICIAL, input_size=(1, 28, 28))
    assert mnist.class_capsules.coordinates(4, 4)[0, :, 0].tolist() == pytest.approx([-0.08, -0.04, 0.0, 0.04])


def test_paper_and_official_models_differ_only_in_the_primary_biases():
    paper = capsnets.create_model("matrix_capsnet_small")
    official = capsnets.create_model("matrix_capsnet_small", routing=OFFICIAL)
    difference = set(paper.state_dict()) - set(official.state_dict())
    assert difference == {"primary.pose.bias", "primary.activation.bias"}
    assert capsnets.count_parameters(paper) - capsnets.count_parameters(official) == 8 * 16 + 8


def test_official_formulation_refuses_the_paper_cost_options():
    with pytest.raises(ValueError, match="cost_normalization must be None"):
        capsnets.create_model("matrix_capsnet_small", routing={**OFFICIAL, "cost_normalization": "mean_std"})
    # a setting the spec gives is every layer's; the ones it leaves out are each layer's own
    model = capsnets.create_model("matrix_capsnet_small", routing={**OFFICIAL, "inverse_temperature": 1.0})
    assert model.class_capsules.routing.inverse_temperatures == [1.0] * 2  # the builder's 2 iterations
    assert model.conv_caps1.routing.inverse_temperatures == [1.0] * 2
    assert (model.conv_caps1.routing.eps, model.class_capsules.routing.eps) == (1e-7, 1e-5)
    with pytest.raises(ValueError, match="formulation must be one of"):
        capsnets.create_model("matrix_capsnet_small", routing={"formulation": "google"})


def test_a_routing_object_routes_every_layer_and_chooses_the_formulation():
    routing = EMRouting.official(2)
    model = capsnets.create_model("matrix_capsnet_small", routing=routing, assignment_scope="position")
    assert model.conv_caps1.routing is routing and model.class_capsules.routing is routing
    assert model.primary.activation_offset == -1.0 and model.conv_caps1.assignment_scope == "position"
    paper = capsnets.create_model("matrix_capsnet_small", routing=EMRouting(2), device="meta")
    assert paper.formulation == "paper" and paper.primary.activation_offset == 0.0


def test_a_model_records_its_formulation_in_its_routing_and_rebuilds_from_the_record(tmp_path):
    official = capsnets.create_model("matrix_capsnet_small", routing=OFFICIAL)
    capsnets.save_model(tmp_path / "m.safetensors", official)
    rebuilt = capsnets.load_model(tmp_path / "m.safetensors")
    recorded = rebuilt.checkpoint_meta["model_args"]
    assert set(recorded) == {"routing"} and recorded["routing"]["formulation"] == "official"
    assert recorded["routing"]["class_layer"]["eps"] == 1e-5
    assert rebuilt.formulation == "official" and rebuilt.primary.pose.bias is None
    assert rebuilt.class_capsules.routing == official.class_capsules.routing


def test_a_large_cpu_batch_goes_through_the_capsule_layers_in_slices_in_inference(monkeypatch):
    # Each image's capsules are computed alone, so the slices give the whole batch's scores (to the rounding of
    # convolutions of another batch size); a training step, and a compiled or exported graph, keep the batch whole.
    from capsnets.models import matrix_capsnet

    torch.manual_seed(0)
    model = capsnets.create_model("matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28)).eval()
    images = torch.rand(matrix_capsnet.CPU_IMAGES_AT_A_TIME * 2 + 3, 1, 28, 28)
    sizes = []
    whole = model._conv_capsules
    monkeypatch.setattr(model, "_conv_capsules", lambda x: sizes.append(len(x)) or whole(x))
    with torch.no_grad():
        sliced = model(images).scores
    assert sizes == [matrix_capsnet.CPU_IMAGES_AT_A_TIME] * 2 + [3]
    sizes.clear()
    reference = model(images).scores  # with gradients
    assert sizes == [len(images)]
    torch.testing.assert_close(sliced, reference.detach(), rtol=1e-4, atol=1e-5)
    sizes.clear()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with torch.no_grad():
        model(images)
    assert sizes == [len(images)]
