"""Pretrained weights (:mod:`capsnets.models.pretrained`, :mod:`capsnets.models.hub`): the shipped ones load offline
and match their cards, as ``pretrained=True``, by tag, by name or as a :class:`~capsnets.models.Weights`; local files
and ``file://`` URLs load the same way; a file whose SHA-256 differs is refused; bad tags say what exists."""

from __future__ import annotations

import json
import pickle
import shutil

import numpy as np
import pytest
import torch
from reliability.faults import one_error_line

import capsnets
from capsnets.cli import main
from capsnets.engine import publish
from capsnets.files import file_sha256
from capsnets.images import ImageTransform
from capsnets.models import hub, pretrained
from capsnets.models.hub import save_pretrained
from capsnets.models.pretrained import PretrainedError, Weights
from capsnets.validation import ArgumentError

SHIPPED = {
    name: w for model in capsnets.list_models(pretrained=True) for name, w in capsnets.get_model_weights(model).items()
}
CARD_KEYS = ("data", "command", "seed", "test_accuracy", "date", "dtype", "torch")


@pytest.fixture
def tiny_weight(tmp_path):
    """A capsnet_digits weight saved as a pretrained file in ``tmp_path`` (untrained: only the plumbing counts)."""
    torch.manual_seed(0)
    model = capsnets.create_model("capsnet_digits")
    path = save_pretrained(
        model,
        tmp_path / "capsnet_digits-digits.safetensors",
        dataset="digits",
        card={"test_accuracy": 0.1, "data": "none", "command": "none", "seed": 0, "date": "-"},
    )
    return model, path


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_at_least_one_weight_ships_with_a_complete_card():
    assert "capsnet_small-mnist" in SHIPPED and len(SHIPPED) == len(list(pretrained.WEIGHTS_DIR.glob("*.json")))
    for name, weight in SHIPPED.items():
        assert set(CARD_KEYS) <= set(weight.meta["card"]), name
        assert weight.path.is_file() and file_sha256(weight.path) == weight.sha256, name
        assert weight.model in capsnets.list_models() and name == f"{weight.model}-{weight.dataset}"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_weight_loads_offline_by_tag(name, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("a shipped weight must load without the network")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    weight = SHIPPED[name]
    model = capsnets.create_model(weight.model, pretrained=weight.dataset)
    assert not model.training and model.model_name == weight.model
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with torch.no_grad():
        scores = model(torch.zeros(2, *model.input_size)).scores
    assert scores.shape == (2, model.num_classes) and torch.isfinite(scores).all()
    by_name = capsnets.create_model(weight.model, pretrained=name)  # the full <model>-<dataset> name too
    assert _same_weights(model, by_name)


def test_tampered_shipped_weight_is_refused(tmp_path, monkeypatch):
    name, weight = next(iter(SHIPPED.items()))
    shutil.copy(weight.path, tmp_path / weight.path.name)
    shutil.copy(weight.path.with_suffix(".json"), tmp_path / f"{name}.json")
    data = bytearray((tmp_path / weight.path.name).read_bytes())
    data[-3] ^= 0x01  # one bit of one weight
    (tmp_path / weight.path.name).write_bytes(bytes(data))
    monkeypatch.setattr(pretrained, "WEIGHTS_DIR", tmp_path)
    with pytest.raises(PretrainedError, match="SHA-256"):
        capsnets.create_model(weight.model, pretrained=weight.dataset)


def test_local_path_and_file_url_load_the_same_weights(tiny_weight):
    model, path = tiny_weight
    for source in (str(path), path.as_uri()):
        loaded = capsnets.create_model("capsnet_digits", pretrained=source)
        assert _same_weights(model, loaded)
    loaded = capsnets.create_model("capsnet_digits", pretrained=str(path), sha256=file_sha256(path))
    assert _same_weights(model, loaded)
    with pytest.raises(PretrainedError, match="SHA-256"):
        capsnets.create_model("capsnet_digits", pretrained=str(path), sha256="0" * 64)


def test_half_precision_weight_is_loaded_as_float32(tmp_path):
    model = capsnets.create_model("capsnet_digits")
    path = save_pretrained(model, tmp_path / "w.safetensors", dataset="digits", card={"test_accuracy": 0.1}, half=True)
    loaded = capsnets.create_model("capsnet_digits", pretrained=str(path))
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    assert _same_weights(model.half().float(), loaded)
    assert json.loads(path.with_suffix(".json").read_text())["card"]["dtype"] == "float16"


def test_url_download_is_verified_cached_and_atomic(tiny_weight, tmp_path):
    _, path = tiny_weight
    cache = tmp_path / "cache"
    digest = file_sha256(path)
    with pytest.raises(PretrainedError, match="SHA-256"):  # a wrong digest: refused, nothing cached
        pretrained.download_weights(path.as_uri(), "f" * 64, cache_dir=cache)
    assert not cache.exists() or not any(cache.iterdir())
    cached = pretrained.download_weights(path.as_uri(), digest, cache_dir=cache)
    assert file_sha256(cached) == digest and [p.name for p in cache.iterdir()] == [cached.name]
    path.unlink()  # a second call uses the cached file
    assert pretrained.download_weights(path.as_uri(), digest, cache_dir=cache) == cached


@pytest.mark.parametrize("sha256", [None, "", "abc", "g" * 64])
def test_https_url_without_a_valid_sha256_is_refused(sha256):
    with pytest.raises(PretrainedError, match="SHA-256"):
        capsnets.create_model("capsnet_small", pretrained="https://example.org/w.safetensors", sha256=sha256)


@pytest.mark.parametrize(
    "model, tag, message",
    [
        ("capsnet_small", "cifar10", "no shipped pretrained weight 'capsnet_small-cifar10'; shipped: "),
        ("capsnet", "mnist", "no shipped pretrained weight 'capsnet-mnist'"),
        ("capsnet_small", "/no/such/file.safetensors", "does not exist"),
        ("capsnet_small", "ftp://example.org/w.safetensors", "only https:// and file:// URLs"),
    ],
)
def test_bad_tags_say_what_exists(model, tag, message):
    with pytest.raises(PretrainedError, match=message.replace("(", r"\(")):
        capsnets.create_model(model, pretrained=tag)


def test_weight_for_another_model_is_refused_and_overrides_change_the_weights_model(tiny_weight):
    trained, path = tiny_weight
    with pytest.raises(PretrainedError, match="is for model 'capsnet_digits', not 'capsnet_small'"):
        capsnets.create_model("capsnet_small", pretrained=str(path))
    model = capsnets.create_model("capsnet_digits", pretrained=str(path), routing={"iterations": 1})
    assert (
        model.routing_spec["iterations"] == 1 and model.transfer.reinitialised == [] and _same_weights(model, trained)
    )
    with pytest.raises(ArgumentError, match="does not take widht"):
        capsnets.create_model("capsnet_digits", pretrained=str(path), widht=3)
    with pytest.raises(ArgumentError, match="unknown model"):
        capsnets.create_model("capsnet_smal", pretrained="mnist")
    with pytest.raises(ArgumentError, match="pretrained"):
        capsnets.create_model("capsnet_digits", sha256="0" * 64)


def test_cli_lists_shipped_weights_with_their_accuracy(capsys):
    assert main(["list-models", "--pretrained"]) == 0
    out = capsys.readouterr().out
    for name, weight in SHIPPED.items():
        assert name in out and f"{100 * weight.meta['metrics'][weight.dataset]['accuracy']:.2f}%" in out
    assert main(["list-models", "capsnet", "--pretrained"]) == 1
    assert "models with weights: capsnet_small, " in one_error_line(capsys.readouterr().err, "list-models")


@pytest.mark.parametrize(
    "argv, listed",
    [
        (["capsnet_small", "--pretrained"], ["capsnet_small-mnist", "capsnet_small-fashion_mnist"]),
        (["*capsnet*", "--pretrained"], list(SHIPPED)),
        (["efficient*", "--pretrained"], ["efficient_capsnet-mnist"]),
        (["efficient*"], ["efficient_capsnet", "efficient_capsnet_smallnorb"]),
    ],
)
def test_cli_list_models_takes_a_pattern(argv, listed, capsys):
    assert main(["list-models", *argv]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [row.split()[0] for row in rows if row.split()[0] != "name"] == listed
    if "--pretrained" in argv:
        assert rows[1].endswith("yes")  # the default weight comes first and is marked


def test_cli_predict_with_a_shipped_weight(tmp_path, capsys):
    from PIL import Image

    Image.new("L", (28, 28), 0).save(tmp_path / "blank.png")
    assert main(["predict", str(tmp_path / "blank.png"), "--pretrained", "capsnet_small-mnist", "--json", "-"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["model"] == "capsnet_small" and len(record["predictions"]) == 1


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_cli_bad_pretrained_name_is_one_error_line(command, tmp_path, capsys):
    argv = [command, str(tmp_path)] if command == "predict" else [command]
    (tmp_path / "x.png").write_bytes(b"")
    assert main(argv + ["--pretrained", "capsnet_small-cifar10"]) == 1
    assert "no shipped pretrained weight" in one_error_line(capsys.readouterr().err, command)


@pytest.mark.learning
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_weight_reaches_its_cards_accuracy(name, shared_data_root, tmp_path, capsys, monkeypatch):
    # The real test split of each weight's data set; the card's accuracy to within 0.05 points. One test per weight,
    # so that pytest-xdist's workers share them; capsnet_small-mnist's is scored through `capsnets evaluate`.
    from capsnets.data import load_dataset
    from capsnets.engine.evaluate import evaluate

    weight = SHIPPED[name]
    recorded = weight.meta["metrics"][weight.dataset]
    if name == "capsnet_small-mnist":
        monkeypatch.setenv("CAPSNETS_DATA", str(shared_data_root))
        assert main(["evaluate", "--pretrained", name, "--out", str(tmp_path)]) == 0
        report = json.loads((tmp_path / f"evaluation_weights_{name}_mnist.json").read_text())
        assert report["count"] == recorded["test_images"]
        assert abs(report["accuracy"] - recorded["accuracy"]) <= 0.0005, (name, report["accuracy"], recorded)
        assert f"accuracy {100 * report['accuracy']:.2f}% on {report['count']} images" in capsys.readouterr().out
        return
    model = capsnets.create_model(weight.model, pretrained=weight.dataset)
    test = load_dataset(weight.dataset, root=shared_data_root, train=False)
    assert len(test.labels) == recorded["test_images"]
    accuracy = evaluate(model, test)["accuracy"]
    assert abs(accuracy - recorded["accuracy"]) <= 0.0005, (name, accuracy, recorded)


def test_publish_without_the_decoder_keeps_the_scores(tiny_weight, tmp_path):
    model, path = tiny_weight
    out = publish.publish_checkpoint(
        path, command="none", data="digits", out_dir=tmp_path / "out", reconstruction=False
    )
    card = json.loads(out.with_suffix(".json").read_text())
    assert card["model_args"]["reconstruction"] is False and "reconstruction_limits" not in card
    # every builder argument is recorded, so that a change of a default cannot change the shipped model
    assert set(card["model_args"]) == set(capsnets.models.model_schema("capsnet_digits")) - {"device", "dtype"}
    assert card["model_args"]["routing"] == model.routing_spec
    loaded = capsnets.create_model("capsnet_digits", pretrained=str(out))
    bare = capsnets.create_model("capsnet_digits", reconstruction=False)
    assert capsnets.count_parameters(loaded) == capsnets.count_parameters(bare) < capsnets.count_parameters(model)
    reference = model.half().float() if card["card"]["dtype"] == "float16" else model
    images = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(loaded.eval()(images).scores, reference.eval()(images).scores, atol=1e-6)
        assert loaded(images).reconstruction is None


def test_a_weight_records_the_limits_of_its_reconstructions_on_its_whole_training_split(tiny_weight, tmp_path):
    from capsnets.data import load_dataset
    from capsnets.engine import recalibrate_weight
    from capsnets.inference import calibrate_reconstruction

    _, path = tiny_weight
    out = publish.publish_checkpoint(path, command="none", data="digits", out_dir=tmp_path / "out")
    card = json.loads(out.with_suffix(".json").read_text())
    shipped = capsnets.create_model("capsnet_digits", pretrained=str(out))
    train = load_dataset("digits", train=True)
    assert card["reconstruction_limits"] == shipped.checkpoint_meta["reconstruction_limits"]
    assert card["reconstruction_limits"] == calibrate_reconstruction(shipped, train.images)
    assert card["reconstruction_limits"]["images"] == len(train.labels)
    # written again with the limits (as the shipped weights were): the tensors, card and classes kept
    before = capsnets.create_model("capsnet_digits", pretrained=str(out))
    recalibrate_weight(out)
    again = json.loads(out.with_suffix(".json").read_text())
    assert again["reconstruction_limits"] == card["reconstruction_limits"]
    assert again["card"] == card["card"] and again.get("classes") == card.get("classes")
    assert _same_weights(before, capsnets.create_model("capsnet_digits", pretrained=str(out)))


def test_publish_without_the_decoder_refuses_a_model_without_one():
    with pytest.raises(PretrainedError, match="no 'reconstruction' argument"):
        hub.without_decoder(capsnets.create_model("cnn_baseline_narrow"))


# timm and torchvision conventions --------------------------------------------------------------------------------


def test_pretrained_true_loads_the_default_weight_and_false_none():
    default = capsnets.create_model("capsnet_small", pretrained=True)
    assert _same_weights(default, capsnets.create_model("capsnet_small", pretrained="mnist"))
    assert not default.training and default.checkpoint_meta["dataset"] == "mnist"
    only = capsnets.create_model("efficient_capsnet", pretrained=True)  # its one weight
    assert only.checkpoint_meta["model"] == "efficient_capsnet"
    torch.manual_seed(0)
    fresh = capsnets.create_model("capsnet_small", pretrained=False)
    assert fresh.training and not hasattr(fresh, "checkpoint_meta") and not _same_weights(fresh, default)


def test_pretrained_true_for_a_model_without_weights_lists_those_with():
    with pytest.raises(PretrainedError, match="model 'capsnet' has no shipped pretrained weight") as error:
        capsnets.create_model("capsnet", pretrained=True)
    assert "models with weights: capsnet_small, efficient_capsnet, matrix_capsnet_small" in str(error.value)


def test_weights_object_describes_the_weight():
    weights = capsnets.get_weights("capsnet_small-fashion_mnist")
    assert isinstance(weights, Weights) and capsnets.models.get_weights is capsnets.get_weights
    assert (weights.name, weights.model, weights.dataset, weights.default) == (
        "capsnet_small-fashion_mnist",
        "capsnet_small",
        "fashion_mnist",
        False,
    )
    meta = weights.meta
    assert meta["categories"][0] == "T-shirt/top" and len(meta["categories"]) == 10
    assert meta["input_size"] == (1, 28, 28)
    assert meta["normalization"] == {
        "scale": (0.0, 1.0),
        "mean": (0.0,),
        "std": (1.0,),
        "per_image_standardization": False,
    }
    model = capsnets.create_model("capsnet_small", pretrained=weights)
    assert meta["num_params"] == capsnets.count_parameters(model) > 0
    assert meta["metrics"] == {"fashion_mnist": {"accuracy": 0.8874, "test_images": 10000}}
    assert meta["recipe"].startswith("OMP_NUM_THREADS=1 capsnets train --model capsnet_small --dataset fashion_mnist")
    assert model.class_names == meta["categories"]
    assert _same_weights(model, capsnets.create_model("capsnet_small", pretrained="fashion_mnist"))


def test_weights_transforms_prepare_any_image(tmp_path):
    from PIL import Image

    transform = capsnets.get_weights("capsnet_small-mnist").transforms()
    assert isinstance(transform, ImageTransform) and transform.input_size == (1, 28, 28)
    Image.new("L", (56, 56), 255).save(tmp_path / "white.png")  # light background: inverted for MNIST
    inputs = [
        str(tmp_path / "white.png"),
        Image.new("L", (56, 56), 0),
        np.zeros((40, 40), np.uint8),
        torch.zeros(28, 28),
    ]
    for image in inputs:
        tensor = transform(image)
        assert tensor.shape == (1, 28, 28) and tensor.dtype == torch.float32 and tensor.max() == 0


def test_get_model_weights_marks_the_default_first():
    found = capsnets.get_model_weights("capsnet_small")
    assert list(found) == ["capsnet_small-mnist", "capsnet_small-fashion_mnist"]
    assert [w.default for w in found.values()] == [True, False]
    assert capsnets.get_model_weights("capsnet") == {}
    with pytest.raises(ArgumentError, match="Did you mean 'capsnet_small'"):
        capsnets.get_model_weights("capsnet_smal")
    with pytest.raises(PretrainedError, match="shipped: capsnet_small-fashion_mnist, capsnet_small-mnist"):
        capsnets.get_weights("capsnet_small-cifar10")


def test_a_weight_object_of_another_model_is_refused():
    with pytest.raises(PretrainedError, match="'capsnet_small-mnist' is for model 'capsnet_small', not 'efficient"):
        capsnets.create_model("efficient_capsnet", pretrained=capsnets.get_weights("capsnet_small-mnist"))


def test_a_lone_weight_is_the_default_and_norb_data_is_standardised(tmp_path, monkeypatch):
    model = capsnets.create_model("capsnet_digits", input_size=(1, 32, 32), num_classes=5)
    save_pretrained(
        model,
        tmp_path / "capsnet_digits-smallnorb.safetensors",
        dataset="smallnorb",
        card={"test_accuracy": 0.5, "command": "none"},
        classes=["animal", "human", "airplane", "truck", "car"],
    )
    monkeypatch.setattr(pretrained, "WEIGHTS_DIR", tmp_path)
    assert capsnets.list_models(pretrained=True) == ["capsnet_digits"]
    weights = capsnets.get_weights("capsnet_digits-smallnorb")
    assert weights.default and weights.meta["input_size"] == (1, 32, 32)
    assert weights.meta["normalization"]["per_image_standardization"] and weights.meta["normalization"]["mean"] is None
    prepared = weights.transforms()(np.random.default_rng(0).random((96, 96)).astype(np.float32))
    assert (
        prepared.shape == (1, 32, 32)
        and abs(prepared.mean().item()) < 1e-5
        and abs(prepared.std(unbiased=False) - 1) < 1e-4
    )
    loaded = capsnets.create_model("capsnet_digits", pretrained=True)
    assert loaded.class_names == ["animal", "human", "airplane", "truck", "car"] and _same_weights(loaded, model)


def test_get_model_weights_is_a_read_only_mapping_with_torchvision_attributes():
    found = capsnets.get_model_weights("capsnet_small")
    assert isinstance(found, capsnets.models.ModelWeights) and found.model == "capsnet_small"
    mnist, fashion = capsnets.get_weights("capsnet_small-mnist"), capsnets.get_weights("capsnet_small-fashion_mnist")
    assert (
        found.DEFAULT == mnist
        and found.DEFAULT.default
        and capsnets.get_model_weights("efficient_capsnet").DEFAULT.default
    )
    assert (found.MNIST, found.FASHION_MNIST) == (mnist, fashion)
    for key in ("capsnet_small-fashion_mnist", "fashion_mnist", "capsnet_small.fashion_mnist", "FASHION-MNIST"):
        assert found[key] == fashion and key in found and found.get(key) == fashion
    assert len(found) == 2 and list(found) == list(found.keys()) == [
        "capsnet_small-mnist",
        "capsnet_small-fashion_mnist",
    ]
    assert found == {"capsnet_small-mnist": mnist, "capsnet_small-fashion_mnist": fashion}
    assert "cifar10" not in found and found.get("cifar10") is None and not hasattr(found, "CIFAR10")
    with pytest.raises(TypeError):
        found["cifar10"] = mnist
    assert pickle.loads(pickle.dumps(found)) == found and "capsnet_small-mnist" in repr(found)


@pytest.mark.parametrize(
    "lookup, python_error",
    [
        (lambda w: w["cifar10"], KeyError),
        (lambda w: w["efficient_capsnet.mnist"], KeyError),  # another model's weight
        (lambda w: w["efficient_capsnet-mnist"], KeyError),
        (lambda w: w[3], KeyError),
        (lambda w: w.CIFAR10, AttributeError),
    ],
)
def test_an_unknown_weight_of_a_model_names_its_tags(lookup, python_error):
    found = capsnets.get_model_weights("capsnet_small")
    with pytest.raises(
        PretrainedError, match="'capsnet_small' has no shipped weight .*; its tags: mnist, fashion_mnist"
    ):
        lookup(found)
    with pytest.raises(python_error):  # what a mapping and an attribute raise, for `in`, .get() and hasattr()
        lookup(found)


def test_a_lower_case_tag_attribute_says_to_write_it_in_upper_case():
    with pytest.raises(AttributeError, match=r"no attribute 'mnist' \(a tag is an attribute in upper case: .MNIST\)"):
        capsnets.get_model_weights("capsnet_small").mnist  # noqa: B018


def test_a_model_without_weights_has_an_empty_mapping_whose_default_lists_the_models_with_weights():
    empty = capsnets.get_model_weights("capsnet")
    assert empty == {} and len(empty) == 0 and not empty and "mnist" not in empty
    for lookup in (lambda: empty.DEFAULT, lambda: empty["mnist"], lambda: empty.MNIST):
        with pytest.raises(
            PretrainedError, match="model 'capsnet' has no shipped pretrained weight.*models with weights: "
        ):
            lookup()


@pytest.mark.parametrize("name", ["capsnet_small.fashion_mnist", "capsnet_small-fashion_mnist"])
def test_timms_model_dot_tag_names_a_weight_everywhere_a_name_is_taken(name, tmp_path, capsys):
    from PIL import Image

    fashion = capsnets.get_weights("capsnet_small-fashion_mnist")
    assert capsnets.get_weights(name) == fashion
    assert pretrained.resolve_pretrained(name) == pretrained.resolve_pretrained(name, "capsnet_small") == fashion.path
    assert capsnets.create_model("capsnet_small", pretrained=name).checkpoint_meta["dataset"] == "fashion_mnist"
    Image.new("L", (28, 28), 0).save(tmp_path / "blank.png")
    assert main(["predict", str(tmp_path / "blank.png"), "--pretrained", name, "--json", "-"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["model"] == "capsnet_small" and record["predictions"][0]["label"] in fashion.meta["categories"]


def test_every_listed_weight_name_is_taken_back():
    for name in capsnets.list_models(pretrained=True, include_tags=True):
        model, tag = name.split(".")
        weights = capsnets.get_weights(name)
        assert (weights.model, weights.dataset) == (model, tag) and capsnets.get_model_weights(model)[name] == weights


@pytest.mark.parametrize(
    "model, name, error, message",
    [
        (
            "capsnet_small",
            "capsnet_small.cifar10",
            PretrainedError,
            "no shipped pretrained weight 'capsnet_small-cifar10'",
        ),
        (
            "capsnet_small",
            "efficient_capsnet.mnist",
            PretrainedError,
            "is for model 'efficient_capsnet', not 'capsnet_small'",
        ),
        (
            "capsnet_small",
            "efficient_capsnet-mnist",
            PretrainedError,
            "is for model 'efficient_capsnet', not 'capsnet_small'",
        ),
        (None, "weights.pt", PretrainedError, "no shipped pretrained weight 'weights.pt'; shipped: capsnet_small-"),
        ("capsnet_small", 3, ArgumentError, "pretrained must be True, a Weights, a weight's tag or name"),
        ("capsnet_small", ["mnist"], ArgumentError, "got \\['mnist'\\]"),
    ],
)
def test_bad_weight_names_say_what_is_wrong(model, name, error, message):
    with pytest.raises(error, match=message):
        if model is None:
            capsnets.get_weights(name)
        else:
            capsnets.create_model(model, pretrained=name)


def test_get_weights_refuses_what_is_not_a_name():
    with pytest.raises(ArgumentError, match="a weight's name must be a string such as 'capsnet_small-mnist', got 3"):
        capsnets.get_weights(3)


def test_get_model_is_create_model_with_weights():
    assert capsnets.get_model is capsnets.models.get_model
    weights = capsnets.get_model_weights("capsnet_small")
    default = capsnets.create_model("capsnet_small", pretrained=True)
    for given in (weights.DEFAULT, "mnist", "capsnet_small-mnist", "capsnet_small.mnist"):
        model = capsnets.get_model("capsnet_small", weights=given)
        assert not model.training and _same_weights(model, default)
    assert capsnets.get_model("capsnet_small", weights=weights.FASHION_MNIST).class_names[0] == "T-shirt/top"
    untrained = capsnets.get_model("capsnet_small", num_classes=5)
    assert untrained.training and untrained.num_classes == 5 and not hasattr(untrained, "checkpoint_meta")
    with pytest.raises(ArgumentError, match="pretrained must be True, a Weights"):
        capsnets.get_model("capsnet_small", weights=1.5)
    with pytest.raises(PretrainedError, match="no shipped pretrained weight 'capsnet_small-cifar10'"):
        capsnets.get_model("capsnet_small", weights="cifar10")
    with pytest.raises(PretrainedError, match="is for model 'capsnet_small', not 'efficient_capsnet'"):
        capsnets.get_model("efficient_capsnet", weights=weights.DEFAULT)
    with pytest.raises(ArgumentError, match="does not take widht"):
        capsnets.get_model("capsnet_small", widht=5)
    with pytest.raises(ArgumentError, match="unknown model 'capsnet_smal'"):
        capsnets.get_model("capsnet_smal")


def test_weights_transforms_prepare_a_batch():
    transform = capsnets.get_weights("capsnet_small-mnist").transforms()
    batch = transform(torch.zeros(4, 1, 28, 28))
    assert batch.shape == (4, 1, 28, 28)
    model = capsnets.get_model("capsnet_small", weights="mnist")
    with torch.no_grad():
        assert model(transform([torch.zeros(56, 56), np.zeros((28, 28), np.uint8)])).scores.shape == (2, 10)


def test_each_weight_says_how_its_training_images_were_framed():
    framings = {name: weight.meta["framing"] for name, weight in SHIPPED.items()}
    assert framings["capsnet_small-mnist"].startswith("the digit's bounding box scaled to 20x20")
    assert framings["capsnet_small-fashion_mnist"] == "the whole image at 28x28; light strokes on black"
    transform = SHIPPED["capsnet_small-mnist"].transforms()
    page = np.full((120, 160), 220, dtype=np.uint8)
    page[30:90, 100:112] = 30  # a dark "1", off-centre, on paper
    assert int((transform(page)[0] > 0.5).any(1).sum()) == 20  # framed as the card says
