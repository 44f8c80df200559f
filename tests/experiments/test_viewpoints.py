"""The ``viewpoints`` experiment: split selection on the info fields, the rematch of the CNN, smoke runs."""

from dataclasses import replace

import pytest

from capsnets.cli import main
from capsnets.data import TensorData
from capsnets.experiments import Runs, list_experiments, run_experiment, viewpoints
from capsnets.experiments.report.viewpoints import STOPPED, matched_summary, viewpoint_results_table
from capsnets.experiments.viewpoints import build_model, matching
from capsnets.experiments.views import AZIMUTH_FAMILIAR, ELEVATION_FAMILIAR, load_norb_like, viewpoint_split
from capsnets.models import count_parameters, training_recipe

from helpers import assert_contrasts_resolve

NOVEL_AZIMUTHS = set(range(6, 29, 2))  # 60 .. 280 degrees


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("viewpoints_data")  # no smallnorb/ inside: the rendered set is used


@pytest.fixture(scope="module")
def rendered(data_root):
    """A reduced grid of the offline set (1 toy per class and split, 1 lighting), as the smoke run renders it."""
    return load_norb_like(data_root, "cpu", render_instances=1, render_lightings=[0])


def _views(data: TensorData, key: str) -> set[int]:
    return set(data.info[key].tolist())


@pytest.mark.parametrize("split", ["azimuth", "elevation"])
def test_split_selection_on_info_fields(rendered, split):
    train, test, source = rendered
    assert "rendered viewpoint set" in source
    views = viewpoint_split(train, test, split)
    if split == "azimuth":
        assert _views(views["train"], "azimuth") == _views(views["familiar"], "azimuth") == set(AZIMUTH_FAMILIAR)
        assert _views(views["novel"], "azimuth") == NOVEL_AZIMUTHS
        for part in views.values():  # every elevation is in every part of the azimuth split
            assert _views(part, "elevation") == set(range(9))
    else:
        assert _views(views["train"], "elevation") == _views(views["familiar"], "elevation") == set(ELEVATION_FAMILIAR)
        assert _views(views["novel"], "elevation") == set(range(3, 9))
        for part in views.values():
            assert _views(part, "azimuth") == set(range(0, 35, 2))
    assert len(views["train"]) * 3 == len(train)
    assert len(views["familiar"]) + len(views["novel"]) == len(test)
    assert len(views["novel"]) == 2 * len(views["familiar"])
    test_toys = _views(views["familiar"], "instance") | _views(views["novel"], "instance")
    assert test_toys and not _views(views["train"], "instance") & test_toys
    assert set(views["train"].labels.tolist()) == set(views["novel"].labels.tolist()) == set(range(5))
    assert views["train"].augment is not None and views["train"].images.shape[-1] == 48
    assert views["novel"].images.shape[1:] == (1, 32, 32)


def test_cnn_is_stopped_at_the_capsule_models_error_when_that_falls_short(rendered, monkeypatch, tmp_path):
    """A capsule model that never reaches the CNN's familiar-view error (faked here at 100% error) gets a
    second CNN stopped at its error; the report names the matched pair."""
    real = matching.fit_matched

    def fake_for_capsules(runs, key, model, views, **kwargs):
        if model.model_name != "matrix_capsnet_small":
            return real(runs, key, model, views, **kwargs)
        record = {"epoch": 1, "step": 1, "loss": 1.0, "familiar_error": 1.0, "novel_error": 0.9}
        return {"history": [record], "epoch": 1, "familiar_error": 1.0, "novel_error": 0.9, "reached": False}

    monkeypatch.setattr(matching, "fit_matched", fake_for_capsules)
    train, test, _ = rendered
    settings = replace(viewpoints.Settings.smoke(), train_size=96, test_size=16)
    result = matching.compare("elevation", train, test, settings, tag="t", device="cpu", seed=0, runs=Runs(tmp_path))
    stopped = result["records"][STOPPED]
    assert stopped["reached"] and stopped["familiar_error"] <= 1.0
    assert len(stopped["history"]) == 1 and stopped["epoch"] == 1  # its first epoch
    (run,) = tmp_path.glob("t_elevation_cnn_smallnorb_narrow_stopped_at_1.0000_*")
    assert (run / "last.safetensors").is_file()
    summary = matched_summary({"elevation": result["records"]}, fixed_target=False)
    assert "novel-view error **90.00% (capsules) vs" in summary and "(CNN, stopped)" in summary
    table = viewpoint_results_table(
        {"elevation": result["records"]},
        {"elevation": 0.5},
        {"CNN": "c", "capsules": "m", STOPPED: "c"},
        fixed_target=False,
    )
    chosen = [row.split("|")[8].strip() for row in table.splitlines()[2:]]  # the "chosen epoch" column
    assert chosen[1:] == ["1", "1"]  # capsules at epoch 1, the stopped CNN at its first
    without = matching.compare(
        "elevation",
        train,
        test,
        replace(settings, rematch_cnn=False),
        tag="t",
        device="cpu",
        seed=0,
        runs=Runs(tmp_path / "without"),
    )
    assert viewpoints.STOPPED not in without["records"]
    assert "no matched pair" in matched_summary({"elevation": without["records"]}, fixed_target=False)


@pytest.mark.parametrize("capsule_recipe", [{}, {"lr": 5e-3, "loss_args": {"margin_end": 0.8}}])
def test_capsule_model_trains_with_its_recipe_and_the_cnn_with_lr(rendered, monkeypatch, capsule_recipe):
    """The capsule model trains with its registered recipe, ``capsule_recipe`` overriding it field by field
    (loss arguments key by key); the CNN (and the CNN stopped at the capsule model's error) keep ``lr`` and
    ``lr_decay`` with their default loss."""
    seen = {}

    def fake(runs, key, model, views, **kwargs):
        seen.setdefault(model.model_name, []).append(kwargs)
        reached = model.model_name != "matrix_capsnet_small"  # forces the rematch of the CNN
        return {"history": [], "epoch": 1, "familiar_error": 0.5, "novel_error": 0.6, "reached": reached}

    monkeypatch.setattr(matching, "fit_matched", fake)
    train, test, _ = rendered
    settings = replace(viewpoints.Settings.smoke(), train_size=16, test_size=8, capsule_recipe=capsule_recipe)
    matching.compare("azimuth", train, test, settings, tag="t", device="cpu", seed=0, runs=Runs(None))
    recipe = training_recipe("matrix_capsnet_small")
    (caps,) = seen["matrix_capsnet_small"]
    assert caps["lr"] == capsule_recipe.get("lr", matching.MATCHED_LR)  # the recipe's cosine needs a planned length
    assert (caps["lr_decay"], caps["weight_decay"], caps["recipe"]["loss"]) == (
        recipe["lr_decay"],
        recipe["weight_decay"],
        recipe["loss"],
    )
    loss_args = {**recipe["loss_args"], **capsule_recipe.get("loss_args", {})}
    assert caps["recipe"]["loss_args"] == loss_args and caps["loss"].margin_end == loss_args["margin_end"]
    for cnn in seen["cnn_smallnorb_narrow"]:
        assert (cnn["lr"], cnn["lr_decay"]) == (settings.lr, settings.lr_decay)
        assert (
            cnn["weight_decay"] == 0.0 and cnn["recipe"]["loss"] == "cross_entropy" and not cnn["recipe"]["loss_args"]
        )
    assert len(seen["cnn_smallnorb_narrow"]) == 2


def test_capsule_recipe_names_only_what_the_training_takes():
    with pytest.raises(ValueError, match=r"capsule_recipe takes the fields .*'max_shift'"):
        viewpoints.Settings(capsule_recipe={"max_shift": 2})
    # a loss other than the recipe's drops the recipe's loss arguments
    other = matching.capsule_training(viewpoints.Settings(capsule_recipe={"loss": "margin"}))
    assert (other["loss"], other["loss_args"]) == ("margin", {})


def test_full_cnn_is_the_papers_size():
    assert count_parameters(build_model("cnn_smallnorb", "cpu")) == 4_252_549  # the paper's "4.2M"
    assert abs(count_parameters(build_model("cnn_smallnorb_narrow", "cpu")) - 67_154) < 5_000  # ~ matrix_capsnet_small


SIZES = {"train_size": 16, "test_size": 8}


@pytest.fixture(scope="module")
def both_splits(data_root, tmp_path_factory):
    """The smoke run on both splits, once for the tests of this module: its folder and result."""
    out = tmp_path_factory.mktemp("both_splits")
    return out, run_experiment("viewpoints", out, smoke=True, device="cpu", data_dir=str(data_root), **SIZES)


def test_smoke_run_writes_the_report(both_splits):
    assert "viewpoints" in list_experiments()
    tmp_path, result = both_splits
    text = result.report.read_text()
    assert "offline rendered viewpoint set" in text and "13.50%" in text and "17.80%" in text
    assert "Matched comparison" in text
    matched = [split for split in ("azimuth", "elevation") if f"{split}_matched_CNN_novel_error" in result.metrics]
    assert_contrasts_resolve("viewpoints", result.metrics, 2 * len(matched))
    assert "| azimuth | capsules | matrix_capsnet_small |" in text
    assert "| elevation | CNN | cnn_smallnorb_narrow |" in text
    assert {p.name for p in tmp_path.glob("*.png")} == {"examples.png", "error_curves.png"}
    errors = {k: v for k, v in result.metrics.items() if k.endswith("_error") and "_matched_" not in k}
    # familiar and novel error of the CNN and the capsules on both splits, plus the stopped CNN's where the
    # capsule model did not reach the CNN's familiar-view error (which the smoke sizes leave to chance)
    stopped = {k for k in errors if "stopped" in k.lower()}
    assert len(errors) - len(stopped) == 8 and len(stopped) in (0, 2, 4), sorted(errors)
    assert all(0 <= e <= 1 for e in errors.values())


def test_smoke_through_the_cli(data_root, tmp_path, capsys):
    argv = [
        "experiment",
        "viewpoints",
        "--smoke",
        "--out",
        str(tmp_path),
        "--device",
        "cpu",
        "--data-dir",
        str(data_root),
        "--set",
        "train_size=16",
        "--set",
        "test_size=8",
        "--set",
        "splits=[elevation]",
    ]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "report.md").is_file() and len(list(tmp_path.glob("*.png"))) == 2


def test_a_one_split_run_trains_what_a_two_split_run_does(data_root, tmp_path, both_splits):
    both = both_splits[1]
    alone = run_experiment(
        "viewpoints", tmp_path, smoke=True, device="cpu", data_dir=str(data_root), splits=["elevation"], **SIZES
    )
    elevation = {k: v for k, v in both.metrics.items() if k.startswith("elevation_")}
    assert elevation and elevation == {k: v for k, v in alone.metrics.items() if k.startswith("elevation_")}


def test_rejects_unknown_options_and_splits(tmp_path):
    with pytest.raises(ValueError, match="does not take"):
        run_experiment("viewpoints", tmp_path, smoke=True, device="cpu", epoch=1)
    with pytest.raises(ValueError, match="splits"):
        run_experiment("viewpoints", tmp_path, smoke=True, device="cpu", splits=["lighting"])
