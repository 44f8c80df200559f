"""The report of the ``routers`` experiment (Hahn, Pyeon & Kim 2019): the answer, one table per task, the
figures of accuracy against training time and cost, the metrics and the multi-seed contrasts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from capsnets.experiments.report import markdown_table, percent, save_figure, settings_table
from capsnets.experiments.router_tasks import CNN_HEADS, REFERENCE, SPLITS
from capsnets.models.routing_zoo import HEADS

__all__ = [
    "answer",
    "plot_costs",
    "plot_curves",
    "plot_novel",
    "routers_contrasts",
    "routers_figures",
    "routers_metrics",
    "routers_sections",
    "task_table",
]


def _points(value: float | None) -> str:
    """A difference of two rates in percentage points, signed."""
    return "-" if value is None else f"{100 * value:+.2f}"


def task_table(name: str, result: dict, speed: dict) -> str:
    """One task's table: every head's kind, parameters, training speed, the task's numbers and training."""
    records = result["records"]
    headers = ["head", "kind", "parameters", "train images/s", f"ratio to {REFERENCE}"]
    if name == "fashion_mnist":
        headers += ["test accuracy"]
    elif name == "affnist":
        headers += ["held-out translated (target)", "translated MNIST test", "affNIST-style"]
    else:
        headers += ["familiar error", "novel error", "best CNN head at matched familiar error", "novel difference"]
    headers += ["training time (s)", "epochs"]
    rows = []
    for head, rec in records.items():
        row = [head, "CNN" if head in CNN_HEADS else "capsules" if head == "hvc" else "routing"]
        row += [
            None if rec is None else f"{rec['parameters']:,}",
            f"{speed[head]['images_per_s']:.1f}",
            f"{speed[head]['ratio']:.2f}",
        ]
        if rec is None:
            rows.append(row + ["not trained yet (time limit)"] + ["-"] * (len(headers) - len(row) - 1))
            continue
        if name == "fashion_mnist":
            row += [percent(rec["accuracy"])]
        elif name == "affnist":
            reached = "" if rec["reached"] else " (missed)"
            row += [percent(rec["val_accuracy"]) + reached, *(percent(v) for v in rec["tests"].values())]
        else:
            matched = rec.get("matched")
            row += [percent(rec["familiar_error"]), percent(rec["novel_error"])]
            row += (
                ["-", "-"]
                if matched is None
                else [
                    f"{matched['head']} at epoch {matched['epoch']:g}: {percent(matched['novel_error'])} novel, "
                    f"{percent(matched['familiar_error'])} familiar",
                    _points(rec["novel_error"] - matched["novel_error"]),
                ]
            )
        rows.append(row + [f"{rec['train_time_s']:.1f}", rec["epochs"]])
    return markdown_table(headers, rows)


def answer(results: dict) -> str:
    """Which routing heads beat the best CNN head, per task (this seed)."""
    lines = []
    for name in ("affnist", *SPLITS):
        if name not in results:
            continue
        records = {h: r for h, r in results[name]["records"].items() if r is not None}
        routing = {h: r for h, r in records.items() if h not in CNN_HEADS}
        if name == "affnist":
            cnn = {h: r["accuracy"] for h, r in records.items() if h in CNN_HEADS}
            if not cnn or not routing:
                continue
            best = max(cnn, key=cnn.get)
            wins = [f"{h} {percent(r['accuracy'])}" for h, r in routing.items() if r["accuracy"] > cnn[best]]
            missed = [h for h, r in records.items() if not r["reached"]]
            lines.append(
                f"- affNIST-style accuracy: best CNN head {best} {percent(cnn[best])}; routing heads above "
                f"it: {', '.join(wins) or 'none'}."
                + (f" Not at matched accuracy: {', '.join(missed)} missed the target." if missed else "")
            )
        else:
            pairs = {h: r for h, r in routing.items() if r.get("matched")}
            wins = [
                f"{h} {percent(r['novel_error'])} vs {percent(r['matched']['novel_error'])}"
                for h, r in pairs.items()
                if r["novel_error"] < r["matched"]["novel_error"]
            ]
            if pairs:
                lines.append(
                    f"- {name} novel-view error, against the best CNN head at matched familiar-view error: "
                    f"routing heads below it: {', '.join(wins) or 'none'} (of {len(pairs)} compared)."
                )
    left = sum(rec is None for r in results.values() for rec in r["records"].values())
    unfinished = (
        (
            f"**Unfinished**: {left} training(s) not started yet (`time_limit_minutes`; the viewpoint heads wait "
            f"for a finished {REFERENCE} head). With `--checkpoint-dir`, run the same command again to continue."
            "\n\n"
        )
        if left
        else ""
    )
    if not lines:
        return unfinished + "No routing head was compared with the CNN heads in this run."
    return (
        unfinished + "\n".join(lines) + "\n\nOne seed cannot separate these differences from run-to-run noise: "
        "`--seeds 0 1 2` gives each difference per seed, with its spread and sign count, in the summary report."
    )


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


def routers_metrics(results: dict, speeds: dict) -> dict[str, Any]:
    """The metrics of a run: per task and head its speed ratio, accuracy, training time and viewpoint errors."""
    metrics: dict[str, Any] = {}
    for name, result in results.items():
        for head, rec in result["records"].items():
            prefix = f"{name}_{head}"
            metrics[f"{prefix}_speed_ratio"] = speeds[name][head]["ratio"]
            if rec is None:
                continue
            metrics[f"{prefix}_accuracy"] = rec["accuracy"]
            metrics[f"{prefix}_train_time_s"] = rec["train_time_s"]
            if name in SPLITS:
                metrics[f"{prefix}_familiar_error"] = rec["familiar_error"]
                metrics[f"{prefix}_novel_error"] = rec["novel_error"]
                if rec.get("matched"):
                    metrics[f"{prefix}_matched_cnn_novel_error"] = rec["matched"]["novel_error"]
        if name == "affnist":
            cnn = [r["accuracy"] for h, r in result["records"].items() if h in CNN_HEADS and r is not None]
            if cnn:
                metrics["affnist_best_cnn_accuracy"] = max(cnn)
    metrics["trainings_left"] = sum(rec is None for r in results.values() for rec in r["records"].values())
    return metrics


def routers_contrasts(metrics: dict) -> list[tuple[str, str, str]]:
    """Each routing head against the best CNN head: affNIST-style accuracy; novel-view error at matched
    familiar-view error (for multi-seed summaries)."""
    found = []
    for head in (h for h in HEADS if h not in CNN_HEADS):
        if f"affnist_{head}_accuracy" in metrics and "affnist_best_cnn_accuracy" in metrics:
            found.append(
                (
                    f"{head} - best CNN head, affNIST-style accuracy",
                    f"affnist_{head}_accuracy",
                    "affnist_best_cnn_accuracy",
                )
            )
        for split in SPLITS:
            if f"{split}_{head}_matched_cnn_novel_error" in metrics:
                found.append(
                    (
                        f"{head} - best CNN head, {split} novel-view error at matched familiar-view error",
                        f"{split}_{head}_novel_error",
                        f"{split}_{head}_matched_cnn_novel_error",
                    )
                )
    return found


def routers_sections(
    results: dict, tasks: dict, speeds: dict, s: Any, *, device: str, seed: int, smoke: bool
) -> list[tuple[str, str]]:
    """The report's sections: the answer, one table per task, how images/s were measured, the settings."""
    sections = [("Answer: does a routing beat the CNN heads?", answer(results))]
    for name, task in tasks.items():
        target = results[name]["target"]
        note = {
            "fashion_mnist": "Test accuracy after the last epoch.",
            "affnist": f"Each head trained until its held-out translated accuracy reached "
            f'{percent(s.affnist_target)} (or {s.epochs} epochs); "missed": it did not, so it is not '
            "at matched accuracy.",
        }.get(
            name,
            f"Familiar-view target (the {REFERENCE} head's lowest error): {percent(target)}. Each routing head's "
            "novel-view error beside the best CNN head's at its familiar-view error; difference in points "
            "(negative: the routing head generalises better).",
        )
        sections.append((name, f"{task['about']}\n\n{task_table(name, results[name], speeds[name])}\n\n{note}"))
    sections.append(
        (
            "Training images/s",
            f"Measured in one run ({device}; with `--checkpoint-dir`, kept there and "
            f"reused by later runs with the same settings), batch {s.batch_size}: "
            f"{s.throughput_steps} training steps per head (forward, loss, backward, Adam; no augmentation), "
            f"heads alternated, median of {s.throughput_repeats} repeats after a warm-up; the ratio to "
            f"{REFERENCE} is the median of the per-repeat ratios. Training time excludes evaluation.",
        )
    )
    sections.append(("Settings", settings_table({**s.to_dict(), "seed": seed, "device": device, "smoke": smoke})))
    return sections


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
