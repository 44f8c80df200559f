"""The report of the ``adversarial`` experiment (Hinton, Sabour & Frosst 2018, Sec. 6): success-rate tables and
figures of FGSM and BIM against capsules and a CNN.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from capsnets.experiments.report import markdown_table, percent, save_figure

__all__ = ["LOSS_TEXT", "plot_success_rates", "success_rate_table"]

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
