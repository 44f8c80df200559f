"""The figures of the ``viewpoints`` experiment (Hinton, Sabour & Frosst 2018, Sec. 5.2): test examples at
familiar and novel views, and every model's familiar- and novel-view error through its training.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from capsnets.data import TensorData
from capsnets.experiments.report import save_figure
from capsnets.experiments.report.viewpoints import STOPPED
from capsnets.experiments.views import familiar_mask

__all__ = ["plot_error_curves", "plot_examples"]


def plot_examples(test: TensorData, out_png: Path, classes: int = 2) -> Path:
    """For ``classes`` test toys: one row across azimuths, one across elevations; novel views framed red."""
    info = test.info
    rows = []
    for label in range(min(classes, test.num_classes)):
        first = int(torch.nonzero(test.labels == label)[0])
        same = (
            (test.labels == label)
            & (info["instance"] == info["instance"][first])
            & (info["lighting"] == info["lighting"][first])
        )
        for split, axis, other in (("azimuth", "azimuth", "elevation"), ("elevation", "elevation", "azimuth")):
            pick = torch.nonzero(same & (info[other] == info[other][first])).flatten()
            pick = pick[info[axis][pick].argsort()]
            rows.append((f"{test.classes[label]}\n{split}", split, pick))
    cols = max(len(p) for _, _, p in rows)
    fig = Figure(figsize=(0.9 * cols + 1.2, 1.1 * len(rows) + 0.6), layout="constrained")
    axes = np.asarray(fig.subplots(len(rows), cols, squeeze=False))
    for r, (name, split, pick) in enumerate(rows):
        familiar = familiar_mask({k: v[pick] for k, v in info.items()}, split).tolist()
        for c, ax in enumerate(axes[r]):
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(pick):
                ax.axis("off")
                continue
            i = int(pick[c])
            ax.imshow(test.images[i, 0].cpu().numpy(), cmap="gray", interpolation="nearest")
            value = int(info[split][i]) * 10 if split == "azimuth" else 30 + 5 * int(info[split][i])
            ax.set_title(f"{value}°", fontsize=7)
            for spine in ax.spines.values():
                spine.set_color("tab:green" if familiar[c] else "tab:red")
                spine.set_linewidth(2.5)
        axes[r, 0].set_ylabel(name, fontsize=8)
    fig.suptitle("test toys: familiar views (green frame, trained on) vs novel views (red frame)")
    return save_figure(fig, out_png)


def plot_error_curves(records: dict, targets: dict, out_png: Path) -> Path:
    """Familiar / novel test error per evaluation for each split and model; the chosen evaluations are circled,
    the familiar-view target is dotted."""
    splits = list(records)
    fig = Figure(figsize=(6 * len(splits), 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(splits), squeeze=False)[0])
    colours = {"CNN": "tab:red", "capsules": "tab:blue", STOPPED: "tab:orange"}
    for ax, split in zip(axes, splits):
        for role, rec in records[split].items():
            history = rec.get("history") or []
            epochs = [h["epoch"] for h in history]
            for key, style, marker in (("familiar_error", "-", "o"), ("novel_error", "--", "^")):
                scored = [(e, h[key]) for e, h in zip(epochs, history) if h.get(key) is not None]
                ax.plot(
                    [e for e, _ in scored],
                    [100 * v for _, v in scored],
                    style,
                    marker=marker,
                    ms=2.5 if role == STOPPED else 4,
                    color=colours[role],
                    label=f"{role}, {key.split('_')[0]}",
                )
                ax.plot([rec["epoch"]], [100 * rec[key]], "o", mfc="none", ms=12, color=colours[role])
        ax.axhline(100 * targets[split], ls=":", color="grey", label="familiar-view target")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{split} split")
        ax.set_xlabel("epoch")
        ax.set_ylabel("test error (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, out_png)
