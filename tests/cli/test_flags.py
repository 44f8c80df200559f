"""The ``capsnets`` command line's own conventions: ``--version``, "did you mean" for commands and options, hints
that name only the flags of the command that prints them, and the ways every command takes a model
(``--checkpoint``, ``--pretrained`` with ``--sha256``)."""

import re

import pytest

from capsnets import __version__
from capsnets.cli import build_parser, command_parsers, main
from capsnets.engine import TrainConfig
from capsnets.models.pretrained import get_weights

from helpers import TINY_TRAIN

SHIPPED = "capsnet_small-mnist"


def _options(command: str) -> set[str]:
    return {option for option in command_parsers(build_parser())[command]._option_string_actions}


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"capsnets {__version__} (torch ")


def test_a_misspelt_command_gets_a_suggestion(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["trian", "--epochs", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown command 'trian' (did you mean 'train'?)" in err and "usage: capsnets " in err


@pytest.mark.parametrize("command", sorted(command_parsers(build_parser())))
def test_a_misspelt_option_gets_a_suggestion_with_the_commands_usage(command, capsys):
    """Every command refuses an unknown option with its own usage (not the top-level one) and the closest option."""
    known = sorted(option for option in _options(command) if option.startswith("--") and option != "--help")
    misspelt = known[0].replace("-", "", 1) + "x"  # e.g. --checkpoint -> -checkpointx: no known option's prefix
    misspelt = "--" + misspelt.lstrip("-")
    with pytest.raises(SystemExit) as exit_:
        main([command, misspelt, "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: capsnets {command} ")
    assert f"capsnets {command}: error: unrecognized argument: {misspelt}; did you mean {known[0]}?" in err


def test_batchsize_suggests_batch_size(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--batchsize", "16"])
    assert "did you mean --batch-size?" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # before argparse's own check of a missing required option
        main(["evaluate", "--chekpoint", "runs/x"])
    assert "did you mean --checkpoint?" in capsys.readouterr().err


def _flags_named(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


MISSING_DATA = {
    "train": ["train", "--model", "capsnet_small", "--dataset", "mnist", "--device", "cpu"],
    "evaluate": ["evaluate", "--pretrained", SHIPPED, "--device", "cpu"],
    "reconstruct": ["reconstruct", "--pretrained", SHIPPED, "--device", "cpu"],
    "experiment": ["experiment", "dimensions", "--smoke", "--device", "cpu"],
}


@pytest.mark.parametrize("command", sorted(MISSING_DATA))
def test_the_missing_data_hint_names_only_the_commands_flags(command, tmp_path, capsys):
    argv = [*MISSING_DATA[command], "--data-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"capsnets {command}: error: MNIST: missing" in err
    named = _flags_named(err)
    assert "--data-dir" in named
    assert named <= _options(command), f"{command} has no {sorted(named - _options(command))}"


@pytest.mark.parametrize("command", ["evaluate", "reconstruct", "export", "predict", "demo"])
def test_every_command_that_reads_a_model_takes_pretrained_and_sha256(command):
    assert {"--checkpoint", "--pretrained", "--sha256"} <= _options(command)
    if command in ("evaluate", "reconstruct"):
        assert {"--dataset", "--data-dir", "--download"} <= _options(command)


def test_reconstruct_and_export_from_a_shipped_weight(tmp_path, capsys):
    assert main(["reconstruct", "--pretrained", SHIPPED, "--n", "2", "--out", str(tmp_path), "--device", "cpu"]) == 0
    assert (tmp_path / f"reconstructions_weights_{SHIPPED}.png").is_file()
    out = tmp_path / "model.pt2"
    assert main(["export", "--pretrained", SHIPPED, "--format", "torch_export", "--out", str(out)]) == 0
    assert out.is_file()


@pytest.mark.parametrize("command", ["export", "reconstruct", "evaluate"])
def test_a_shipped_weight_given_to_checkpoint_points_to_pretrained(command, tmp_path, capsys, monkeypatch):
    assert get_weights(SHIPPED).name == SHIPPED
    monkeypatch.chdir(tmp_path)
    assert main([command, "--checkpoint", SHIPPED]) == 1
    err = capsys.readouterr().err
    assert f"is a pretrained weight shipped with the package, so use --pretrained {SHIPPED}" in err
    assert "does not exist" not in err


def test_a_url_needs_sha256_named_as_the_flag(capsys):
    assert main(["export", "--pretrained", "https://example.org/w.safetensors"]) == 1
    err = capsys.readouterr().err
    assert "add --sha256 HEX" in err and "sha256=" not in err
    assert main(["demo", "--pretrained", "https://example.org/w.safetensors", "--port", "0"]) == 1
    assert "add --sha256 HEX" in capsys.readouterr().err
    assert main(["evaluate", "--pretrained", "https://example.org/w.safetensors", "--sha256", "abc"]) == 1
    assert "--sha256 'abc' is not a SHA-256: give its 64 hex digits" in capsys.readouterr().err


def test_sha256_is_checked_for_a_file(tmp_path, capsys):
    weight = get_weights(SHIPPED).path
    assert main(["export", "--pretrained", str(weight), "--sha256", "0" * 64, "--out", str(tmp_path / "m.pt2")]) == 1
    assert "expected " + "0" * 64 in capsys.readouterr().err


TINY = [*TINY_TRAIN, "--limit-test", "32", "--model-arg", "routing.iterations=1"]


@pytest.fixture
def restore_threads():
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_on_a_busy_machine_are_noted_recorded_and_kept_by_resume(
    tmp_path, capsys, caplog, monkeypatch, restore_threads
):
    import torch
    import yaml

    import capsnets.cli
    import capsnets.engine.tasks.classification as tasks  # the trainer evaluates through its task

    seen = []
    evaluate = tasks.evaluate
    monkeypatch.setattr(tasks, "evaluate", lambda *a, **k: seen.append(torch.get_num_threads()) or evaluate(*a, **k))
    monkeypatch.setattr("capsnets.engine.reporting.save_figures", lambda *args, **kwargs: [])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    monkeypatch.setattr(capsnets.cli, "machine_load", lambda: (2, 1.7))  # busy: one core free
    run = tmp_path / "run"
    assert main([*TINY, "--out", str(run)]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "machine's load" in line]
    assert len(notes) == 1 and "1 core free" in notes[0] and "instead of 2" in notes[0]
    assert yaml.safe_load((run / "config.yaml").read_text())["threads"] == 1 and set(seen) == {1}
    # resumed on a quiet machine: the recorded count, no note
    torch.set_num_threads(2)
    monkeypatch.setattr(capsnets.cli, "machine_load", lambda: (2, 0.0))
    assert main(["train", "--resume", "--epochs", "2", "--out", str(run)]) == 0
    assert "machine's load" not in capsys.readouterr().err and set(seen) == {1}
    # --threads is obeyed, and recorded as a change of the run
    assert main(["train", "--resume", "--epochs", "3", "--threads", "2", "--out", str(run)]) == 0
    assert "resuming with threads 2 (was 1)" in caplog.text and seen[-1] == 2
    assert yaml.safe_load((run / "config.yaml").read_text())["threads"] == 2


def test_omp_num_threads_is_obeyed_and_recorded(tmp_path, capsys, monkeypatch, restore_threads):
    import torch
    import yaml

    import capsnets.cli

    monkeypatch.setattr("capsnets.engine.reporting.save_figures", lambda *args, **kwargs: [])
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    monkeypatch.setattr(capsnets.cli, "machine_load", lambda: (2, 1.9))
    assert main([*TINY, "--out", str(tmp_path / "run")]) == 0
    assert "machine's load" not in capsys.readouterr().err
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["threads"] == 2


@pytest.mark.parametrize("command", ["train", "evaluate", "reconstruct", "predict", "experiment"])
def test_commands_that_run_models_take_threads(command):
    assert "--threads" in _options(command)


def test_thread_counts_are_bounded(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--model", "capsnet_digits", "--dataset", "digits", "--threads", "100000"])
    assert exit_info.value.code == 2
    assert "100000 threads is more than 1024" in capsys.readouterr().err
    with pytest.raises(ValueError, match="threads"):
        TrainConfig(model="capsnet_digits", dataset="digits", threads=100_000)


def test_no_figures_trains_without_drawing_and_says_so(tmp_path, capsys):
    import yaml

    run = tmp_path / "run"
    assert main([*TINY, "--no-figures", "--out", str(run)]) == 0
    assert "figures: none" in capsys.readouterr().out and not list(run.glob("*.png"))
    assert yaml.safe_load((run / "config.yaml").read_text())["figures"] is False


@pytest.mark.parametrize("command", sorted(command_parsers(build_parser())))
def test_a_prefix_of_an_option_is_not_taken_for_it(command, capsys):
    """No abbreviations (argparse's allow_abbrev): ``--epoch 2`` is not silently ``--epochs 2``."""
    options = _options(command)
    option = min(o for o in options if o.startswith("--") and len(o) > 5 and o[:-1] not in options)
    with pytest.raises(SystemExit) as exit_:
        main([command, option[:-1], "1"])
    assert exit_.value.code == 2
    assert f"unrecognized argument: {option[:-1]}; did you mean {option}?" in capsys.readouterr().err


def test_a_misspelt_routing_key_gets_a_suggestion(tmp_path, capsys):
    argv = ["train", "--model", "capsnet_digits", "--dataset", "digits", "--out", str(tmp_path / "run")]
    assert main([*argv, "--model-arg", "routing.iteration=2"]) == 1
    assert "does not take routing.iteration (did you mean routing.iterations?)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # a failed train leaves nothing it created


def test_train_from_a_weight_that_is_not_there_says_which_exist_and_leaves_nothing(tmp_path, capsys):
    argv = ["train", "--model", "capsnet_digits", "--dataset", "digits", "--out", str(tmp_path / "run")]
    assert main([*argv, "--pretrained", "capsnet_digits-cifar10", "--classifier-only-epochs", "1"]) == 1
    err = capsys.readouterr().err
    assert "no shipped pretrained weight 'capsnet_digits-cifar10'" in err and "capsnet_small-mnist" in err
    assert not (tmp_path / "run").exists()
    assert main([*argv, "--classifier-only-epochs", "-1"]) == 1
    assert "classifier_only_epochs" in capsys.readouterr().err
