"""TrainConfig: defaults, file + override merging, validation, saving."""

import json

import pytest
import yaml

from capsnets.engine.config import TrainConfig, build_config, read_config_file
from capsnets.losses import create_loss
from capsnets.models import list_models, training_recipe


def test_file_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump({"epochs": 3, "lr": 0.01, "model_args": {"routing": {"type": "dynamic", "iterations": 1}}})
    )
    config = build_config(
        path, epochs=5, model_args={"reconstruction": False, "routing": {"detach_routing": False}}, seed=None
    )
    assert config.epochs == 5 and config.lr == 0.01 and config.seed == 0
    assert config.model_args == {
        "routing": {"type": "dynamic", "iterations": 1, "detach_routing": False},
        "reconstruction": False,
    }


def test_json_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"batch_size": 32, "amp": "off"}))
    config = build_config(path)
    assert (config.batch_size, config.amp) == (32, "off")


def test_unknown_key_names_key_and_valid_keys(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("epochz: 3\n")
    with pytest.raises(ValueError, match=r"epochz \(did you mean epochs\?\); it takes: .*model, model_args"):
        build_config(path)


@pytest.mark.parametrize(
    "key, value",
    [
        ("epochs", 0),
        ("lr", -1.0),
        ("lr_decay", 1.5),
        ("amp", "fp8"),
        ("limit_train", 0),
        ("batch_size", 2.5),
        ("image_size", 0),
        ("image_size", [32]),
        ("image_size", True),
    ],
)
def test_bad_values_name_the_field(key, value):
    with pytest.raises(ValueError, match=f"{key}="):
        TrainConfig(**{key: value})


def test_image_size_takes_a_side_or_a_pair():
    assert TrainConfig(image_size=32).image_size == 32 and TrainConfig(image_size=[24, 32]).image_size == [24, 32]
    assert TrainConfig().image_size is None


def test_bad_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_config_file(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        read_config_file(tmp_path / "list.yaml")


def test_save_round_trip(tmp_path):
    config = TrainConfig(epochs=2, model_args={"input_size": (1, 8, 8)}, limit_test=10)
    config.save(tmp_path / "config.yaml")
    again = build_config(tmp_path / "config.yaml")
    assert again.to_dict() == config.to_dict()
    assert again.model_args["input_size"] == [1, 8, 8]


def test_max_shift_default_depends_on_image_size():
    assert TrainConfig().resolved_max_shift(8) == 0
    assert TrainConfig().resolved_max_shift(28) == 2
    assert TrainConfig(max_shift=1).resolved_max_shift(8) == 1


def test_exponent_floats_without_a_dot_are_floats(tmp_path):
    """YAML 1.1 reads ``1e-3`` as a string; configs and --set read it as the float everyone means."""
    from capsnets.cli import parse_key_values

    path = tmp_path / "c.yaml"
    path.write_text("lr: 1e-3\nweight_decay: 5E-4\nepochs: 2\nout: 1e3x\n")
    assert read_config_file(path) == {"lr": 0.001, "weight_decay": 0.0005, "epochs": 2, "out": "1e3x"}
    assert build_config(path).lr == 0.001
    assert parse_key_values(["a=1e-9", "b=-2E+3", "c=1.5", "d=7", "e=[1e-2, 3]", "f=name"], "--set") == {
        "a": 1e-9,
        "b": -2000.0,
        "c": 1.5,
        "d": 7,
        "e": [0.01, 3],
        "f": "name",
    }


@pytest.fixture
def recipe(monkeypatch):
    """``capsnet_small`` registered with a recipe for the duration of a test."""
    from capsnets.models import registry

    values = {"lr": 0.02, "weight_decay": 1e-4, "max_shift": 0, "loss": "spread", "loss_args": {"ramp_epochs": 10}}
    monkeypatch.setitem(registry._RECIPES, "capsnet_small", values)
    return values


def test_recipe_fills_what_the_user_leaves_unset(recipe):
    config = TrainConfig(model="capsnet_small")
    assert (config.lr, config.weight_decay, config.max_shift, config.lr_decay) == (0.02, 1e-4, 0, 0.96)
    assert (config.loss, config.loss_args) == ("spread", {"ramp_epochs": 10})
    assert TrainConfig(model="capsnet_digits").lr == 1e-3  # no recipe: the defaults


def test_the_learning_rate_schedule_comes_from_a_decay_then_the_recipe_then_the_defaults(recipe):
    assert (TrainConfig(model="capsnet_small").lr_schedule, TrainConfig().lr_schedule) == ("exponential",) * 2
    recipe.update(lr_schedule="cosine", lr_decay=0.99)
    assert (TrainConfig(model="capsnet_small").lr_schedule, TrainConfig(model="capsnet_small").lr_decay) == (
        "cosine",
        0.99,
    )
    # a decay given without a schedule asks for the per-epoch decay (and an old run's config.yaml reads the same)
    given = TrainConfig(model="capsnet_small", lr_decay=0.5)
    assert (given.lr_schedule, given.lr_decay) == ("exponential", 0.5)
    with pytest.raises(ValueError, match="lr_schedule='linear' is invalid: expected one of"):
        TrainConfig(lr_schedule="linear")


def test_recipe_sits_between_defaults_and_the_config_file(recipe, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": "capsnet_small", "lr": 0.005, "loss_args": {"margin_end": 0.5}}))
    config = build_config(path, weight_decay=0.0)
    assert (config.lr, config.weight_decay, config.max_shift) == (0.005, 0.0, 0)
    assert config.loss_args == {"ramp_epochs": 10, "margin_end": 0.5}  # key by key over the recipe's
    assert build_config(path, lr=0.1).lr == 0.1  # a flag over the file


def test_recipe_loss_args_follow_only_its_loss(recipe):
    config = TrainConfig(model="capsnet_small", loss="margin")
    assert config.loss_args == {}
    assert TrainConfig(model="capsnet_small", loss="spread", loss_args={"margin_end": 0.5}).loss_args == {
        "ramp_epochs": 10,
        "margin_end": 0.5,
    }


def test_a_recorded_config_is_rebuilt_as_it_was(recipe):
    config = TrainConfig(model="capsnet_small", lr=0.004)
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert build_config(config.to_dict()) == config


@pytest.mark.parametrize("name", [name for name in list_models() if training_recipe(name)])
def test_every_recipe_is_a_valid_config(name):
    recipe = training_recipe(name)
    config = TrainConfig(model=name)
    assert {key: getattr(config, key) for key in recipe if key != "loss_args"} == {
        key: value for key, value in recipe.items() if key != "loss_args"
    }
    assert "loss_args" not in recipe or "loss" in recipe, "a recipe with loss arguments names its loss"
    create_loss(config.loss or "margin", **config.loss_args)
