"""Everything the experiments write into their reports: markdown tables, the settings table, ``report.md``
itself, the note saying how a report was made, and the prose that several experiments (or one long one) share.
Experiments compute; the words and tables are put together here.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from capsnets.files import atomic_write
from capsnets.plots import save_figure

__all__ = ["ExperimentResult", "annotate_report", "epoch_table", "markdown_table", "matching_note", "percent",
           "run_description", "save_figure", "settings_table", "training_cell", "training_metrics",
           "matched_role", "matched_summary", "viewpoint_results_table", "viewpoint_sections", "write_report"]


@dataclass
class ExperimentResult:
    """What an experiment produced: its report, its figures and its headline numbers (JSON-safe)."""

    name: str
    report: Path
    figures: list[Path] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    #: checkpoint names of the trainings ``train_minutes`` cut short (set by :func:`run_experiment`); a second
    #: run with the same ``checkpoint_dir`` continues them
    cut_short: list[str] = field(default_factory=list)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; floats are shown with 4 significant digits, ``None`` as ``-``."""

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def percent(value: float | None) -> str:
    """``0.052`` -> ``"5.20%"`` (``"n/a"`` for None / NaN)."""
    return "n/a" if value is None or value != value else f"{100 * value:.2f}%"


def write_report(out: str | os.PathLike, title: str, sections: Sequence[tuple[str, str]], *,
                 figures: Sequence[str | os.PathLike] = (), metrics: dict[str, Any] | None = None,
                 name: str | None = None) -> ExperimentResult:
    """Write ``out/report.md`` atomically: ``# title``, then each ``(heading, markdown)`` section, then
    the figures (embedded by paths relative to ``out``). Returns the :class:`ExperimentResult`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"# {title}", ""]
    for heading, body in sections:
        parts += [f"## {heading}", "", body.strip(), ""]
    figures = [Path(f) for f in figures]
    if figures:
        parts += ["## Figures", ""]
        for fig in figures:
            rel = os.path.relpath(fig, out)
            parts += [f"![{fig.stem}]({rel})", ""]
    report = out / "report.md"
    atomic_write(report, lambda tmp: Path(tmp).write_text("\n".join(parts)))
    return ExperimentResult(name or title, report, figures, dict(metrics or {}))


def settings_table(settings: dict[str, Any]) -> str:
    """A two-column markdown table of an experiment's settings."""
    return markdown_table(["setting", "value"], [(k, v) for k, v in settings.items()])


def training_cell(training: str, history: Sequence[dict], loaded: bool) -> str:
    """A report's training cell: ``training`` (e.g. ``"7 of 50 (time limit) x 60,000 pairs"``); for a model
    loaded from a checkpoint ``"loaded"``, followed by ``training`` when the checkpoint kept the history."""
    if not loaded:
        return training
    return f"loaded ({training})" if history else "loaded"


def epoch_table(histories: dict[str, Sequence[dict]], columns: Sequence[tuple[str, str, Callable[[Any], str]]]) -> str:
    """A markdown table with one row per epoch and, for each model in ``histories`` (name -> per-epoch records,
    as :func:`~capsnets.engine.fit` records them), one column per
    ``(record key, header, format)``; "-" where a record has no such entry or a model trained fewer epochs."""
    headers = ["epoch"] + [f"{name} {header}" for name in histories for _, header, _ in columns]
    rows = []
    for e in range(max((len(h) for h in histories.values()), default=0)):
        row = [e + 1]
        for history in histories.values():
            record = history[e] if e < len(history) else {}
            row += [fmt(record[key]) if key in record else "-" for key, _, fmt in columns]
        rows.append(row)
    return markdown_table(headers, rows)


def run_description(name: str, out: str | os.PathLike, *, smoke: bool, device: str, seed: int | Sequence[int],
                    options: dict[str, Any]) -> str:
    """Markdown saying how a report was made: the equivalent command line, and whether this is the full
    version, the smoke version, or a run with settings overridden (whose numbers are not the full run's).
    Settings named ``*_dir`` say where data is read from and do not make a run reduced. A list of seeds
    describes a multi-seed run (``--seeds``)."""

    def value(v: Any) -> str:
        return json.dumps(list(v) if isinstance(v, tuple) else v, separators=(",", ":"))

    sets = [f"{k}={value(v)}" for k, v in options.items()]
    seed_flags = ["--seed", str(seed)] if isinstance(seed, int) else ["--seeds", *map(str, seed)]
    command = " ".join(["capsnets experiment", name, *(["--smoke"] if smoke else []), "--out", str(out),
                        "--device", device, *seed_flags, *(f"--set '{item}'" for item in sets)])
    changed = [f"{k}={value(v)}" for k, v in options.items() if not k.endswith("_dir")]
    places = [f"{k}={value(v)}" for k, v in options.items() if k.endswith("_dir")]
    if smoke:
        scale = "**Smoke version**: tiny data and models; the numbers test the pipeline, not the paper."
    elif changed:
        scale = ("**Reduced run**: the full version with these settings overridden: "
                 + ", ".join(f"`{item}`" for item in changed)
                 + ". Its numbers are not the full experiment's; the Settings table lists every value.")
    else:
        scale = "Full version (the experiment's default settings)."
    if places and not smoke:
        scale += " Data read from " + ", ".join(f"`{item}`" for item in places) + "."
    return f"{scale}\n\nCommand: `{command}`"


def annotate_report(report: Path, text: str) -> None:
    """Insert ``text`` as a paragraph after the title line of ``report`` (rewritten atomically)."""
    title, _, rest = report.read_text().partition("\n")
    atomic_write(report, lambda tmp: Path(tmp).write_text(f"{title}\n\n{text}\n{rest}"))


# --------------------------------------------------------------------------------------------------------
# Models compared at equal validation accuracy (adversarial, affnist)


def training_metrics(training: dict[str, dict]) -> dict:
    """``<name>_val_accuracy`` and ``<name>_epochs`` of each :meth:`~capsnets.experiments.training.Checkpoints.fit_or_load`
    record (for the metrics, so a multi-seed summary shows whether every seed compared the models at equal
    accuracy)."""
    metrics = {}
    for name, record in training.items():
        metrics[f"{name}_val_accuracy"] = record["val_accuracy"]
        metrics[f"{name}_epochs"] = record["trained_epochs"]
    return metrics


def matching_note(training: dict[str, dict], target: float) -> str:
    """A sentence saying whether every model reached the validation ``target`` (``training``: name ->
    :func:`~capsnets.experiments.training.train_to_accuracy` record), i.e. whether the comparison is at equal
    accuracy."""
    reached = ", ".join(f"{name} {percent(record['val_accuracy'])}" for name, record in training.items())
    missed = [name for name, record in training.items() if record["val_accuracy"] < target]
    if not missed:
        note = f"Every model reached the {percent(target)} validation target ({reached}): compared at equal accuracy."
    else:
        note = (f"**Not at equal accuracy**: {' and '.join(missed)} did not reach the {percent(target)} validation "
                f"target within `max_epochs` or `train_minutes` ({reached}), so the comparison also reflects that "
                f"difference in accuracy.")
    curves = [f"{name} {', '.join(percent(h['val_accuracy']) for h in record['history'])}"
              for name, record in training.items() if record.get("history")]
    return note + ("\n\nValidation accuracy after each epoch: " + "; ".join(curves) + "." if curves else "")


# --------------------------------------------------------------------------------------------------------
# Models matched on familiar-view error (viewpoints)

#: The role of the CNN trained again and stopped at the capsule model's familiar-view error.
STOPPED = "CNN, stopped"
#: Hinton, Sabour & Frosst (2018), Table 2: (novel, familiar) test error on smallNORB.
PAPER_VIEWPOINTS = {("azimuth", "CNN"): (0.20, 0.037), ("azimuth", "capsules"): (0.135, 0.037),
                    ("elevation", "CNN"): (0.178, 0.043), ("elevation", "capsules"): (0.123, 0.043)}


def viewpoint_sections(source: str, results: dict, s: Any, names: dict, extra: dict,
                       familiar: dict[str, Sequence[int]]) -> list[tuple[str, str]]:
    """The viewpoints report: data, results (with the matched comparison), parameters, paper, settings.

    Args:
        results: per split ``{"records": {role: train_matched result}, "target", "sizes", "params"}``.
        s: the experiment's settings; names: role -> model name; extra: further settings-table rows.
        familiar: ``{"azimuth": field values, "elevation": indices}`` of the training views.
    """
    records = {split: r["records"] for split, r in results.items()}
    targets = {split: r["target"] for split, r in results.items()}
    params = next(iter(results.values()))["params"]
    size_rows = [(split, r["sizes"]["train"], r["sizes"]["familiar"], r["sizes"]["novel"])
                 for split, r in results.items()]
    azimuths = ", ".join(f"{10 * a}°" for a in familiar["azimuth"])
    fixed = s.target_error is not None
    if fixed:
        rematch = f" Here both models match target_error = {s.target_error}."
    else:
        rematch = (f" When the capsule model does not reach the target, the CNN is trained again (role \"{STOPPED}\"; "
                   f"same recipe and data order, its own initialisation), scored {s.rematch_evals_per_epoch} times per "
                   "epoch, and stopped at the first score at or below the capsule model's familiar-view error: the "
                   "models are then matched the other way round.")
    return [
        ("Data", f"Data: {source}. Azimuth split: familiar azimuths {azimuths} (field {list(familiar['azimuth'])}); "
                 f"elevation split: familiar elevation indices {list(familiar['elevation'])} (30-40°). Training "
                 "images: train split (its own toys) at familiar views; familiar / novel: test split (other toys).\n\n"
         + markdown_table(["split", "train images", "familiar test images", "novel test images"], size_rows)),
        ("Results", viewpoint_results_table(records, targets, names, fixed) + "\n\nMatching: the CNN is kept at its "
         "lowest familiar-view test error, the target; the capsule model stops at the first epoch at or below it "
         "(\"target reached\"), else it is kept at the epoch nearest to it. Novel-view error is never used to "
         "choose; " + _novel_note(s.novel_every) + rematch + "\n\n" + matched_summary(records, fixed)
         + _time_limit_note(records, s)),
        ("Parameters", markdown_table(["role", "model", "parameters"],
                                      [(r, names[r], f"{params[r]:,}") for r in ("CNN", "capsules")])),
        ("Paper", "Hinton, Sabour & Frosst (2018), Sec. 5.2, Table 2 (smallNORB, models matched on familiar-view "
         "error): novel-viewpoint error reduced by about 30% (azimuth 20% -> 13.5%, elevation 17.8% -> 12.3%)."),
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
            rows.append((split, role, models[role], percent(rec["novel_error"]), percent(rec["familiar_error"]),
                         percent(novel), percent(familiar), _epoch(rec["epoch"]), percent(target), reached))
    headers = ["split", "role", "model", "novel error", "familiar error", "paper novel", "paper familiar",
               "chosen epoch", "familiar target", "target reached"]
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
            lines.append(f"- {split}: no matched pair (neither model reached the other's familiar-view error), so "
                         "there is no novel-view comparison.")
            continue
        cnn = recs[cnn_role]
        lines.append(f"- {split}: matched at familiar-view error {percent(caps['familiar_error'])} (capsules) / "
                     f"{percent(cnn['familiar_error'])} ({cnn_role}), novel-view error "
                     f"**{percent(caps['novel_error'])} (capsules) vs {percent(cnn['novel_error'])} (CNN)**.")
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
    stopped = [f"{split} {role} after {rec['history'][-1]['epoch'] if rec.get('history') else 0} epochs"
               for split, recs in records.items() for role, rec in recs.items() if rec.get("time_limit")]
    if not stopped:
        return ""
    return (f"\n\n**Stopped by the time limit** (`train_minutes` = {s.train_minutes} per model, of "
            f"{s.epochs} epochs): {'; '.join(stopped)}.")
