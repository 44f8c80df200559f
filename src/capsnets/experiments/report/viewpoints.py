"""The report of the ``viewpoints`` experiment (models matched on familiar-view error; Hinton, Sabour & Frosst
2018, Sec. 5.2): its sections and tables; its figures are in :mod:`.viewpoints_figures`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from capsnets.experiments.report import markdown_table, percent, settings_table

__all__ = [
    "PAPER_VIEWPOINTS",
    "STOPPED",
    "matched_role",
    "matched_summary",
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
        results: per split ``{"records": {role: fit_matched result}, "target", "sizes", "params"}``.
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
            "same recipe and data order, its own initialisation) and stopped at the first epoch at or below the "
            "capsule model's familiar-view error: the models are then matched the other way round."
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
            + _novel_note(s.novel_each_epoch)
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


def _novel_note(each_epoch: bool) -> str:
    """How often the novel views were scored (``novel_each_epoch``), as a sentence."""
    return "it is scored at every epoch." if each_epoch else "it is scored at the chosen epoch only."


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
