"""MultiMNIST: recognising and segmenting two overlapping digits (Sabour, Frosst & Hinton 2017, Sec. 6).

Both models train as multi-label classifiers through the engine's trainer: CapsNet (36x36 input, 10 class capsules)
with the margin loss on both labels and the reconstruction of the pair from its two label capsules, the CNN baseline
with a sigmoid (binary cross-entropy) loss on the two-hot target (:func:`cnn_loss`). A test example counts as correct iff the two
longest class capsules (the top two logits) are exactly its two labels. The segmentation figure decodes each of the
two longest capsules alone, as the paper's Fig. 5.

Deviations: the paper trains on 60M pairs (1K per MNIST training digit) and tests on 10M; the full run
here draws a fresh set of 60K pairs (one per training digit) every epoch for ``epochs`` (N = 50) epochs,
60K x 50 = 3M pairs, and tests on 10 fixed-seed pairs per test digit (100K). ``--smoke`` uses a few
hundred pairs, one epoch, ``capsnet_small`` and a narrow CNN. After every epoch each model is scored on up to 2,000
fixed-seed validation pairs of training digits, which choose its ``best`` epoch (by their mean average precision);
the report's training table shows whether the models were still improving when training ended. Deviation: the
paper reconstructs each digit from its own capsule in training (the reconstruction loss summed over the two
digits); the trainer's targets are the labels alone, so the pair is reconstructed from both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor, nn

from capsnets.data import TensorData, load_dataset
from capsnets.data.multimnist import MultiMNIST, average_overlap, make_multimnist, multimnist_test_set
from capsnets.engine import accuracy as evaluate_accuracy
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.report import ExperimentResult, save_figure, write_report
from capsnets.experiments.report.multimnist import multimnist_sections
from capsnets.functional import capsule_length
from capsnets.models import count_parameters, create_model

SIZE = 36  # 28 + 2 * 4


@dataclass(frozen=True)
class Settings(ExperimentSettings):
    """Data sizes (a fresh set of ``pairs_per_epoch`` pairs every epoch), training, and the two models."""

    train_digits: int = 60000
    pairs_per_epoch: int = 60000
    epochs: int = 50
    test_digits: int = 10000
    test_pairs_per_digit: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    capsnet: str = "capsnet"
    cnn: str = "cnn_baseline"
    train_minutes: float | None = None
    SMOKE: ClassVar[dict] = {
        "train_digits": 2000,
        "pairs_per_epoch": 400,
        "epochs": 1,
        "test_digits": 200,
        "test_pairs_per_digit": 1,
        "batch_size": 32,
        "capsnet": "capsnet_small",
        "cnn": "cnn_baseline_narrow",
    }


def two_hot(labels: Tensor, num_classes: int = 10) -> Tensor:
    """``(B, 2)`` class pairs -> ``(B, K)`` multi-hot float targets."""
    return F.one_hot(labels, num_classes).sum(dim=1).clamp(max=1).float()


def both_correct(output, targets) -> Tensor:
    """The paper's metric: the two highest scores are exactly the two labels. ``(B,)`` bool."""
    labels = targets[0] if isinstance(targets, tuple) else targets
    top2 = output.scores.topk(2, dim=-1).indices.sort(dim=-1).values
    return (top2 == labels.sort(dim=-1).values).all(dim=-1)


def cnn_loss(scores: Tensor, targets: Tensor) -> Tensor:
    """The CNN's loss: sigmoid cross-entropy of the logits against the two-hot target, averaged over the classes."""
    return F.binary_cross_entropy_with_logits(scores, targets)


def _models(cfg: Settings, device: str) -> dict[str, nn.Module]:
    capsnet = create_model(cfg.capsnet, input_size=(1, SIZE, SIZE), device=device)
    # the paper's CNN is far too slow on a CPU: the smoke run uses the same design, narrow
    cnn = create_model(cfg.cnn, input_size=(1, SIZE, SIZE), device=device)
    return {"CapsNet": capsnet, "CNN baseline": cnn}


@torch.no_grad()
def plot_segmentation(model: nn.Module, data: MultiMNIST, out_png: str | Path, n: int = 8) -> Path:
    """Inputs (top row) and the reconstructions of the two longest capsules in red and green over the
    greyed input (bottom row), titled with labels (L) and predictions (P), as in the paper's Fig. 5."""
    images, labels = data.images[:n], data.labels[:n]
    capsules = model.encode(images)
    top2 = capsule_length(capsules).topk(2, dim=-1).indices  # (n, 2)
    recon = [model.decoder(capsules, top2[:, k])[:, 0] for k in range(2)]  # 2 x (n, S, S)
    grey = 0.4 * images[:, 0]
    rgb = torch.stack([grey + recon[0], grey + recon[1], grey], dim=-1).clamp(0, 1).cpu().numpy()
    fig = Figure(figsize=(1.6 * len(images), 3.6))
    for i in range(len(images)):
        top = fig.add_subplot(2, len(images), i + 1)
        top.imshow(images[i, 0].cpu().numpy(), cmap="gray", vmin=0, vmax=1)
        top.set_title(f"L:{labels[i, 0].item()},{labels[i, 1].item()}", fontsize=8)
        bottom = fig.add_subplot(2, len(images), len(images) + i + 1)
        bottom.imshow(rgb[i])
        bottom.set_title(f"P:{top2[i, 0].item()},{top2[i, 1].item()}", fontsize=8)
        for ax in (top, bottom):
            ax.set_xticks([]), ax.set_yticks([])
    fig.suptitle("MultiMNIST: red / green = reconstructions of the two longest capsules", fontsize=9)
    return save_figure(fig, out_png)


def _multi_label(data: MultiMNIST) -> TensorData:
    """The pairs as multi-label data of the engine's trainer: which two digits each image shows."""
    return TensorData(data.images, two_hot(data.labels), 10, name="multimnist_pairs")


def _load_digits(data_dir, train: bool, count: int, device: str) -> tuple[Tensor, Tensor]:
    data = load_dataset("mnist", root=data_dir, train=train)
    return data.images[:count].to(device), data.labels[:count].to(device)


@register_experiment(
    "multimnist",
    Settings,
    "recognising two overlapping digits: CapsNet against a CNN (Sabour et al. 2017, Sec. 6)",
    contrasts=lambda metrics: [("CapsNet - CNN, test error", "capsnet_error", "cnn_error")],
)
def run(out: Path, cfg: Settings, *, smoke: bool, device: str, seed: int, data_dir, runs) -> ExperimentResult:
    """Train CapsNet and the CNN on generated MultiMNIST, report the paper's error and the segmentation
    figure."""
    train_images, train_labels = _load_digits(data_dir, True, cfg.train_digits, device)
    test_images, test_labels = _load_digits(data_dir, False, cfg.test_digits, device)
    test = multimnist_test_set(test_images, test_labels, pairs_per_digit=cfg.test_pairs_per_digit)

    def epoch_data(epoch: int) -> MultiMNIST:
        return make_multimnist(train_images, train_labels, cfg.pairs_per_epoch, seed=seed * 100003 + epoch)

    # chooses each model's best epoch: pairs of training digits, a seed no training epoch uses
    val = make_multimnist(train_images, train_labels, min(2000, cfg.pairs_per_epoch), seed=seed * 100003 + 100_000)
    metrics = {f"test_overlap_{mode}": average_overlap(test, mode=mode) for mode in ("frame", "smaller", "union")}
    records = {}
    models = _models(cfg, device)
    for name, model in models.items():
        key = "capsnet" if name == "CapsNet" else "cnn"
        training = runs.fit(
            f"multimnist_{key}",
            model,
            None,
            _multi_label(val),
            epochs=cfg.epochs,
            epoch_data=lambda epoch: _multi_label(epoch_data(epoch)),
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            max_shift=0,
            seed=seed,
            loss=None if key == "capsnet" else cnn_loss,
            train_minutes=cfg.train_minutes,
            recipe=cfg.subset("train_digits", "pairs_per_epoch"),
        )
        error = 1.0 - evaluate_accuracy(model, test.images, (test.labels,), correct=both_correct)
        params = count_parameters(model)
        metrics.update({f"{key}_error": error, f"{key}_parameters": params})
        records[name] = {"parameters": params, "error": error, "training": training}
    png = plot_segmentation(models["CapsNet"], test, out / "segmentation.png")
    sections = multimnist_sections(
        records, metrics, cfg, test_pairs=len(test), val_pairs=len(val), seed=seed, device=device
    )
    return write_report(
        out, "MultiMNIST (Sabour et al. 2017, Sec. 6)", sections, figures=[png], metrics=metrics, name="multimnist"
    )
