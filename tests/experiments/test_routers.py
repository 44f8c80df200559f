"""The ``routers`` experiment: the smoke run through the CLI, speed ratios, matching, time-limit continuation."""

import json

import pytest

from capsnets.cli import main
from capsnets.experiments import experiment_settings, list_experiments, run_experiment
from capsnets.experiments.routers import CNN_HEADS, REFERENCE, _matched_cnn
from capsnets.models.routing_zoo import HEADS

from helpers import assert_contrasts_resolve

#: the smoke version made smaller still: a few dozen images per task, one timed step per head
TINY = {
    "fashion_train_size": 64,
    "affnist_train_size": 64,
    "affnist_val_size": 32,
    "viewpoints_train_size": 32,
    "test_size": 32,
    "throughput_steps": 1,
    "throughput_repeats": 1,
}


def _rows(text: str, heading: str) -> dict[str, list[str]]:
    """The rows of the table under ``## heading``, by head."""
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ")][1:]
    return {cells[0].strip(): [c.strip() for c in cells] for cells in rows}


@pytest.mark.long  # started first (tests/conftest.py)
def test_smoke_through_the_cli_reports_every_head_on_every_task(shared_data_root, tmp_path, capsys):
    assert "routers" in list_experiments()
    argv = [
        "experiment",
        "routers",
        "--smoke",
        "--out",
        str(tmp_path / "out"),
        "--device",
        "cpu",
        "--data-dir",
        str(shared_data_root),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    for key, value in TINY.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "trainings_left: 0" in printed
    text = (tmp_path / "out" / "report.md").read_text()
    assert {p.name for p in (tmp_path / "out").glob("*.png")} == {
        "accuracy_vs_time.png",
        "accuracy_vs_cost.png",
        "novel_view_error.png",
    }
    for task in ("fashion_mnist", "affnist", "azimuth", "elevation"):
        rows = _rows(text, task)
        assert set(rows) == set(HEADS), task
        assert rows[REFERENCE][4] == "1.00"  # the ratio column
        for head, cells in rows.items():
            kind = "CNN" if head in CNN_HEADS else "capsules" if head == "hvc" else "routing"
            assert "not trained" not in " ".join(cells) and cells[1] == kind
    # the ratios are each head's images/s over avg_pool's, measured in this run (one repeat: the plain quotient)
    speeds = [json.loads(p.read_text()) for p in (tmp_path / "ckpt").glob("routers_throughput_*.json")]
    assert len(speeds) == 3  # 28x28 / 10 classes, 40x40 / 10, 32x32 / 5
    for speed in speeds:
        heads = speed["heads"]
        assert set(heads) == set(HEADS)
        for value in heads.values():
            assert value["ratio"] == pytest.approx(value["images_per_s"] / heads[REFERENCE]["images_per_s"])
    matched = _rows(text, "azimuth")["dynamic"][7]  # "best CNN head at matched familiar error"
    assert matched.split(" at epoch")[0] in CNN_HEADS


def test_time_limit_leaves_heads_for_the_next_run_which_reuses_what_was_trained(shared_data_root, tmp_path):
    options = dict(
        smoke=True,
        device="cpu",
        data_dir=str(shared_data_root),
        checkpoint_dir=str(tmp_path / "ckpt"),
        tasks=["fashion_mnist"],
        heads=["dynamic", "avg_pool", "max_pool"],
        **TINY,
    )
    first = run_experiment("routers", tmp_path / "a", time_limit_minutes=1e-4, **options)
    assert first.metrics["trainings_left"] == 2  # the first training always starts: avg_pool, the reference
    assert "fashion_mnist_avg_pool_accuracy" in first.metrics and "not trained yet" in first.report.read_text()
    saved = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ckpt").iterdir()}
    second = run_experiment("routers", tmp_path / "b", **options)
    assert second.metrics["trainings_left"] == 0
    rows = _rows(second.report.read_text(), "fashion_mnist")
    assert rows["avg_pool"][-1].endswith("(loaded)") and not rows["dynamic"][-1].endswith("(loaded)")
    assert second.metrics["fashion_mnist_avg_pool_accuracy"] == first.metrics["fashion_mnist_avg_pool_accuracy"]
    assert all((tmp_path / "ckpt" / name).stat().st_mtime_ns == mtime for name, mtime in saved.items())
    saved = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ckpt").iterdir()}
    third = run_experiment("routers", tmp_path / "c", **options)
    assert all(cells[-1].endswith("(loaded)") for cells in _rows(third.report.read_text(), "fashion_mnist").values())
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ckpt").iterdir()} == saved  # nothing retrained
    assert {k: v for k, v in third.metrics.items() if "accuracy" in k} == {
        k: v for k, v in second.metrics.items() if "accuracy" in k
    }


def test_contrasts_name_each_routing_head_against_the_best_cnn_head():
    metrics = {"affnist_best_cnn_accuracy": 0.8, "trainings_left": 0}
    for head in HEADS:
        metrics[f"affnist_{head}_accuracy"] = 0.5
        for split in ("azimuth", "elevation"):
            metrics[f"{split}_{head}_novel_error"] = 0.3
            if head not in CNN_HEADS:
                metrics[f"{split}_{head}_matched_cnn_novel_error"] = 0.4
    assert_contrasts_resolve("routers", metrics, (len(HEADS) - len(CNN_HEADS)) * 3)


def test_matched_cnn_takes_each_cnn_heads_first_evaluation_at_the_heads_error():
    cnn = {
        "avg_pool": {
            "history": [
                {"epoch": 1, "familiar_error": 0.5, "novel_error": 0.6},
                {"epoch": 2, "familiar_error": 0.3, "novel_error": 0.5},
                {"epoch": 3, "familiar_error": 0.2, "novel_error": 0.45},
            ]
        },
        "max_pool": {
            "history": [
                {"epoch": 1, "familiar_error": 0.4, "novel_error": 0.42},
                {"epoch": 2, "familiar_error": 0.25, "novel_error": 0.4},
            ]
        },
    }
    # a head short of the target (0.2) at 0.35: avg_pool at epoch 2 (0.5 novel), max_pool at epoch 2 (0.4): the best
    assert _matched_cnn({"familiar_error": 0.35}, cnn, target=0.2) == {
        "head": "max_pool",
        "epoch": 2,
        "familiar_error": 0.25,
        "novel_error": 0.4,
    }
    # a head below the target is compared at the target: max_pool never got there
    assert _matched_cnn({"familiar_error": 0.1}, cnn, target=0.2)["head"] == "avg_pool"
    assert _matched_cnn({"familiar_error": 0.1}, {"max_pool": cnn["max_pool"]}, target=0.2) is None


@pytest.mark.parametrize(
    "options, message",
    [
        ({"heads": ["dynamic", "max_pool"]}, "must include 'avg_pool'"),
        ({"heads": ["avg_pool", "capsules"]}, "heads must be distinct names"),
        ({"tasks": ["cifar10"]}, "tasks must be distinct names"),
        ({"time_limit_minutes": 0}, "time_limit_minutes must be a positive number"),
    ],
)
def test_settings_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        experiment_settings("routers", smoke=True, **options)
