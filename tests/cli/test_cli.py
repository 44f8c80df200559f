"""The ``capsnets`` command line: train, evaluate, reconstruct, list-models, their help, and error messages."""

import json
import re
from pathlib import Path

import pytest
import yaml

from capsnets.cli import build_parser, config_from_args, main, nest_dotted, parse_key_values

from helpers import TINY_TRAIN

TRAIN = [*TINY_TRAIN, "--limit-test", "32", "--model-arg", "routing.iterations=2"]
TRAIN += ["--loss-arg", "reconstruction_weight=0.001"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    assert main([*TRAIN, "--out", str(out)]) == 0
    return out


def test_train_writes_run_directory(run_dir, capsys):
    for name in (
        "metrics.jsonl",
        "summary.json",
        "config.yaml",
        "last.safetensors",
        "last.json",
        "best.safetensors",
        "best.json",
        "training_curves.png",
        "confusion_matrix.png",
        "reconstructions.png",
    ):
        assert (run_dir / name).is_file(), name
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model_args"] == {"routing": {"iterations": 2}, "num_classes": 10, "input_size": [1, 8, 8]}
    assert config["loss_args"] == {"reconstruction_weight": 0.001}
    assert config["progress"] is False and config["limit_train"] == 64


def test_train_prints_summary(tmp_path, capsys, monkeypatch):
    from capsnets.engine import reporting

    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "epochs": 1,
                "batch_size": 32,
                "limit_train": 32,
                "limit_test": 16,
                "device": "cpu",
                "progress": False,
                "model_args": {"routing": {"iterations": 1}},
            }
        )
    )
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"test accuracy \d+\.\d\d% \(best .* chosen on the validation split\)", out)
    assert str(tmp_path / "run") in out
    # --val-fraction 0: no split held out, no best chosen; --no-test-each-epoch: the test split scored at the end
    argv = ["train", "--config", str(config), "--val-fraction", "0", "--no-test-each-epoch"]
    assert main([*argv, "--out", str(tmp_path / "all")]) == 0
    assert "chosen on" not in capsys.readouterr().out
    recorded = yaml.safe_load((tmp_path / "all" / "config.yaml").read_text())
    assert recorded["val_fraction"] == 0 and recorded["test_each_epoch"] is False
    assert json.loads((tmp_path / "all" / "summary.json").read_text())["best_chosen_on"] is None
    # --resume reuses <out>/config.yaml; flags (here --epochs) override it
    assert main(["train", "--resume", "--epochs", "2", "--out", str(tmp_path / "run")]) == 0
    epochs = [json.loads(line)["epoch"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]
    # --time-limit stops after the first epoch past it and says how to go on; --resume with a later limit goes on
    assert main(["train", "--resume", "--epochs", "4", "--time-limit", "1e-9", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert (
        f"stopped by the time limit after epoch 3 of 4; continue with: capsnets train --out {tmp_path / 'run'} "
        "--resume" in out
    )
    assert main(["train", "--resume", "--time-limit", "60", "--out", str(tmp_path / "run")]) == 0
    assert "stopped by the time limit" not in capsys.readouterr().out
    epochs = [json.loads(line)["epoch"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3, 4]


def test_train_never_replaces_a_run_by_accident(tmp_path, capsys, monkeypatch):
    """Running the first command again (instead of adding --resume) is refused, with both ways on; changes that
    make another run are refused on --resume; --overwrite replaces the run."""
    from capsnets.engine import reporting

    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    capsys.readouterr()
    assert main([*TRAIN, "--epochs", "2", "--out", str(run)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("capsnets train: error: run directory") and "--resume" in err and "--overwrite" in err
    assert main(["train", "--resume", "--epochs", "2", "--model-arg", "routing.iterations=3", "--out", str(run)]) == 1
    assert "model_args.routing.iterations 2 -> 3" in capsys.readouterr().err
    assert main(["train", "--resume", "--overwrite", "--out", str(run)]) == 1
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before
    assert main([*TRAIN, "--epochs", "2", "--overwrite", "--out", str(run)]) == 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_interrupted_training_says_how_to_resume(tmp_path, capsys, monkeypatch):
    import capsnets.cli
    import capsnets.engine.trainer as trainer

    def interrupted(config, **kwargs):
        trainer.Trainer(config.replace(epochs=1), **kwargs).fit()
        raise KeyboardInterrupt

    monkeypatch.setattr(capsnets.cli, "train", interrupted)
    monkeypatch.setattr("capsnets.engine.reporting.save_figures", lambda *args, **kwargs: [])
    assert main([*TRAIN, "--epochs", "3", "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert (
        f"the last checkpoint (epoch 1) is kept; continue with: capsnets train --out {tmp_path / 'run'} --resume" in err
    )


def test_evaluate(run_dir, tmp_path, capsys):
    assert main(["evaluate", "--checkpoint", str(run_dir), "--out", str(tmp_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "confusion matrix" in out
    # written elsewhere than the run: named after the run directory and the checkpoint
    report = json.loads((tmp_path / "evaluation_run_best_digits.json").read_text())
    assert len(report["confusion_matrix"]) == 10 and len(report["per_class_accuracy"]) == 10
    assert sum(map(sum, report["confusion_matrix"])) == report["count"] == 360
    assert report["checkpoint"] == str(run_dir / "best.safetensors") and report["epoch"] == 1
    assert (tmp_path / "evaluation_run_best_digits_confusion.png").is_file()


def test_reconstruct(run_dir, tmp_path, capsys):
    checkpoint = run_dir / "last.safetensors"
    assert main(["reconstruct", "--checkpoint", str(checkpoint), "--n", "8", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "reconstructions_run_last.png").is_file()
    assert str(tmp_path / "reconstructions_run_last.png") in capsys.readouterr().out


def test_evaluate_and_reconstruct_never_replace_a_runs_files(run_dir):
    trained = {
        name: (run_dir / name).read_bytes()
        for name in ("reconstructions.png", "confusion_matrix.png", "summary.json", "metrics.jsonl")
    }
    for checkpoint in ("best", "last"):
        path = str(run_dir / f"{checkpoint}.safetensors")
        assert main(["evaluate", "--checkpoint", path, "--device", "cpu"]) == 0  # into the run directory
        assert main(["reconstruct", "--checkpoint", path, "--n", "4", "--device", "cpu"]) == 0
    assert {name: (run_dir / name).read_bytes() for name in trained} == trained
    for checkpoint in ("best", "last"):
        report = json.loads((run_dir / f"evaluation_{checkpoint}_digits.json").read_text())
        assert report["checkpoint"] == str(run_dir / f"{checkpoint}.safetensors")
        assert (run_dir / f"evaluation_{checkpoint}_digits_confusion.png").is_file()
        assert (run_dir / f"reconstructions_{checkpoint}.png").is_file()


def test_list_models(capsys):
    assert main(["list-models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {name: (count, task) for name, count, task in (line.split() for line in lines)}
    assert rows["capsnet"] == ("8,215,568", "classification") and rows["segcaps"] == ("1,425,649", "segmentation")
    assert {"capsnet", "capsnet_small", "capsnet_digits", "cnn_baseline", "unet"} <= set(rows)


def test_list_models_name_lists_its_model_args_with_defaults(capsys):
    from capsnets.models import model_arguments

    assert main(["list-models", "capsnet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "input_size=[1, 28, 28]  # (C, H, W): a list of 3 positive integers" in lines
    assert "reconstruction=true  # true or false" in lines
    defaults = {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in model_arguments("capsnet").items()
        if key not in ("device", "dtype")
    }
    # one KEY=VALUE line per builder argument, each one --model-arg reads back as the default, then the settings of
    # the default routing (routing.KEY=VALUE)
    arguments = [line for line in lines if not line.startswith("routing.")]
    assert parse_key_values(arguments, "--model-arg") == defaults and len(arguments) == len(defaults)
    routing = parse_key_values([line for line in lines if line.startswith("routing.")], "--model-arg")
    assert routing == {"routing.iterations": 3, "routing.detach_routing": True, "routing.none_of_the_above": False}
    assert nest_dotted(routing) == {"routing": {"iterations": 3, "detach_routing": True, "none_of_the_above": False}}
    assert main(["list-models", "capsnet_dgits"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown model 'capsnet_dgits'" in err and "capsnet_digits" in err


def _help(command: str, capsys) -> tuple[list[str], dict[str, str]]:
    """``capsnets COMMAND --help``: the options its usage line names, and {option: its help on one line}."""
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    usage, options = capsys.readouterr().out.split("options:", 1)
    entries, current = {}, None
    for line in options.splitlines():
        match = re.match(r"^  (-\w)?(?:, )?(--[\w-]+)( [\w=.\[\]{},]+(?: \[\w+ \.\.\.\])?)?(?:\s{2,}(.*))?$", line)
        if match:
            current = match.group(2)
            entries[current] = match.group(4) or ""
        elif current and line.startswith("   "):
            entries[current] += " " + line.strip()
    named = re.findall(r"\[(--[\w-]+)|(--[\w-]+) ", usage)
    return [a or b for a, b in named], {option: " ".join(text.split()) for option, text in entries.items()}


def _help_entries(command: str, capsys) -> dict[str, str]:
    return _help(command, capsys)[1]


@pytest.mark.parametrize("command", ["train", "evaluate", "reconstruct"])
def test_help_gives_every_option_with_its_default(command, capsys):
    options, entries = _help(command, capsys)
    assert set(entries) == {*options, "--help"} and len(options) > 3
    for option, help_text in entries.items():
        if option != "--help":
            assert "(default:" in help_text or "no default" in help_text, f"{command} {option}: {help_text!r}"


def test_train_help_states_the_defaults_of_the_config(capsys):
    from capsnets.engine.config import TrainConfig

    entries, default = _help_entries("train", capsys), TrainConfig()
    for option in ("epochs", "seed", "eval_every", "checkpoint_every", "batch_size"):
        assert f"(default: {getattr(default, option)})" in entries["--" + option.replace("_", "-")], option
    assert "(default: the model's training recipe" in entries["--lr"]
    assert "else 0)" in entries["--weight-decay"] and "$CAPSNETS_DATA" in entries["--data-dir"]
    assert "(default: runs/<model>" in entries["--out"] and "list-models MODEL" in entries["--model-arg"]


@pytest.mark.parametrize("command", ["train", "evaluate", "reconstruct"])
def test_dataset_help_lists_the_registered_data_sets(command, capsys):
    from capsnets.data import list_datasets

    listed = re.search(r": (.*?) \(default", _help_entries(command, capsys)["--dataset"]).group(1)
    names, own = listed.split(", or ")
    assert names.split(", ") == list_datasets() and own.startswith("folder:PATH (your own images")


def test_train_takes_the_models_recipe_under_the_flags_and_names_what_it_took(tmp_path):
    from capsnets.cli import _recipe_note

    def config(*argv):
        return config_from_args(build_parser().parse_args(["train", "--out", str(tmp_path / "run"), *argv]))

    plain = config("--model", "matrix_capsnet_small")
    assert (plain.lr, plain.weight_decay, plain.max_shift, plain.loss) == (6e-3, 2e-7, 0, "spread")
    assert (plain.lr_schedule, plain.loss_args["ramp_epochs"]) == ("cosine", 10)
    note = _recipe_note(plain)
    assert note.startswith("matrix_capsnet_small trains with its recipe: lr=0.006, lr_schedule=cosine, ")
    decayed = config("--model", "matrix_capsnet_small", "--lr-decay", "0.6")  # a decay asks for its schedule
    assert (decayed.lr_schedule, decayed.lr_decay) == ("exponential", 0.6)
    with pytest.raises(ValueError, match="--lr-decay sets the exponential schedule's"):
        config("--model", "matrix_capsnet_small", "--lr-schedule", "cosine", "--lr-decay", "0.6")
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump({"model": "matrix_capsnet_small", "weight_decay": 0.0, "lr": 0.005}))
    changed = config("--config", str(file), "--lr", "0.01", "--loss", "margin")
    assert (changed.lr, changed.weight_decay, changed.max_shift, changed.loss_args) == (0.01, 0.0, 0, {})
    note = _recipe_note(changed)
    assert "max_shift=0" in note and "lr=" not in note.replace("lr_decay", "") and "loss" not in note
    assert _recipe_note(config("--model", "capsnet_small")) is None


def test_run_directory_follows_the_model(tmp_path, monkeypatch):
    def config(*argv):
        return config_from_args(build_parser().parse_args(["train", *argv]))

    monkeypatch.chdir(tmp_path)
    assert config().out == "runs/capsnet_digits"
    assert config("--model", "capsnet_small").out == "runs/capsnet_small"
    assert config("--model", "capsnet_small", "--out", "elsewhere").out == "elsewhere"
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump({"model": "cnn_baseline"}))
    assert config("--config", str(file)).out == "runs/cnn_baseline"
    file.write_text(yaml.safe_dump({"model": "cnn_baseline", "out": "mine"}))
    assert config("--config", str(file)).out == "mine"
    # --resume without --out continues the model's default run directory, with its config.yaml
    (tmp_path / "runs" / "capsnet_small").mkdir(parents=True)
    (tmp_path / "runs" / "capsnet_small" / "config.yaml").write_text(
        yaml.safe_dump({"model": "capsnet_small", "epochs": 7})
    )
    assert config("--resume", "--model", "capsnet_small").epochs == 7


def test_corrupt_checkpoint_is_one_line_error(run_dir, tmp_path, capsys):
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes((run_dir / "last.safetensors").read_bytes()[:64])
    (tmp_path / "broken.json").write_text((run_dir / "last.json").read_text())
    assert main(["evaluate", "--checkpoint", str(broken)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "broken.safetensors" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--model", "no_such_model", "--epochs", "1"], "unknown model"),
        (["train", "--epochs", "0"], "epochs=0"),
        (["train", "--model-arg", "routing.iterations"], "KEY=VALUE"),
        (["evaluate", "--checkpoint", "/nonexistent/run"], "does not exist"),
    ],
)
def test_errors_exit_non_zero_with_one_line(argv, message, capsys, tmp_path):
    assert main([*argv, *(["--out", str(tmp_path)] if argv[0] == "train" else [])]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_bad_flag_type_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--epochs", "three"])
    assert exit_info.value.code == 2


def test_parse_key_values():
    assert parse_key_values(["a=1", "b=[1, 8, 8]", "c=true", "d=x"], "--model-arg") == {
        "a": 1,
        "b": [1, 8, 8],
        "c": True,
        "d": "x",
    }


def test_python_dash_m(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "capsnets", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "list-models" in done.stdout


def test_the_allocator_is_left_alone_unless_asked(monkeypatch, capsys):
    """The command changes glibc's malloc settings (a process-wide change) only with --retain-freed-memory or
    CAPSNETS_RETAIN_FREED_MEMORY=1."""
    import capsnets.cli

    calls = []
    monkeypatch.setattr(capsnets.cli, "retain_freed_memory", lambda: calls.append(True) or True)
    monkeypatch.delenv("CAPSNETS_RETAIN_FREED_MEMORY", raising=False)
    assert main(["list-models", "--pretrained"]) == 0 and calls == []
    assert main(["--retain-freed-memory", "list-models", "--pretrained"]) == 0 and calls == [True]
    monkeypatch.setenv("CAPSNETS_RETAIN_FREED_MEMORY", "1")
    assert main(["list-models", "--pretrained"]) == 0 and calls == [True, True]
    assert "--retain-freed-memory" in capsnets.cli.build_parser().format_help()


def test_segmentation_end_to_end_train_evaluate_predict(tmp_path, capsys):
    """``segfolder:PATH`` with colour masks: train, evaluate and predict through the command line; the predicted
    masks are written in the training masks' colours, with overlays."""
    import numpy as np
    from PIL import Image

    folder = tmp_path / "shapes"
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    rng = np.random.default_rng(0)
    for k in range(12):
        image, mask = np.zeros((16, 16, 3), np.uint8), np.zeros((16, 16, 3), np.uint8)
        y, x = rng.integers(0, 10, 2)
        image[y : y + 6, x : x + 6], mask[y : y + 6, x : x + 6] = (200, 200, 40), (0, 128, 0)
        Image.fromarray(image).save(folder / "images" / f"{k}.jpg")
        Image.fromarray(mask).save(folder / "masks" / f"{k}.png")
    run = tmp_path / "run"
    train = ["train", "--model", "unet_small", "--dataset", f"segfolder:{folder}", "--epochs", "1"]
    assert main([*train, "--batch-size", "4", "--device", "cpu", "--no-progress", "--out", str(run)]) == 0
    assert "test mean Dice" in capsys.readouterr().out
    assert main(["evaluate", "--checkpoint", str(run), "--device", "cpu"]) == 0
    report = json.loads((run / "evaluation_best_segfolder_shapes.json").read_text())
    assert list(report["dice"]) == ["#000000", "#008000"] and 0 <= report["mean_dice"] <= 1
    assert "mean Dice" in capsys.readouterr().out
    out = tmp_path / "masks"
    images = [str(folder / "images" / "0.jpg"), str(folder / "images" / "1.jpg")]
    assert main(["predict", *images, "--checkpoint", str(run), "--out", str(out), "--json", "-"]) == 0
    predictions = json.loads(capsys.readouterr().out)["predictions"]
    assert [Path(p["mask"]).name for p in predictions] == ["0_mask.png", "1_mask.png"]
    assert set(predictions[0]["areas"]) == {"#000000", "#008000"}
    mask, overlay = Image.open(out / "0_mask.png"), Image.open(out / "0_overlay.png")
    assert mask.mode == "RGB" and mask.size == overlay.size == (16, 16)
    assert {tuple(c) for c in np.asarray(mask).reshape(-1, 3)} <= {(0, 0, 0), (0, 128, 0)}
