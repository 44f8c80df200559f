"""The report of the ``routers`` experiment (Hahn, Pyeon & Kim 2019): the answer, one table per task, the metrics
and the multi-seed contrasts; its figures are in :mod:`.routers_figures`.
"""

from __future__ import annotations

from typing import Any

from capsnets.experiments.report import markdown_table, percent, settings_table
from capsnets.experiments.router_tasks import CNN_HEADS, REFERENCE, SPLITS
from capsnets.models.routing_zoo import HEADS

__all__ = [
    "answer",
    "routers_contrasts",
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
