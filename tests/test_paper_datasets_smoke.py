"""Smoke run of Sec. 7's CIFAR-10 and SVHN CapsNets (Sabour, Frosst & Hinton 2017) through the whole pipeline, on
files fabricated in the data sets' real formats (nothing is downloaded): ``capsnets train`` of two
``capsnet_cifar10`` runs and one ``capsnet_svhn`` run, then ``capsnets evaluate`` of the CIFAR-10 runs' ensemble
and of the SVHN run. About 20 s on one CPU thread (the CIFAR-10 model has 12M parameters), hence ``learning``."""

import json

import pytest
import yaml

from capsnets.cli import main
from capsnets.data import CIFAR10, SVHN

from fake_datasets import fake_cifar_splits, md5_of, write_cifar_tarball, write_svhn_mat

pytestmark = pytest.mark.learning


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """Fabricated CIFAR-10 (30 train / 7 test) and SVHN (12 / 10) files, their md5s patched in."""
    root = tmp_path / "data"
    tarball = write_cifar_tarball(root / "cifar-10" / CIFAR10.archive, fake_cifar_splits())
    write_svhn_mat(root / "svhn" / "train_32x32.mat", 12, 0)
    write_svhn_mat(root / "svhn" / "test_32x32.mat", 10, 1)
    monkeypatch.setattr(CIFAR10, "md5", md5_of(tarball))
    monkeypatch.setattr(SVHN, "md5s", {path.name: md5_of(path) for path in (root / "svhn").iterdir()})
    return root


def _train(model: str, dataset: str, out, data_root, *extra: str) -> dict:
    argv = [
        "train",
        "--model",
        model,
        "--dataset",
        dataset,
        "--data-dir",
        str(data_root),
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]
    assert main(argv) == 0
    return json.loads((out / "summary.json").read_text())


def test_cifar10_and_svhn_train_and_evaluate(data_root, tmp_path, capsys):
    runs = tmp_path / "runs"
    for seed in (0, 1):  # the paper's 24x24 patches are the model's own: no shifts (--max-shift 0)
        _train(
            "capsnet_cifar10",
            "cifar10",
            runs / f"cifar{seed}",
            data_root,
            "--batch-size",
            "8",
            "--limit-train",
            "16",
            "--max-shift",
            "0",
            "--seed",
            str(seed),
            *(["--no-figures"] if seed else []),  # the first run's figures are checked below
        )
    config = yaml.safe_load((runs / "cifar0" / "config.yaml").read_text())
    assert config["model_args"] == {"num_classes": 10, "input_size": [3, 32, 32]}
    _train("capsnet_svhn", "svhn", runs / "svhn", data_root, "--batch-size", "4")
    for name in ("training_curves.png", "confusion_matrix.png", "reconstructions.png"):
        assert (runs / "svhn" / name).is_file(), name
    assert not (runs / "cifar0" / "reconstructions.png").exists()  # no decoder (the released code's remake=false)
    capsys.readouterr()

    assert main(["evaluate", "--checkpoint", str(runs / "cifar0"), str(runs / "cifar1"), "--device", "cpu"]) == 0
    report = json.loads((runs / "evaluation_ensemble_cifar0_best+cifar1_best_cifar10.json").read_text())
    assert report["count"] == 7 and len(report["members"]) == 2 and report["dataset"] == "cifar10"
    assert (runs / "evaluation_ensemble_cifar0_best+cifar1_best_cifar10_confusion.png").is_file()
    assert main(["evaluate", "--checkpoint", str(runs / "svhn"), "--device", "cpu"]) == 0
    assert json.loads((runs / "svhn" / "evaluation_best_svhn.json").read_text())["count"] == 10
    assert "accuracy" in capsys.readouterr().out
