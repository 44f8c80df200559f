"""Multi-seed runs: one run per seed in its own folder, and a summary whose statistics are right."""

import json
import math
from dataclasses import dataclass

import pytest

from capsnets.cli import main
from capsnets.experiments import (
    ExperimentSettings,
    register_experiment,
    run_experiment_seeds,
    summarise_seeds,
    write_report,
)
from capsnets.experiments.common import _EXPERIMENTS

CALLS = []


def _fake_contrasts(metrics):
    return [
        ("A - B, accuracy", "A_acc", "B_acc"),
        ("not there", "A_acc", "missing"),
        ("A - B, decibels", "A_db", "B_db"),
    ]


@pytest.fixture
def fake_experiment():
    """A registered experiment whose metrics depend on the seed (and record how it was called)."""
    CALLS.clear()

    @dataclass(frozen=True)
    class Settings(ExperimentSettings):
        size: int = 1

    @register_experiment("fake_seeded", Settings, "a fake", contrasts=_fake_contrasts)
    def run(out, settings, *, smoke, device, seed, data_dir, runs):
        CALLS.append({"out": out, "seed": seed, "checkpoint_dir": runs.directory, "options": settings.to_dict()})
        metrics = {
            "A_acc": 0.9 + 0.01 * seed,
            "B_acc": 0.92 - 0.01 * seed,
            "params": 1000,
            "source": "rendered",
            "label": f"s{seed}",
        }
        return write_report(out, "Fake", [("Results", "text")], metrics=metrics, name="fake_seeded")

    yield "fake_seeded"
    _EXPERIMENTS.pop("fake_seeded")


def test_each_seed_runs_into_its_own_folder_with_its_own_checkpoints(fake_experiment, tmp_path):
    result = run_experiment_seeds(
        fake_experiment, tmp_path / "out", [3, 5], device="cpu", checkpoint_dir=tmp_path / "ckpt", size=7
    )
    assert [c["seed"] for c in CALLS] == [3, 5]
    assert [c["out"] for c in CALLS] == [tmp_path / "out" / "seed-3", tmp_path / "out" / "seed-5"]
    assert [c["checkpoint_dir"] for c in CALLS] == [tmp_path / "ckpt" / "seed-3", tmp_path / "ckpt" / "seed-5"]
    assert all(c["options"] == {"size": 7} for c in CALLS)
    assert (tmp_path / "out" / "seed-3" / "report.md").is_file() and result.report == tmp_path / "out" / "report.md"
    text = result.report.read_text()
    assert text.startswith("# fake_seeded over 2 seeds\n")
    assert "--seeds 3 5" in text and "`size=7`" in text and "[seed-5/report.md](seed-5/report.md)" in text


def test_summary_statistics_match_a_direct_computation(fake_experiment, tmp_path):
    metrics = {
        0: {"A_acc": 0.90, "B_acc": 0.80, "params": 10, "source": "x", "label": "a", "A_db": 20.0, "B_db": 18.5},
        1: {"A_acc": 0.70, "B_acc": 0.75, "params": 10, "source": "x", "label": "b", "A_db": 20.0, "B_db": 21.0},
        2: {"A_acc": 0.95, "B_acc": 0.85, "params": 10, "source": "x", "A_db": 19.0, "B_db": 19.0},
    }
    result = summarise_seeds(fake_experiment, tmp_path, metrics)
    a = [0.90, 0.70, 0.95]
    mean = sum(a) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in a) / 2)
    assert result.metrics["A_acc_mean"] == pytest.approx(mean) and result.metrics["A_acc_std"] == pytest.approx(std)
    assert result.metrics["params_std"] == 0
    text = result.report.read_text()
    # differences A - B per seed: +10, -5, +10 points; mean +5, sample std 8.66
    assert "| A - B, accuracy | +10.00 | -5.00 | +10.00 | +5.00 | 8.66 | 2 above, 1 below zero |" in text
    assert "not there" not in text  # a contrast whose metric is missing is left out
    assert "| A - B, decibels | +1.5 | -1 | +0 | +0.1667 | 1.258 | 1 above, 1 below zero |" in text  # not a fraction
    assert f"| A_acc | 90.00% | 70.00% | 95.00% | {100 * mean:.2f}% | {100 * std:.2f}% | 70.00% - 95.00% |" in text
    assert "| params | 10 |" in text and "| params | 10 | 10 |" not in text  # listed once, with the same
    epochs = summarise_seeds(fake_experiment, tmp_path / "e", {0: {"epochs": 5}, 1: {"epochs": 6}, 2: {"epochs": 6}})
    assert "| epochs | 5 | 6 | 6 | 5.67 | 0.5774 | 5 - 6 |" in epochs.report.read_text()
    assert "| source | x |" in text and "| label | a | b | - |" in text
    saved = json.loads((tmp_path / "seeds.json").read_text())
    assert saved["seeds"] == [0, 1, 2] and saved["contrasts"]["A - B, accuracy"]["differences"] == pytest.approx(
        [0.10, -0.05, 0.10]
    )
    assert (tmp_path / "contrasts.png").stat().st_size > 0 and result.figures == [tmp_path / "contrasts.png"]


def test_one_seed_has_no_spread(fake_experiment, tmp_path):
    result = summarise_seeds(fake_experiment, tmp_path, {4: {"A_acc": 0.5, "B_acc": 0.25}})
    assert math.isnan(result.metrics["A_acc_std"])
    assert "| A - B, accuracy | +25.00 | +25.00 | n/a | 1 above, 0 below zero |" in result.report.read_text()


@pytest.mark.parametrize("seeds, message", [([], "non-empty"), ([1, 1], "distinct"), ([0, "1"], "ints")])
def test_bad_seed_lists_are_rejected(fake_experiment, tmp_path, seeds, message):
    with pytest.raises(ValueError, match=message):
        run_experiment_seeds(fake_experiment, tmp_path, seeds)
    assert not CALLS


def test_cli_seeds(fake_experiment, tmp_path, capsys):
    assert main(["experiment", fake_experiment, "--out", str(tmp_path), "--device", "cpu", "--seeds", "1", "2"]) == 0
    assert "A_acc_mean" in capsys.readouterr().out and [c["seed"] for c in CALLS] == [1, 2]
    with pytest.raises(SystemExit):  # --seed and --seeds exclude each other
        main(["experiment", fake_experiment, "--out", str(tmp_path), "--seed", "1", "--seeds", "1", "2"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["experiment", fake_experiment, "--out", str(tmp_path), "--seeds", "1", "1"]) == 1
    assert "distinct" in capsys.readouterr().err
