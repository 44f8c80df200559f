"""``adversarial``: FGSM and BIM against a capsule network and a CNN at (roughly) equal clean accuracy.

Paper: Hinton, Sabour & Frosst (2018), "Matrix capsules with EM routing", Sec. 6: with both
models at the same clean accuracy, capsules are markedly less vulnerable than the CNN to FGSM and BIM,
untargeted and targeted, but examples crafted on the CNN transfer to the capsule model about as well
as to other CNNs. The paper reports this for matrix capsules on smallNORB with figures only (no table).

Here (deviations): MNIST, the vector CapsNet by default (``capsule_model="matrix_capsnet"`` gives the
matrix version); the attacks craft with each loss in ``attack_losses`` (:func:`.attacks.attack_loss`):
``"cross_entropy"`` of the scores for both models, and ``"own"``, each model's training loss on its scores.
The capsule losses (margin, spread) are exactly flat on confidently classified examples, where a
sign-gradient attack then does nothing; the report gives, per model and loss, the fraction of clean test
examples with a zero input gradient, so such gradient masking is visible rather than read as robustness.
The CNN is the paper's baseline (35.4M parameters) in full
runs and a narrow version of it (16/16/8 channels, 64/32 hidden) with ``smoke``. "Equal accuracy":
each model is trained until its accuracy on a held-out part of the training set reaches
``target_accuracy`` (or ``max_epochs`` pass), through the engine's trainer
(:meth:`~capsnets.experiments.runs.Runs.fit` with a ``target``). Success rates count
only test examples the attacked (or, for transfer, the evaluated) model classifies correctly when
clean; targeted attacks use one random wrong class per example, the same for every attack and eps.
BIM takes ``bim_steps`` steps of ``2.5 * eps / bim_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from capsnets.data import load_dataset
from capsnets.engine import accuracy as evaluate_accuracy
from capsnets.experiments.adversarial.attacks import ATTACK_LOSSES, attack_loss, random_wrong_targets
from capsnets.experiments.adversarial.scoring import attack_table, craft, zero_gradient_fraction
from capsnets.experiments.common import ExperimentSettings, register_experiment
from capsnets.experiments.report import training_metrics, write_report
from capsnets.experiments.report.adversarial import (
    LOSS_TEXT,
    adversarial_sections,
    plot_examples,
    plot_success_rates,
    success_rate_table,
)
from capsnets.models import create_model

__all__ = ["Settings", "run"]


@dataclass(frozen=True)
class Settings(ExperimentSettings):
    """Data sizes, training to ``target_accuracy`` on the validation images, the attacks (``eps`` values,
    ``bim_steps``, ``attack_losses``: some of ``"cross_entropy"``, ``"own"``) and the two models."""

    train_size: int = 55000
    val_size: int = 5000
    test_size: int = 1000
    max_epochs: int = 30
    target_accuracy: float = 0.99
    eps: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
    bim_steps: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    capsule_model: str = "capsnet"
    cnn_model: str = "cnn_baseline"
    attack_losses: tuple[str, ...] = ("cross_entropy", "own")
    train_minutes: float | None = None
    SMOKE: ClassVar[dict] = {
        "train_size": 768,
        "val_size": 128,
        "test_size": 64,
        "max_epochs": 2,
        "target_accuracy": 0.9,
        "eps": (0.1, 0.2, 0.3),
        "bim_steps": 3,
        "batch_size": 32,
        "lr": 2e-3,
        "capsule_model": "capsnet_small",
        "cnn_model": "cnn_baseline_narrow",
    }

    def __post_init__(self) -> None:
        if not self.attack_losses or any(kind not in ATTACK_LOSSES for kind in self.attack_losses):
            raise ValueError(
                f"adversarial: attack_losses must name some of {ATTACK_LOSSES}, got {self.attack_losses!r}"
            )


def _build(name: str, device: str) -> nn.Module:
    return create_model(name, device=device)


def _contrasts(metrics: dict) -> list[tuple[str, str, str]]:
    """Capsules minus CNN: clean accuracy, and the white-box success rate of every attack (multi-seed summaries)."""
    pairs = [("CapsNet - CNN, clean accuracy", "clean_accuracy_CapsNet", "clean_accuracy_CNN")]
    suffix = "_CapsNet_on_CapsNet"
    for key in metrics:
        if key.endswith(suffix):
            attack = key[: -len(suffix)]
            loss, name, kind, eps = attack.rsplit("_", 3)
            pairs.append(
                (
                    f"CapsNet - CNN, {name.upper()} {kind} eps {eps} success ({loss.replace('_', '-')} loss)",
                    key,
                    f"{attack}_CNN_on_CNN",
                )
            )
    return pairs


@register_experiment(
    "adversarial",
    Settings,
    "FGSM and BIM against capsules and a CNN at equal clean accuracy (Hinton et al. 2018, Sec. 6)",
    contrasts=_contrasts,
)
def run(out: Path, s: Settings, *, smoke: bool, device: str, seed: int, data_dir, runs):
    """Train (or load) the two models, attack them, write ``report.md`` and two PNGs into ``out``."""
    train = load_dataset("mnist", root=data_dir, train=True, device=device)
    test = load_dataset("mnist", root=data_dir, train=False, device=device).subset(s.test_size)
    fit = train.subset(s.train_size + s.val_size)
    fit_train, fit_val = fit.subset(s.train_size), fit.select(slice(s.train_size, None))
    models = {"CNN": _build(s.cnn_model, device), "CapsNet": _build(s.capsule_model, device)}
    training = {
        name: runs.fit(
            f"adversarial_{model.model_name}",
            model,
            fit_train,
            fit_val,
            epochs=s.max_epochs,
            target=s.target_accuracy,
            lr=s.lr,
            batch_size=s.batch_size,
            max_shift=0,
            seed=seed + 100 * index,
            train_minutes=s.train_minutes,
        )
        for index, (name, model) in enumerate(models.items())
    }
    clean = {name: evaluate_accuracy(m, test.images, test.labels) for name, m in models.items()}
    wrong = random_wrong_targets(test.labels, test.num_classes, torch.Generator().manual_seed(seed))
    records, figures, rate_sections = [], [], []
    for kind in s.attack_losses:
        found = attack_table(
            models,
            test.images,
            test.labels,
            wrong,
            s.eps,
            bim_steps=s.bim_steps,
            batch_size=max(s.batch_size, 64),
            loss=kind,
        )
        records += found
        figures.append(
            plot_success_rates(
                found,
                s.eps,
                "CapsNet",
                "CNN",
                out / f"success_rates_{kind}.png",
                title=f"attack success, crafted with {LOSS_TEXT[kind]}",
            )
        )
        rate_sections.append(
            (
                f"Attack success rates, crafted with {LOSS_TEXT[kind]}",
                success_rate_table(found, s.eps, "CapsNet", "CNN"),
            )
        )
    mid_eps, x, y = s.eps[len(s.eps) // 2], test.images[:6], test.labels[:6]
    rows = [("clean", x)] + [
        (f"{attack.upper()} on {name}", craft(attack, m, x, y, mid_eps, None, s.bim_steps, s.attack_losses[0]))
        for name, m in models.items()
        for attack in ("fgsm", "bim")
    ]
    figures.append(plot_examples(models, rows, y, mid_eps, s.attack_losses[0], out / "examples.png"))
    flat = {
        (name, kind): zero_gradient_fraction(m, attack_loss(m, kind), test.images, test.labels)
        for name, m in models.items()
        for kind in s.attack_losses
    }
    sections = adversarial_sections(
        models, training, clean, rate_sections, flat, s, {"seed": seed, "device": device, "smoke": smoke}
    )
    metrics = {
        f"{r['loss']}_{r['attack']}_{'targeted' if r['targeted'] else 'untargeted'}_{r['eps']}_"
        f"{r['source']}_on_{r['victim']}": r["rate"]
        for r in records
    }
    metrics.update({f"clean_accuracy_{k}": v for k, v in clean.items()})
    metrics.update(training_metrics(training))
    metrics.update({f"zero_gradient_{kind}_{name}": v for (name, kind), v in flat.items()})
    return write_report(
        out, "Adversarial robustness: capsules vs CNN", sections, figures=figures, metrics=metrics, name="adversarial"
    )
