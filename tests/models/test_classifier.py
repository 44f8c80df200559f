"""timm's classifier API on every classification model: ``get_classifier``, ``forward_features`` (whose output,
through the class layer, gives the class outputs ``forward`` returns) and ``reset_classifier`` (a new class count,
every tensor that does not depend on it kept bit for bit, the model's mode, device, hooks and names)."""

import copy

import pytest
import torch
from torch import nn

import capsnets
from capsnets.layers import HeinsenCapsules, MatrixCapsules
from capsnets.models import CapsNet
from capsnets.models.classifier import Classifier
from capsnets.models.hub import Transfer
from capsnets.models.routing_zoo import HEADS
from capsnets.validation import ArgumentError

# every classification model with its defaults, and the router zoo's other heads (each feeds its class layer
# another structure)
CASES = [(name, {}) for name in capsnets.list_models(task="classification")] + [
    ("routing_zoo", {"head": head}) for head in HEADS if head != "dynamic"
]
IDS = [name + "".join(f"-{value}" for value in args.values()) for name, args in CASES]


@pytest.fixture(scope="module")
def build():
    """``build(name, args)``: a copy of the model in eval mode, each model built once."""
    built = {}

    def copy_of(name: str, args: dict) -> nn.Module:
        key = (name, tuple(args.items()))
        if key not in built:
            torch.manual_seed(0)
            built[key] = capsnets.create_model(name, **args).eval()
        return copy.deepcopy(built[key])

    yield copy_of
    built.clear()


def class_outputs(model: Classifier, features) -> dict[str, torch.Tensor]:
    """The class outputs the class layer makes of ``features``, by the field of ``ModelOutput`` they are."""
    layer = model.get_classifier()
    if isinstance(layer, nn.ModuleDict):  # homogeneous vector capsules: a class layer per branch
        capsules = [layer[key](children) for key, children in features.items()]
        return {"capsules": capsules[-1], "branches": torch.stack([c.norm(dim=-1) for c in capsules], 1)}
    if isinstance(features, MatrixCapsules):
        classes = layer(features)
        return {"scores": classes.activation.flatten(1), "capsules": classes.pose.flatten(2)}
    if isinstance(layer, HeinsenCapsules):
        classes = layer(*features)
        return {"scores": classes.scores, "capsules": classes.mu.flatten(2)}
    if isinstance(features, tuple):  # self-routing: the children's activations go to its routing
        poses, activations = features
        return {"capsules": layer.routing(layer.predictions(poses), poses=poses, activations=activations)}
    return {"scores" if isinstance(layer, nn.Linear) else "capsules": layer(features)}


@pytest.mark.parametrize("name, args", CASES, ids=IDS)
def test_forward_features_feed_the_classifier(build, name, args):
    model = build(name, args)
    images = torch.rand(2, *model.input_size)
    layer = model.get_classifier()
    assert isinstance(model, Classifier) and any(layer is module for module in model.modules())
    with torch.no_grad():
        out = model(images)
        got = class_outputs(model, model.forward_features(images))
    for field, value in got.items():
        assert (value.shape[0], value.shape[-1 if field == "branches" else 1]) == (2, model.num_classes), field
        if field == "branches":  # (B, branches, K): the merged logits are the normalised branch logits, summed
            torch.testing.assert_close(model.merge(value).sum(1), out.scores, rtol=0, atol=0)
        else:
            torch.testing.assert_close(value, getattr(out, field), rtol=0, atol=0)


@pytest.mark.parametrize("name, args", CASES, ids=IDS)
def test_reset_classifier_keeps_what_does_not_depend_on_the_class_count(build, name, args):
    model = build(name, args)
    before = {key: tensor.clone() for key, tensor in model.state_dict().items()}
    calls = []
    model.register_forward_hook(lambda *_: calls.append(True))
    count = model.num_classes + 2
    transfer = model.reset_classifier(count)
    assert isinstance(transfer, Transfer) and str(transfer).startswith("loaded ")
    after = model.state_dict()
    prefix = f"{model.classifier_name}."
    assert sorted(transfer.loaded + transfer.reinitialised) == sorted(after) and not transfer.unused
    for key, tensor in after.items():
        kept = not key.startswith(prefix) and tensor.shape == before[key].shape
        assert (key in transfer.loaded) == kept, key
        if kept:
            assert torch.equal(tensor, before[key]), key
    assert (model.num_classes, model.model_args["num_classes"]) == (count, count)
    assert model.class_names == [str(k) for k in range(count)]
    assert not any(module.training for module in model.modules())
    assert all(tensor.device.type == "cpu" for tensor in after.values())
    with torch.no_grad():
        out = model(torch.rand(2, *model.input_size))
    assert out.scores.shape == (2, count) and calls == [True]


@pytest.mark.parametrize("name, args", CASES, ids=IDS)
def test_reset_classifier_to_the_same_count_gives_a_fresh_class_layer(build, name, args):
    model = build(name, args)
    model.class_names = [f"class {k}" for k in range(model.num_classes)]
    before = {key: tensor.clone() for key, tensor in model.get_classifier().state_dict().items()}
    transfer = model.reset_classifier(model.num_classes)
    prefix = f"{model.classifier_name}."
    assert {f"{prefix}{key}" for key in before} <= set(transfer.reinitialised)
    fresh = model.get_classifier().state_dict()
    assert any(not torch.equal(fresh[key], tensor) for key, tensor in before.items())
    assert model.class_names == [f"class {k}" for k in range(model.num_classes)]


def test_reset_classifier_keeps_hooks_modes_dtype_and_frozen_weights():
    model = capsnets.create_model("capsnet_digits").double()
    model.primary.eval()  # a submodule in another mode than the model
    seen = []
    handle = model.primary.register_forward_hook(lambda module, inputs, output: seen.append(output.shape))
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    transfer = model.reset_classifier(3)
    assert str(transfer) == "loaded 9 of 11; re-initialised class_capsules.weight, decoder.mlp.0.weight"
    assert model.training and not model.primary.training and model.class_capsules.training
    assert all(tensor.dtype == torch.float64 for tensor in model.state_dict().values() if tensor.is_floating_point())
    assert model.class_capsules.weight.requires_grad and model.decoder.mlp[0].weight.requires_grad
    assert not model.conv.weight.requires_grad and not model.decoder.mlp[2].weight.requires_grad
    assert model(torch.rand(2, 1, 8, 8)).scores.shape == (2, 3) and len(seen) == 1
    handle.remove()
    model(torch.rand(2, 1, 8, 8))
    assert len(seen) == 1


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "3", None])
def test_reset_classifier_refuses_bad_class_counts(value):
    model = capsnets.create_model("capsnet_digits")
    state = {key: tensor.clone() for key, tensor in model.state_dict().items()}
    hint = "forward_features" if value in (0, -1) and not isinstance(value, bool) else "integer >= 1"
    with pytest.raises(ArgumentError, match=hint) as caught:
        model.reset_classifier(value)
    assert caught.value.argument == "num_classes" and "num_classes must be an integer >= 1" in str(caught.value)
    assert model.num_classes == 10 and all(torch.equal(t, state[k]) for k, t in model.state_dict().items())


def test_reset_classifier_needs_a_model_built_by_name():
    model = CapsNet(input_size=(1, 8, 8), conv_channels=4, conv_kernel=3, primary_types=2, primary_kernel=3)
    with pytest.raises(ArgumentError, match=r"not built by capsnets\.create_model.*replace its class_capsules"):
        model.reset_classifier(3)
    assert model.num_classes == 10
