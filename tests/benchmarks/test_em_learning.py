import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "em_learning.py"


def test_em_learning_records_a_curve_per_variant(tmp_path):
    out = tmp_path / "curves.json"
    command = [
        sys.executable,
        str(SCRIPT),
        "--model",
        "capsnet_digits",
        "--dataset",
        "digits",
        "--train-size",
        "48",
        "--test-size",
        "20",
        "--steps",
        "3",
        "--eval-every",
        "2",
        "--batch-size",
        "16",
        "--device",
        "cpu",
        "--variant",
        "three",
        '{"routing": {"iterations": 3}}',
        "--variant",
        "one",
        '{"routing": {"iterations": 1}}',
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    assert result["meta"]["device"] == "cpu" and result["batch_size"] == 16
    assert list(result["variants"]) == ["three", "one"]
    for variant in result["variants"].values():
        assert [point["step"] for point in variant["curve"]] == [2, 3]
        assert [point["images"] for point in variant["curve"]] == [32, 48]
        assert 0 <= variant["final_test_accuracy"] <= 1 and variant["train_images_per_s"] > 0
        assert variant["initial_activations"] == {} and all(p["activations"] == {} for p in variant["curve"])
    assert result["variants"]["one"]["model_args"] == {"routing": {"iterations": 1}}


def test_em_learning_rejects_a_variant_that_is_not_an_object(tmp_path, load_benchmark, capsys):
    with pytest.raises(SystemExit) as stopped:
        load_benchmark("em_learning").main(["--variant", "bad", "[1, 2]", "--out", str(tmp_path / "x.json")])
    assert stopped.value.code == 2 and "must be an object" in capsys.readouterr().err


def test_activation_stats_describe_each_matrix_capsule_layer(load_benchmark):
    import torch

    import capsnets

    em_learning = load_benchmark("em_learning")
    torch.manual_seed(0)
    model = capsnets.create_model("matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28))
    images = torch.rand(6, 1, 28, 28)
    stats = em_learning.activation_stats(model, images)
    assert list(stats) == ["primary", "conv_caps1", "conv_caps2", "class_capsules"]
    for layer in stats.values():
        assert 0 <= layer["mean"] <= 1 and layer["std"] >= 0 and 0 <= layer["spread"] <= 1
    # checked against the layer's own output
    activation = model.class_capsules(model.conv_caps2(model.conv_caps1(model.primary(torch.relu(model.conv(images))))))
    a = activation.activation.flatten(1)
    assert abs(stats["class_capsules"]["mean"] - a.mean().item()) < 1e-5
    assert abs(stats["class_capsules"]["spread"] - (a.amax(1) - a.amin(1)).mean().item()) < 1e-5
    assert model.training  # left in training mode, as it was
    assert em_learning.activation_stats(capsnets.create_model("capsnet_digits"), torch.rand(2, 1, 8, 8)) == {}


def test_initialise_refills_the_named_parameters_only(load_benchmark):
    import pytest
    import torch

    import capsnets

    em_learning = load_benchmark("em_learning")
    torch.manual_seed(0)
    model = capsnets.create_model("matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    em_learning.initialise(model, {"beta_a": [-0.6, 0.3], "beta_v": 0.25})
    for name, param in model.named_parameters():
        if name.endswith(".beta_a"):  # drawn within two standard deviations, not all equal
            assert ((param >= -1.2) & (param <= 0.0)).all() and param.std() > 0, name
        elif name.endswith(".beta_v"):
            assert (param == 0.25).all(), name
        else:
            assert torch.equal(param, before[name]), name
    with pytest.raises(ValueError, match="no parameter .* named 'beta_b'"):
        em_learning.initialise(model, {"beta_b": 1.0})


def test_set_layer_routing_replaces_one_layers_routing(load_benchmark):
    import pytest

    import capsnets

    em_learning = load_benchmark("em_learning")
    model = capsnets.create_model(
        "matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28), routing={"detach_routing": True}
    )
    em_learning.set_layer_routing(
        model, {"class_capsules": {"cost_normalization": "mean_std", "inverse_temperature": 1.0, "iterations": 2}}
    )
    assert (
        model.class_capsules.routing.cost_normalization == "mean_std" and model.class_capsules.routing.iterations == 2
    )
    assert model.class_capsules.routing.inverse_temperatures == [1.0, 1.0]
    assert model.conv_caps1.routing.cost_normalization is None and model.conv_caps1.routing.detach_routing
    with pytest.raises(ValueError, match="no routed layer named 'primary'"):
        em_learning.set_layer_routing(model, {"primary": {}})


def test_initialise_takes_one_layers_parameter_by_its_full_name(load_benchmark):
    import torch

    import capsnets

    em_learning = load_benchmark("em_learning")
    model = capsnets.create_model(
        "matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28), routing={"formulation": "paper"}
    )
    em_learning.initialise(model, {"class_capsules.beta_a": -1.5})
    assert (model.class_capsules.beta_a == -1.5).all() and (model.conv_caps1.beta_a == 0).all()
    assert torch.equal(model.conv_caps2.beta_a, torch.zeros_like(model.conv_caps2.beta_a))
