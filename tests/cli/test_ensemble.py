"""``capsnets evaluate --checkpoint RUN1 RUN2 ...``: an ensemble of runs scored by the mean of their class capsule
lengths (Sabour, Frosst & Hinton 2017, Sec. 7), its report named after its runs, and runs of other data refused."""

import json

import pytest
import torch

from capsnets.cli import ensemble_label, main

from helpers import TINY_TRAIN

TRAIN = [*TINY_TRAIN, "--model-arg", "routing.iterations=2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of capsnet_digits that differ only in their seed (figures left out, for time)."""
    from capsnets.engine import reporting

    root = tmp_path_factory.mktemp("ensemble")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
        for seed in (0, 1):
            assert main([*TRAIN, "--seed", str(seed), "--out", str(root / f"run{seed}")]) == 0
    return root


def test_the_ensemble_scores_with_the_mean_of_the_runs_lengths(runs, capsys):
    from capsnets.data import load_dataset
    from capsnets.models import load_model

    assert main(["evaluate", "--checkpoint", str(runs / "run0"), str(runs / "run1"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    report = json.loads((runs / "evaluation_ensemble_run0_best+run1_best_digits.json").read_text())
    assert (runs / "evaluation_ensemble_run0_best+run1_best_digits_confusion.png").is_file()
    data = load_dataset("digits", train=False)
    with torch.no_grad():
        lengths = [load_model(runs / f"run{k}")(data.images).scores for k in (0, 1)]
    mean = (lengths[0] + lengths[1]) / 2
    assert report["accuracy"] == (mean.argmax(dim=1) == data.labels).sum().item() / 360
    assert report["count"] == sum(map(sum, report["confusion_matrix"])) == 360
    assert report["checkpoints"] == [str(runs / f"run{k}" / "best.safetensors") for k in (0, 1)]
    alone = [(lengths[k].argmax(dim=1) == data.labels).sum().item() / 360 for k in (0, 1)]
    assert [member["accuracy"] for member in report["members"]] == alone
    assert f"{runs / 'run0' / 'best.safetensors'} alone" in out and "accuracy" in out and "confusion matrix" in out


def test_the_report_goes_to_out_and_replaces_no_other(runs, tmp_path):
    for checkpoints in (
        [runs / "run0"],
        [runs / "run0", runs / "run1"],
        [runs / "run1" / "last.safetensors", runs / "run0"],
    ):
        assert (
            main(["evaluate", "--checkpoint", *map(str, checkpoints), "--out", str(tmp_path), "--device", "cpu"]) == 0
        )
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "evaluation_ensemble_run0_best+run1_best_digits.json",
        "evaluation_ensemble_run1_last+run0_best_digits.json",
        "evaluation_run0_best_digits.json",
    ]


def test_runs_of_other_data_are_refused_in_one_line(runs, tmp_path, capsys):
    import capsnets
    from capsnets.engine.checkpoint import save_checkpoint

    model = capsnets.create_model("capsnet_digits")
    other = save_checkpoint(
        tmp_path / "other" / "best.safetensors",
        model=model,
        meta={"model": "capsnet_digits", "model_args": {}, "dataset": "mnist"},
    )
    for checkpoints, message in (
        ([runs / "run0", other], "trained on the same data: "),
        ([runs / "run0", runs / "run0" / "best.safetensors"], "is given twice"),
    ):
        assert main(["evaluate", "--checkpoint", *map(str, checkpoints), "--device", "cpu"]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("capsnets evaluate: error:") and message in err


def test_a_long_ensemble_is_named_by_a_digest(tmp_path):
    paths = [tmp_path / f"a_rather_long_run_name_{k}" / "best.safetensors" for k in range(7)]
    label = ensemble_label(paths, tmp_path)
    assert label.startswith("a_rather_long_run_name_0_best+6_more_") and len(label) < 60
    assert label != ensemble_label(paths[:6], tmp_path)
    assert ensemble_label(paths[:2], tmp_path) == "a_rather_long_run_name_0_best+a_rather_long_run_name_1_best"
