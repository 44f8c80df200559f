"""The report of the ``adversarial`` experiment (Hinton, Sabour & Frosst 2018, Sec. 6): the models, success-rate
tables and figures of FGSM and BIM against capsules and a CNN, examples, and gradient masking.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from torch import Tensor, nn

from capsnets.experiments.adversarial.scoring import predict
from capsnets.experiments.report import markdown_table, matching_note, percent, save_figure, settings_table
from capsnets.experiments.runs import Training
from capsnets.models import count_parameters
from capsnets.plots import image_rows

__all__ = ["LOSS_TEXT", "adversarial_sections", "plot_examples", "plot_success_rates", "success_rate_table"]

#: How the report names each loss the attacks are crafted with.
LOSS_TEXT = {
    "cross_entropy": "the cross-entropy of the scores",
    "own": "each model's training loss (margin / spread / cross-entropy)",
}


def _rate(records, **match) -> float:
    """The success rate of the record matching ``match`` (NaN if none does)."""
    for r in records:
        if all(r[k] == v for k, v in match.items()):
            return r["rate"]
    return float("nan")


def success_rate_table(records: list[dict], eps_values: Sequence[float], caps: str, cnn: str) -> str:
    """Success rates of each attack, kind and eps: white-box on each model and transferred between them."""
    rows = []
    for attack in ("fgsm", "bim"):
        for targeted in (False, True):
            for eps in eps_values:
                pick = dict(attack=attack, targeted=targeted, eps=float(eps))
                rows.append(
                    (
                        attack.upper(),
                        "targeted" if targeted else "untargeted",
                        eps,
                        percent(_rate(records, source=cnn, victim=cnn, **pick)),
                        percent(_rate(records, source=caps, victim=caps, **pick)),
                        percent(_rate(records, source=cnn, victim=caps, **pick)),
                        percent(_rate(records, source=caps, victim=cnn, **pick)),
                    )
                )
    headers = [
        "attack",
        "kind",
        "eps",
        "CNN (white-box)",
        "capsules (white-box)",
        "CNN -> capsules (transfer)",
        "capsules -> CNN (transfer)",
    ]
    return markdown_table(headers, rows)


def plot_success_rates(records, eps_values, caps: str, cnn: str, out_png: Path, title: str = "") -> Path:
    """Success rate against eps: one panel per attack and kind, white-box and CNN-to-capsules transfer."""
    fig = Figure(figsize=(11, 7), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True, sharey=True)
    lines = [
        (cnn, cnn, "CNN", "tab:red", "-"),
        (caps, caps, "capsules", "tab:blue", "-"),
        (cnn, caps, "CNN -> capsules", "tab:purple", "--"),
    ]
    for row, attack in enumerate(("fgsm", "bim")):
        for col, targeted in enumerate((False, True)):
            ax = axes[row, col]
            for source, victim, label, colour, style in lines:
                rates = [
                    100 * _rate(records, attack=attack, targeted=targeted, eps=float(e), source=source, victim=victim)
                    for e in eps_values
                ]
                ax.plot(eps_values, rates, style, marker="o", color=colour, label=label)
            ax.set_title(f"{attack.upper()}, {'targeted' if targeted else 'untargeted'}")
            ax.set_ylim(-2, 102)
            ax.grid(alpha=0.3)
            if row == 1:
                ax.set_xlabel("eps (L-inf)")
            if col == 0:
                ax.set_ylabel("success rate (%)")
    axes[0, 0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return save_figure(fig, out_png)


def plot_examples(
    models: dict[str, nn.Module], rows: list[tuple[str, Tensor]], labels: Tensor, eps: float, loss: str, out_png: Path
) -> Path:
    """One row per ``(title, images)`` (clean, then each attack on each model), each image titled with its label and
    every model's prediction (red where a model is wrong)."""
    titles = []
    for _, batch in rows:
        predicted = {n: predict(m, batch).cpu() for n, m in models.items()}
        titles.append(
            [
                (
                    f"y={int(labels[c])} " + " ".join(f"{n[:4]}={int(p[c])}" for n, p in predicted.items()),
                    "red" if any(int(p[c]) != int(labels[c]) for p in predicted.values()) else "black",
                )
                for c in range(len(labels))
            ]
        )
    images = [(title, batch[:, :1]) for title, batch in rows]
    fig = image_rows(images, figsize=(1.5 * len(labels) + 1.5, 1.7 * len(rows)), titles=titles)
    fig.suptitle(f"adversarial examples, eps = {eps}, crafted with {LOSS_TEXT[loss]}")
    return save_figure(fig, out_png)


def adversarial_sections(
    models: dict[str, nn.Module],
    training: dict[str, Training],
    clean: dict[str, float],
    rate_sections: list[tuple[str, str]],
    flat: dict[tuple[str, str], float],
    s: Any,
    run: dict[str, Any],
) -> list[tuple[str, str]]:
    """The report's sections: the models (their training to the validation target and clean accuracy), the success
    rates, how to read them, gradient masking, the paper's finding and the settings (``s``, and ``run``: seed,
    device, smoke)."""
    model_rows = [
        (
            name,
            m.model_name,
            f"{count_parameters(m):,}",
            training[name].epochs,
            percent(training[name].chosen("val_accuracy")),
            percent(clean[name]),
        )
        for name, m in models.items()
    ]
    losses = s.attack_losses
    return [
        (
            "Models",
            markdown_table(
                ["role", "model", "parameters", "epochs", "val. accuracy", "clean test accuracy"], model_rows
            )
            + "\n\n"
            + matching_note(training, s.target_accuracy),
        ),
        *rate_sections,
        (
            "How to read the tables",
            "Success: untargeted = prediction changed from the true class; targeted = "
            "prediction is the target. Counted over test examples the evaluated model classifies correctly when "
            "clean. BIM takes `bim_steps` steps of 2.5 eps / `bim_steps`.",
        ),
        (
            "Gradient masking",
            markdown_table(
                ["model", *[f"zero input gradient, {LOSS_TEXT[k]}" for k in losses]],
                [(name, *[percent(flat[name, k]) for k in losses]) for name in models],
            )
            + "\n\nFraction of clean test examples whose input gradient of the attack loss is exactly zero: a "
            "sign-gradient attack leaves them unchanged, so a loss with a large fraction understates what an "
            "attacker can do (the margin and spread losses are flat once every hinge is inactive).",
        ),
        (
            "Paper",
            "Hinton, Sabour & Frosst (2018), Sec. 6 (matrix capsules, smallNORB): at equal clean accuracy the "
            "capsule model is significantly less vulnerable than the CNN to FGSM and BIM, untargeted and targeted; "
            "examples crafted on the CNN transfer to it like to another CNN. The paper shows figures, no table.",
        ),
        ("Settings", settings_table({**s.to_dict(), **run})),
    ]
