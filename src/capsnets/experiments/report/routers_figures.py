"""The figures of the ``routers`` experiment (Hahn, Pyeon & Kim 2019): accuracy against training time, accuracy
against parameters and training speed, and the novel-view error of every head at matched familiar-view error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from capsnets.experiments.report import save_figure
from capsnets.experiments.router_tasks import CNN_HEADS, REFERENCE, SPLITS

__all__ = ["plot_costs", "plot_curves", "plot_novel", "routers_figures"]


def plot_curves(results: dict, out_png: Path) -> Path:
    """Accuracy at each evaluation against training time (evaluation excluded), one panel per task."""
    labels = {"fashion_mnist": "test accuracy", "affnist": "held-out translated accuracy"}
    fig = Figure(figsize=(5 * len(results), 4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(results), squeeze=False)[0])
    for ax, (name, result) in zip(axes, results.items()):
        for k, (head, rec) in enumerate(result["records"].items()):
            if rec is None or not rec["history"]:
                continue
            time_s = np.cumsum([h.get("time_s", 0.0) for h in rec["history"]])
            ax.plot(
                time_s,
                [100 * h["accuracy"] for h in rec["history"]],
                "--" if head in CNN_HEADS else "-",
                marker="o",
                ms=3,
                color=f"C{k}",
                label=head,
            )
        ax.set_title(name)
        ax.set_xlabel("training time (s)")
        ax.set_ylabel(f"{labels.get(name, 'familiar-view accuracy')} (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return save_figure(fig, out_png)


def plot_costs(results: dict, speeds: dict, out_png: Path) -> Path:
    """Each task's headline accuracy against parameters and against training images/s, and the ratio to the
    reference's images/s."""
    labels = {"fashion_mnist": "test", "affnist": "affNIST-style"}
    fig = Figure(figsize=(15, 3.6 * len(results)), layout="constrained")
    axes = np.asarray(fig.subplots(len(results), 3, squeeze=False))
    for row, (name, result) in zip(axes, results.items()):
        heads = list(result["records"])
        ratios = [speeds[name][h]["ratio"] for h in heads]
        row[2].bar(range(len(heads)), ratios, color=["tab:grey" if h in CNN_HEADS else "tab:blue" for h in heads])
        row[2].set_xticks(range(len(heads)), heads, rotation=40, ha="right", fontsize=7)
        row[2].axhline(1.0, color="black", lw=0.8)
        row[2].set_ylabel(f"training images/s / {REFERENCE}")
        for ax, key, xlabel in ((row[0], "parameters", "parameters"), (row[1], "images_per_s", "training images/s")):
            for head, rec in result["records"].items():
                if rec is None:
                    continue
                x = rec["parameters"] if key == "parameters" else speeds[name][head]["images_per_s"]
                ax.plot(
                    [x],
                    [100 * rec["accuracy"]],
                    "s" if head in CNN_HEADS else "o",
                    color="tab:grey" if head in CNN_HEADS else "tab:blue",
                )
                ax.annotate(head, (x, 100 * rec["accuracy"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
            ax.set_xscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{name}: {labels.get(name, 'novel-view')} accuracy (%)")
            ax.grid(alpha=0.3)
    return save_figure(fig, out_png)


def plot_novel(results: dict, out_png: Path) -> Path:
    """Per split: each head's novel-view error, and for the routing heads the best CNN head's at their
    familiar-view error."""
    fig = Figure(figsize=(6 * len(results), 4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(results), squeeze=False)[0])
    for ax, (split, result) in zip(axes, results.items()):
        heads = [h for h, r in result["records"].items() if r is not None]
        x = np.arange(len(heads))
        own = [100 * result["records"][h]["novel_error"] for h in heads]
        matched = [100 * (result["records"][h].get("matched") or {}).get("novel_error", np.nan) for h in heads]
        ax.bar(x - 0.2, own, 0.4, label="head", color=["tab:grey" if h in CNN_HEADS else "tab:blue" for h in heads])
        ax.bar(x + 0.2, matched, 0.4, label="best CNN head at its familiar-view error", color="tab:orange")
        ax.set_xticks(x, heads, rotation=40, ha="right", fontsize=7)
        ax.set_ylabel("novel-view test error (%)")
        ax.set_title(f"{split} split")
        ax.legend(fontsize=7)
    return save_figure(fig, out_png)


def routers_figures(results: dict, speeds: dict, out: Path) -> list[Path]:
    """``accuracy_vs_time.png``, ``accuracy_vs_cost.png`` and, with a viewpoint split, ``novel_view_error.png``."""
    figures = [
        plot_curves(results, out / "accuracy_vs_time.png"),
        plot_costs(results, speeds, out / "accuracy_vs_cost.png"),
    ]
    splits = {name: r for name, r in results.items() if name in SPLITS and r["target"] is not None}
    if splits:
        figures.append(plot_novel(splits, out / "novel_view_error.png"))
    return figures
