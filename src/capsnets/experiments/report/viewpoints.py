"""The report of the ``viewpoints`` experiment (models matched on familiar-view error; Hinton, Sabour & Frosst
2018, Sec. 5.2): its sections, tables and figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from capsnets.data import TensorData
from capsnets.experiments.matching import familiar_mask
from capsnets.experiments.report import markdown_table, percent, save_figure, settings_table

__all__ = [
    "PAPER_VIEWPOINTS",
    "STOPPED",
    "matched_role",
    "matched_summary",
    "plot_error_curves",
    "plot_examples",
    "viewpoint_results_table",
    "viewpoint_sections",
]

#: The role of the CNN trained again and stopped at the capsule model's familiar-view error.
STOPPED = "CNN, stopped"
#: Hinton, Sabour & Frosst (2018), Table 2: (novel, familiar) test error on smallNORB.
PAPER_VIEWPOINTS = {
    ("azimuth", "CNN"): (0.20, 0.037),
    ("azimuth", "capsules"): (0.135, 0.037),
    ("elevation", "CNN"): (0.178, 0.043),
    ("elevation", "capsules"): (0.123, 0.043),
}


def viewpoint_sections(
    source: str, results: dict, s: Any, names: dict, extra: dict, familiar: dict[str, Sequence[int]]
) -> list[tuple[str, str]]:
    """The viewpoints report: data, results (with the matched comparison), parameters, paper, settings.

    Args:
        results: per split ``{"records": {role: train_matched result}, "target", "sizes", "params"}``.
        s: the experiment's settings; names: role -> model name; extra: further settings-table rows.
        familiar: ``{"azimuth": field values, "elevation": indices}`` of the training views.
    """
    records = {split: r["records"] for split, r in results.items()}
    targets = {split: r["target"] for split, r in results.items()}
    params = next(iter(results.values()))["params"]
    size_rows = [
        (split, r["sizes"]["train"], r["sizes"]["familiar"], r["sizes"]["novel"]) for split, r in results.items()
    ]
    azimuths = ", ".join(f"{10 * a}°" for a in familiar["azimuth"])
    fixed = s.target_error is not None
    if fixed:
        rematch = f" Here both models match target_error = {s.target_error}."
    else:
        rematch = (
            f' When the capsule model does not reach the target, the CNN is trained again (role "{STOPPED}"; '
            f"same recipe and data order, its own initialisation), scored {s.rematch_evals_per_epoch} times per "
            "epoch, and stopped at the first score at or below the capsule model's familiar-view error: the "
            "models are then matched the other way round."
        )
    return [
        (
            "Data",
            f"Data: {source}. Azimuth split: familiar azimuths {azimuths} (field {list(familiar['azimuth'])}); "
            f"elevation split: familiar elevation indices {list(familiar['elevation'])} (30-40°). Training "
            "images: train split (its own toys) at familiar views; familiar / novel: test split (other toys).\n\n"
            + markdown_table(["split", "train images", "familiar test images", "novel test images"], size_rows),
        ),
        (
            "Results",
            viewpoint_results_table(records, targets, names, fixed) + "\n\nMatching: the CNN is kept at its "
            "lowest familiar-view test error, the target; the capsule model stops at the first epoch at or below it "
            '("target reached"), else it is kept at the epoch nearest to it. Novel-view error is never used to '
            "choose; "
            + _novel_note(s.novel_every)
            + rematch
            + "\n\n"
            + matched_summary(records, fixed)
            + _time_limit_note(records, s),
        ),
        (
            "Parameters",
            markdown_table(
                ["role", "model", "parameters"], [(r, names[r], f"{params[r]:,}") for r in ("CNN", "capsules")]
            ),
        ),
        (
            "Paper",
            "Hinton, Sabour & Frosst (2018), Sec. 5.2, Table 2 (smallNORB, models matched on familiar-view "
            "error): novel-viewpoint error reduced by about 30% (azimuth 20% -> 13.5%, elevation 17.8% -> 12.3%).",
        ),
        ("Settings", settings_table({**s.to_dict(), **extra})),
    ]


def viewpoint_results_table(records: dict, targets: dict, models: dict, fixed_target: bool) -> str:
    """One row per split and role: novel / familiar error beside the paper's, chosen epoch, target."""
    rows = []
    for split, recs in records.items():
        for role, rec in recs.items():
            novel, familiar = PAPER_VIEWPOINTS[(split, "CNN" if role == STOPPED else role)]
            target = recs["capsules"]["familiar_error"] if role == STOPPED else targets[split]
            reached = "sets it" if role == "CNN" and not fixed_target else "yes" if rec.get("reached") else "no"
            rows.append(
                (
                    split,
                    role,
                    models[role],
                    percent(rec["novel_error"]),
                    percent(rec["familiar_error"]),
                    percent(novel),
                    percent(familiar),
                    _epoch(rec["epoch"]),
                    percent(target),
                    reached,
                )
            )
    headers = [
        "split",
        "role",
        "model",
        "novel error",
        "familiar error",
        "paper novel",
        "paper familiar",
        "chosen epoch",
        "familiar target",
        "target reached",
    ]
    return markdown_table(headers, rows)


def matched_role(recs: dict, fixed_target: bool) -> str | None:
    """The CNN role matched with the capsule model on familiar-view error (``"CNN"``, STOPPED or None)."""
    if recs["capsules"].get("reached") and (recs["CNN"].get("reached") or not fixed_target):
        return "CNN"
    if recs.get(STOPPED, {}).get("reached"):
        return STOPPED
    return None


def matched_summary(records: dict, fixed_target: bool) -> str:
    """One line per split comparing the novel-view errors of the matched pair, if there is one."""
    lines = []
    for split, recs in records.items():
        caps = recs["capsules"]
        cnn_role = matched_role(recs, fixed_target)
        if cnn_role is None:
            lines.append(
                f"- {split}: no matched pair (neither model reached the other's familiar-view error), so "
                "there is no novel-view comparison."
            )
            continue
        cnn = recs[cnn_role]
        lines.append(
            f"- {split}: matched at familiar-view error {percent(caps['familiar_error'])} (capsules) / "
            f"{percent(cnn['familiar_error'])} ({cnn_role}), novel-view error "
            f"**{percent(caps['novel_error'])} (capsules) vs {percent(cnn['novel_error'])} (CNN)**."
        )
    return "Matched comparison:\n\n" + "\n".join(lines)


def _epoch(epoch) -> str:
    """An evaluation's epoch: ``3``, or ``2.50`` for one within an epoch (the "CNN, stopped" rematch)."""
    return "-" if epoch is None else f"{epoch:g}" if float(epoch).is_integer() else f"{epoch:.2f}"


def _novel_note(novel_every: int) -> str:
    """How often the novel views were scored (``novel_every``), as a sentence."""
    if novel_every == 1:
        return "it is scored at every evaluation."
    others = f"at one evaluation in {novel_every} (for the curves)" if novel_every else "at no other"
    return f"it is scored at the chosen evaluation and {others}."


def _time_limit_note(records: dict, s: Any) -> str:
    """A paragraph naming the trainings that the ``train_minutes`` limit stopped (empty if none)."""
    stopped = [
        f"{split} {role} after {rec['history'][-1]['epoch'] if rec.get('history') else 0} epochs"
        for split, recs in records.items()
        for role, rec in recs.items()
        if rec.get("time_limit")
    ]
    if not stopped:
        return ""
    return (
        f"\n\n**Stopped by the time limit** (`train_minutes` = {s.train_minutes} per model, of "
        f"{s.epochs} epochs): {'; '.join(stopped)}."
    )


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
