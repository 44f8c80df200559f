"""``affnist``: robustness to small affine transforms never seen in training (Sabour et al. 2017, Sec. 5.2).

Paper: CapsNet and a CNN, trained only on MNIST digits placed at random on a 40x40 black canvas, both
reach ~99.2% on such translated MNIST test digits (CapsNet 99.23%, CNN 99.22%); on the affNIST test
set CapsNet gets 79% and the CNN 66%.

Here: both models are trained until their accuracy on held-out translated training digits reaches
``target_accuracy`` (or ``max_epochs`` pass; :meth:`~capsnets.experiments.runs.Runs.fit` with a ``target``),
then tested on (a) translated MNIST test digits (fixed random positions), (b) an affNIST-style set made
from MNIST test digits (:func:`capsnets.data.affnist.make_affnist_style`: the affNIST ranges, drawn
uniformly), and (c) the real affNIST test set when its files are found (``affnist_path`` or
``<data_dir>/affnist/``). Deviations: the CNN is the paper's MNIST baseline design at 40x40 input
(the paper only says "a similar number of parameters"); ``smoke`` uses ``capsnet_small`` and a narrow
CNN, a few hundred images and one or two epochs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from capsnets.data import DatasetError, load_dataset
from capsnets.data.affnist import AFFNIST_SIZE, load_affnist, make_affnist_style, translated_test_set
from capsnets.engine import accuracy as evaluate_accuracy
from capsnets.experiments.canvas import canvas_training_set
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.report import save_figure, training_metrics, write_report
from capsnets.experiments.report.affnist import affnist_sections
from capsnets.models import count_parameters, create_model
from capsnets.plots import image_rows

__all__ = ["run"]


@dataclass(frozen=True)
class Settings(ExperimentSettings):
    """Data sizes, training to ``target_accuracy`` on held-out translated digits, the two models, and where the
    real affNIST test set is (``affnist_path``: a ``.mat`` file or a folder; None: ``<data_dir>/affnist``)."""

    train_size: int = 55000
    val_size: int = 5000
    test_size: int = 10000
    max_epochs: int = 50
    target_accuracy: float = 0.992
    batch_size: int = 128
    lr: float = 1e-3
    capsule_model: str = "capsnet"
    cnn_model: str = "cnn_baseline"
    affnist_path: str | None = None
    train_minutes: float | None = None
    SMOKE: ClassVar[dict] = {
        "train_size": 1024,
        "val_size": 128,
        "test_size": 256,
        "max_epochs": 2,
        "target_accuracy": 0.9,
        "batch_size": 32,
        "lr": 2e-3,
        "capsule_model": "capsnet_small",
        "cnn_model": "cnn_baseline_narrow",
    }


def _build(name: str, device: str) -> nn.Module:
    size = (1, AFFNIST_SIZE, AFFNIST_SIZE)
    return create_model(name, input_size=size, device=device)


def _real_affnist(path, data_dir, device):
    """The real test set, or ``(None, reason)`` when its files are not there."""
    try:
        return load_affnist(path if path is not None else data_dir).to(device), None
    except DatasetError as err:
        return None, str(err).splitlines()[0]


@torch.no_grad()
def _plot_samples(models: dict[str, nn.Module], images, labels, out_png: Path, count: int = 16) -> Path:
    x, y = images[:count], labels[:count].cpu()
    predicted = {}
    for name, model in models.items():
        model.eval()
        predicted[name] = model(x).scores.argmax(dim=1).cpu()
    titles = [
        (
            f"y={int(y[k])} " + " ".join(f"{n[:4]}={int(p[k])}" for n, p in predicted.items()),
            "red" if any(int(p[k]) != int(y[k]) for p in predicted.values()) else "black",
        )
        for k in range(len(x))
    ]
    cols = min(8, len(x))
    rows = [("", x[k : k + cols, :1]) for k in range(0, len(x), cols)]
    fig = image_rows(
        rows, figsize=(1.6 * cols, 1.9 * len(rows)), titles=[titles[k : k + cols] for k in range(0, len(x), cols)]
    )
    fig.suptitle("affNIST-style test digits (red: a model is wrong)")
    return save_figure(fig, out_png)


def _contrasts(metrics: dict) -> list[tuple[str, str, str]]:
    """CapsNet minus CNN accuracy on each test set (for multi-seed summaries)."""
    tests = [
        key[len("CapsNet_") :]
        for key in metrics
        if key.startswith("CapsNet_") and key not in ("CapsNet_val_accuracy", "CapsNet_epochs")
    ]
    return [(f"CapsNet - CNN, {test.replace('_', ' ')} accuracy", f"CapsNet_{test}", f"CNN_{test}") for test in tests]


@register_experiment(
    "affnist",
    Settings,
    "trained on translated MNIST, tested on unseen affine transforms (Sabour et al. 2017, Sec. 5.2)",
    contrasts=_contrasts,
)
def run(out: Path, s: Settings, *, smoke: bool, device: str, seed: int, data_dir, runs):
    """Train on translated MNIST, test on affNIST(-style) digits; write ``report.md`` and a PNG into ``out``."""
    digits = load_dataset("mnist", root=data_dir, train=True, device=device).subset(s.train_size + s.val_size)
    train = canvas_training_set(digits.subset(s.train_size))
    val = translated_test_set(digits.select(slice(s.train_size, None)), seed=seed + 1)
    mnist_test = load_dataset("mnist", root=data_dir, train=False, device=device).subset(s.test_size)
    tests = {
        "translated MNIST": translated_test_set(mnist_test, seed=seed + 2),
        "affNIST-style": make_affnist_style(mnist_test, seed=seed + 3)[0],
    }
    real, missing = _real_affnist(s.affnist_path, data_dir, device)
    if real is not None:
        tests["affNIST (real)"] = real
    models = {"CapsNet": _build(s.capsule_model, device), "CNN": _build(s.cnn_model, device)}
    training = {
        name: runs.fit(
            f"affnist_{model.model_name}",
            model,
            train,
            val,
            epochs=s.max_epochs,
            target=s.target_accuracy,
            lr=s.lr,
            batch_size=s.batch_size,
            seed=seed + 100 * index,
            train_minutes=s.train_minutes,
        )
        for index, (name, model) in enumerate(models.items())
    }
    accuracy = {
        (name, test): evaluate_accuracy(m, data.images, data.labels)
        for name, m in models.items()
        for test, data in tests.items()
    }
    samples_png = _plot_samples(
        models, tests["affNIST-style"].images, tests["affNIST-style"].labels, out / "affnist_style_samples.png"
    )
    sections = affnist_sections(
        {name: (m.model_name, count_parameters(m)) for name, m in models.items()},
        list(tests),
        accuracy,
        training,
        s,
        missing=missing,
        seed=seed,
        device=device,
        smoke=smoke,
    )
    metrics = {f"{name}_{test}".replace(" ", "_"): value for (name, test), value in accuracy.items()}
    metrics.update(training_metrics(training))
    return write_report(
        out,
        "affNIST: generalisation to unseen affine transforms",
        sections,
        figures=[samples_png],
        metrics=metrics,
        name="affnist",
    )
