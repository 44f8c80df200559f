"""Bad values at the library's boundary get an error that names the argument: model arguments
(checked against each builder's declared schema), loss arguments, devices and the images given to a model.

Models are built on the meta device wherever the check comes before any computation, so every registered model
is covered in seconds."""

import json

import pytest
import torch

import capsnets
from capsnets.engine.runtime import resolve_device
from capsnets.functional import routing_from_config
from capsnets.losses import create_loss, list_losses, loss_schema
from capsnets.models import model_schema, model_task
from capsnets.validation import ArgumentError, available_devices, shown

MODELS = capsnets.list_models()


def _arguments(expects: str) -> list[tuple[str, str]]:
    """``(model, argument)`` for every argument of every registered model whose description contains ``expects``."""
    return [
        (name, key) for name in MODELS for key, argument in model_schema(name).items() if expects in argument.expects
    ]


def _refused(name: str, key: str, value, *also: str) -> str:
    with pytest.raises(ArgumentError) as info:
        capsnets.create_model(name, **{key: value})
    message = str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)
    for part in (key, shown(value)[:40], *also):
        assert part in message, f"{part!r} not in {message!r}"
    assert "\n" not in message
    return message


def _run(model, images):
    """``model``'s forward pass with whatever else its task needs."""
    if model_task(model.model_name) == "autoencoder":
        return model(images, torch.zeros(len(images), 2, device=getattr(images, "device", None)))
    return model(images)


def _first_tensor(output):
    return next(value for value in vars(output).values() if isinstance(value, torch.Tensor))


# model arguments ------------------------------------------------------------------------------------------------


def test_every_model_argument_is_declared():
    for name in MODELS:
        for key, argument in model_schema(name).items():
            assert argument.expects != "any value", f"{name}: {key} has no type annotation"
        assert capsnets.models.model_arguments(name) == {k: a.default for k, a in model_schema(name).items()}


def test_the_choices_builders_list_are_the_ones_their_models_take():
    from capsnets.layers.matrix import ASSIGNMENT_SCOPES
    from capsnets.models.routing_zoo import HEADS

    def listed(choices) -> str:
        return "one of " + ", ".join(map(repr, choices))

    assert model_schema("routing_zoo")["head"].expects == listed(HEADS)
    assert (
        model_schema("matrix_capsnet")["assignment_scope"].expects
        == listed(ASSIGNMENT_SCOPES) + " or None (YAML: null)"
    )


@pytest.mark.parametrize("name, key", _arguments("true"))
def test_booleans_must_be_booleans(name, key):
    for value in ("abc", "false", 1, 0.0):
        message = _refused(name, key, value, "true")
    assert "leave it out" in message and f"list-models {name}" in message


@pytest.mark.parametrize("name, key", _arguments("positive integer"))
def test_sizes_and_counts_must_be_positive_integers(name, key):
    for value in (0, -3, 2.5, 2.0, "3", True):
        _refused(name, key, value, "positive integer")


@pytest.mark.parametrize(
    "name, key", [(name, key) for name, key in _arguments("") if "None" not in model_schema(name)[key].expects]
)
def test_null_is_refused_where_an_argument_has_no_none(name, key):
    _refused(name, key, None, "got None")


@pytest.mark.parametrize("name", MODELS)
def test_input_size_must_be_three_positive_integers(name):
    for value in ("abc", [1, 28], [1, 0, 28], [1.5, 28, 28], 28):
        _refused(name, "input_size", value, "(C, H, W)")


@pytest.mark.parametrize("name", [name for name in MODELS if "routing" in model_schema(name)])
def test_routing_must_be_a_routing_or_its_spec(name):
    own, other = ("em", "dynamic") if name.startswith("matrix") else ("dynamic", "em")
    own, other = ("heinsen", "dynamic") if name.startswith("heinsen") else (own, other)
    family = own  # the first type the message names
    own = "self_attention" if name.startswith("efficient") else own
    assert capsnets.create_model(name, routing=own, device="meta").routing_spec["type"] == own  # a type name
    _refused(name, "routing", "dinamic", "unknown routing type")
    _refused(name, "routing", 3, "routing object")
    if own == "self_attention":  # no iterations
        _refused(name, "routing", {"type": own, "bias": "2"}, "bias must be true or false")
    else:
        message = _refused(name, "routing", {"type": own, "iterations": "2"}, "iterations")
        assert "integer" in message
    _refused(name, "routing", {"type": "dinamic"}, "unknown routing type")
    _refused(name, "routing", {"type": own, "detach_routing": "yes"}, "detach_routing")
    # the other family's routing: its layers would call it with the wrong arguments
    _refused(name, "routing", {"type": other}, f"its type is '{other}'", f"route with '{family}'")
    _refused(name, "routing", routing_from_config({"type": other}), f"its type is '{other}'")


@pytest.mark.parametrize("name", MODELS)
def test_placement_arguments_are_checked(name):
    _refused(name, "dtype", "abc", "floating-point torch.dtype")
    _refused(name, "dtype", torch.int64, "floating-point torch.dtype")
    _refused(name, "device", "cuda:x", "available here")
    _refused(name, "device", 3.5, "device name")


@pytest.mark.parametrize("name", MODELS)
def test_unknown_arguments_are_named_with_the_ones_taken(name):
    with pytest.raises(ArgumentError, match=r"does not take input_sise \(did you mean input_size\?\); it takes: "):
        capsnets.create_model(name, input_sise=(1, 28, 28))


def test_matrix_models_check_their_routing_settings():
    _refused(
        "matrix_capsnet_small",
        "routing",
        {"type": "em", "formulation": "paper", "inverse_temperature": "abc"},
        "could not convert",
    )
    _refused("matrix_capsnet_small", "routing", {"type": "em", "formulation": "offical"}, "formulation must be one of")
    _refused("matrix_capsnet_small", "assignment_scope", "global", "'per_type'")
    _refused("matrix_capsnet_small", "checkpoint_chunks", -1, "non-negative integer")
    _refused("matrix_capsnet_small", "routing", {"type": "em", "detach_routing": "abc"}, "detach_routing must be True")
    _refused("cnn_baseline_narrow", "dropout", 1, "[0, 1)")


def test_routing_settings_given_as_arguments_are_pointed_to_the_routing():
    with pytest.raises(ArgumentError, match=r"routing_iterations.*routing=\{'iterations': 2\}.*routing.iterations=2"):
        capsnets.create_model("capsnet_small", routing_iterations=2)
    with pytest.raises(ArgumentError, match=r"detach_routing.*routing.detach_routing=True"):
        capsnets.create_model("matrix_capsnet_small", detach_routing=True)


@pytest.mark.parametrize("name", MODELS)
def test_values_from_yaml_and_json_are_taken(name):
    default = model_schema(name)["input_size"].default
    model = capsnets.create_model(name, input_size=list(default), device="meta")
    assert model.input_size == tuple(default) and model.model_args["input_size"] == list(default)
    rebuilt = capsnets.create_model(name, **json.loads(json.dumps(model.model_args)), device="meta")
    assert rebuilt.model_args == model.model_args


def test_ints_are_taken_for_floats_and_routings_rebuild_from_their_records():
    model = capsnets.create_model(
        "matrix_capsnet_small", routing={"formulation": "paper", "inverse_temperature": 1}, device="meta"
    )
    assert model.class_capsules.routing.inverse_temperatures == [1.0] * 2  # the builder's 2 iterations
    assert model.model_args["routing"]["inverse_temperature"] == [1.0] * 2
    assert capsnets.create_model("cnn_baseline_narrow", dropout=0, device="meta").model_args["dropout"] == 0.0
    official = capsnets.create_model(
        "matrix_capsnet_small", routing=capsnets.functional.EMRouting.official(2), device="meta"
    )
    record = json.loads(json.dumps(official.model_args))
    assert capsnets.create_model("matrix_capsnet_small", **record, device="meta").model_args == record
    assert capsnets.create_model("capsnet_small", dtype="float64", device="meta").conv.weight.dtype == torch.float64


def test_the_command_line_prints_the_error_in_one_line(tmp_path, capsys):
    from capsnets.cli import main

    status = main(
        [
            "train",
            "--model",
            "matrix_capsnet_small",
            "--dataset",
            "digits",
            "--out",
            str(tmp_path / "run"),
            "--model-arg",
            "routing.detach_routing=abc",
        ]
    )
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(error) == 1
    assert "detach_routing must be True or False" in error[0] and "'abc'" in error[0]


# the helpers ----------------------------------------------------------------------------------------------------


def test_the_helpers_return_what_the_caller_keeps_and_name_the_argument():
    from capsnets.validation import choice, describe, flag, floating_dtype, image_size, number, reject_unknown

    assert image_size("input_size", [1, 28, 28]) == (1, 28, 28) and number("lr", 1) == 1.0
    assert floating_dtype("dtype", "torch.float64") is torch.float64 and flag("x", False) is False
    assert choice("norm", None, ("batch", None)) is None
    for call, words in [
        (lambda: number("ramp", 0, 0, 1, low_open=True), "ramp must be a number in (0, 1]"),
        (lambda: number("w", float("nan")), "w must be a number, got nan"),
        (lambda: choice("norm", 1, (True, 1.0)), "norm must be one of True, 1.0, got 1"),
        (lambda: flag("bias", 1), "bias must be true or false, got 1"),
        (lambda: reject_unknown("loss 'x'", ["widht"], ["width"]), "(did you mean width?)"),
    ]:
        with pytest.raises(ArgumentError) as info:
            call()
        assert words in str(info.value) and info.value.argument is not None
    assert describe("Literal['a', 'b'] | None") == "one of 'a', 'b' or None (YAML: null)"
    assert describe("") == "any value" and describe("Sequence[int]") == "Sequence[int]"


# loss arguments -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list_losses())
def test_loss_arguments_are_checked(name):
    with pytest.raises(ArgumentError, match=f"loss '{name}' does not take weight"):
        create_loss(name, weight=1.0)
    for key, argument in loss_schema(name).items():
        with pytest.raises(ArgumentError, match=f"{key} must be a number.*, got 'abc'"):
            create_loss(name, **{key: "abc"})
        if argument.default is not None:  # an argument whose default is None takes None
            with pytest.raises(ArgumentError, match=f"{key} must be a number.*, got None"):
                create_loss(name, **{key: None})
    with pytest.raises(ArgumentError, match="unknown loss"):
        create_loss(name + "x")


def test_loss_arguments_take_ints_for_floats():
    assert create_loss("margin", m_pos=1, reconstruction_weight=0).m_pos == 1.0
    with pytest.raises(ValueError, match="label_smoothing must be a number in"):
        create_loss("cross_entropy", label_smoothing=2)


# devices --------------------------------------------------------------------------------------------------------


def _usable(device: str) -> bool:
    kind, _, index = device.partition(":")
    if kind == "cuda":
        return torch.cuda.is_available() and int(index or 0) < torch.cuda.device_count()
    if kind == "mps":
        return torch.backends.mps.is_available()
    return hasattr(torch, "xpu") and torch.xpu.is_available() and int(index or 0) < torch.xpu.device_count()


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:7", "mps", "xpu", "xpu:3"])
def test_devices_this_build_lacks_are_refused(device):
    if _usable(device):
        assert resolve_device(device) == torch.device(device)
        return
    with pytest.raises(ValueError, match=f"device='{device}': .*available here: {', '.join(available_devices())}"):
        resolve_device(device)


@pytest.mark.parametrize("device", ["cuda:x", "gpu", "", "cuda:-1", None, 2.0])
def test_device_names_that_are_no_devices_are_refused(device):
    with pytest.raises(ArgumentError, match=r"device.*available here: cpu"):
        resolve_device(device)
    assert resolve_device("cpu") == torch.device("cpu")


def test_the_meta_device_builds_models_but_does_not_run_them():
    assert capsnets.create_model("capsnet_digits", device="meta").primary.conv.weight.is_meta
    with pytest.raises(
        ArgumentError, match=r"device='meta': the meta device holds shapes but no data.*use one of: cpu"
    ):
        resolve_device("meta")


# images given to a model ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_bad_image_batches_are_refused(name):
    model = capsnets.create_model(name, device="meta")
    channels, height, width = model.input_size
    argument = "label_maps" if model_task(name) == "synthesis" else "images"
    bad = {
        "an empty batch": torch.zeros(0, channels, height, width),
        f"of shape (B, {channels}, ": torch.zeros(2, channels + 1, height, width),
        f"{argument} of shape (B, {channels}, ": torch.zeros(2, channels, height + 4, width),
        "dtype torch.int64": torch.zeros(2, channels, height, width, dtype=torch.int64),
        f"{argument} as a torch.Tensor": [[0.0]],
    }
    for phrase, images in bad.items():
        images = images.to("meta") if isinstance(images, torch.Tensor) else images
        with pytest.raises(ArgumentError) as info:
            _run(model, images)
        assert phrase in str(info.value) and argument in str(info.value), str(info.value)


#: One cheap registered model of every model class (the conversion is the same code in all of them), with the
#: smallest input it takes.
CHEAP = {
    "capsnet_digits": {},
    "matrix_capsnet_small": {"input_size": (1, 28, 28)},
    "cnn_baseline_narrow": {},
    "cnn_smallnorb_narrow": {},
    "segcaps_small": {"input_size": (1, 16, 16)},
    "capsule_unet_small": {"input_size": (1, 16, 16)},
    "unet_small": {"input_size": (1, 16, 16)},
    "capspix2pix_small": {"input_size": (10, 16, 16)},
    "pix2pix_small": {"input_size": (10, 16, 16)},
    "transforming_autoencoder": {},
    "efficient_capsnet": {},
    "routing_zoo": {},
    "heinsen_capsnet": {"parts": 4, "channels": 8},
    "hvc_capsnet": {},
}


def test_the_cheap_models_cover_every_model_class():
    every = {type(capsnets.create_model(name, device="meta")) for name in MODELS}
    assert every == {type(capsnets.create_model(name, device="meta")) for name in CHEAP}


@pytest.mark.parametrize("name", CHEAP)
def test_uint8_and_float64_images_are_converted(name):
    # uint8 scaled by 1/255 and float64 cast to float32 are the same float32 images here: the same outputs
    torch.manual_seed(0)
    model = capsnets.create_model(name, **CHEAP[name]).eval()
    pixels = torch.randint(0, 256, (1, *model.input_size), dtype=torch.uint8)
    with torch.no_grad():
        from_uint8, from_float64 = (_first_tensor(_run(model, x)) for x in (pixels, (pixels.float() / 255).double()))
    assert from_uint8.dtype == from_float64.dtype == torch.float32
    torch.testing.assert_close(from_uint8, from_float64, rtol=0, atol=0)


@pytest.mark.parametrize("overrides", [{"num_classes": 10**15}, {"input_size": (1, 10**15, 8)}])
def test_sizes_too_large_to_build_are_refused(overrides):
    # sizes whose tensors overflow get an error naming the arguments (sizes too large to allocate, e.g.
    # num_classes=10**9, get the same error where the allocation fails; where memory is overcommitted it may not)
    with pytest.raises(ArgumentError, match=r"model 'capsnet_digits' cannot be built with .*too large.*smaller sizes"):
        capsnets.create_model("capsnet_digits", **overrides)


def test_losses_are_listed_by_the_task_they_serve():
    from capsnets.losses import LOSS_TASKS

    assert set(LOSS_TASKS) == set(list_losses())
    assert list_losses("classification") == ["binary_cross_entropy", "cross_entropy", "margin", "spread"]
    assert list_losses("segmentation") == ["binary_segmentation", "capsule_unet", "segcaps"]


def test_errors_about_a_callers_input_are_argument_errors():
    # a ValueError (and a TypeError) as before, now one kind the command line and the demo report as bad input
    import numpy as np

    from capsnets.data.registry import dataset_info
    from capsnets.engine.runtime import resolve_amp
    from capsnets.functional.crop import center_crop
    from capsnets.functional.masking import mask_capsules
    from capsnets.plots import plot_confusion_matrix

    for call in (
        lambda: mask_capsules(torch.zeros(2, 3), torch.zeros(2)),
        lambda: center_crop(torch.zeros(1, 1, 4, 4), 5),
        lambda: dataset_info("no_such_data"),
        lambda: resolve_amp("fast", torch.device("cpu")),
        lambda: plot_confusion_matrix(np.zeros((2, 3)), None, "unused.png"),
    ):
        with pytest.raises(ArgumentError):
            call()
