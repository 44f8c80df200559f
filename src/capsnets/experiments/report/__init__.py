"""Everything the experiments write into their reports: markdown tables, the settings table, ``report.md``
itself, the note saying how a report was made, and the prose that several experiments (or one long one) share.
Experiments compute; the words, tables and figures are put together in this package: the shared parts here,
those of one experiment in a module of its name (:mod:`.multimnist`, :mod:`.dimensions`, :mod:`.affnist`,
:mod:`.adversarial`, :mod:`.viewpoints`, :mod:`.segmentation`, :mod:`.synthesis`, :mod:`.routers`), and the
summary of a multi-seed run in :mod:`.seeds`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsnets.files import atomic_write
from capsnets.outputs import markdown_mark
from capsnets.plots import save_figure

__all__ = [
    "ExperimentResult",
    "annotate_report",
    "epoch_table",
    "markdown_table",
    "matching_note",
    "percent",
    "run_description",
    "save_figure",
    "settings_table",
    "training_metrics",
    "write_report",
]


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


def write_report(
    out: str | os.PathLike,
    title: str,
    sections: Sequence[tuple[str, str]],
    *,
    figures: Sequence[str | os.PathLike] = (),
    metrics: dict[str, Any] | None = None,
    name: str | None = None,
) -> ExperimentResult:
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
    parts.append(markdown_mark("report"))
    atomic_write(report, lambda tmp: Path(tmp).write_text("\n".join(parts) + "\n"))
    return ExperimentResult(name or title, report, figures, dict(metrics or {}))


def settings_table(settings: dict[str, Any]) -> str:
    """A two-column markdown table of an experiment's settings."""
    return markdown_table(["setting", "value"], [(k, v) for k, v in settings.items()])


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


def run_description(
    name: str, out: str | os.PathLike, *, smoke: bool, device: str, seed: int | Sequence[int], options: dict[str, Any]
) -> str:
    """Markdown saying how a report was made: the equivalent command line, and whether this is the full
    version, the smoke version, or a run with settings overridden (whose numbers are not the full run's).
    Settings named ``*_dir`` say where data is read from and do not make a run reduced. A list of seeds
    describes a multi-seed run (``--seeds``)."""

    def value(v: Any) -> str:
        return json.dumps(list(v) if isinstance(v, tuple) else v, separators=(",", ":"))

    sets = [f"{k}={value(v)}" for k, v in options.items()]
    seed_flags = ["--seed", str(seed)] if isinstance(seed, int) else ["--seeds", *map(str, seed)]
    command = " ".join(
        [
            "capsnets experiment",
            name,
            *(["--smoke"] if smoke else []),
            "--out",
            str(out),
            "--device",
            device,
            *seed_flags,
            *(f"--set '{item}'" for item in sets),
        ]
    )
    changed = [f"{k}={value(v)}" for k, v in options.items() if not k.endswith("_dir")]
    places = [f"{k}={value(v)}" for k, v in options.items() if k.endswith("_dir")]
    if smoke:
        scale = "**Smoke version**: tiny data and models; the numbers test the pipeline, not the paper."
    elif changed:
        scale = (
            "**Reduced run**: the full version with these settings overridden: "
            + ", ".join(f"`{item}`" for item in changed)
            + ". Its numbers are not the full experiment's; the Settings table lists every value."
        )
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


def training_metrics(training: dict[str, Any]) -> dict:
    """``<name>_val_accuracy`` (of the epoch chosen) and ``<name>_epochs`` of each model's
    :class:`~capsnets.experiments.runs.Training` (for the metrics, so that a multi-seed summary shows whether every
    seed compared the models at equal accuracy)."""
    metrics = {}
    for name, record in training.items():
        metrics[f"{name}_val_accuracy"] = record.chosen("val_accuracy")
        metrics[f"{name}_epochs"] = len(record.history)
    return metrics


def matching_note(training: dict[str, Any], target: float) -> str:
    """A sentence saying whether every model reached the validation ``target`` (``training``: name -> its
    :class:`~capsnets.experiments.runs.Training`), i.e. whether the comparison is at equal accuracy."""
    chosen = {name: record.chosen("val_accuracy") or 0.0 for name, record in training.items()}
    reached = ", ".join(f"{name} {percent(value)}" for name, value in chosen.items())
    missed = [name for name, value in chosen.items() if value < target]
    if not missed:
        note = f"Every model reached the {percent(target)} validation target ({reached}): compared at equal accuracy."
    else:
        note = (
            f"**Not at equal accuracy**: {' and '.join(missed)} did not reach the {percent(target)} validation "
            f"target within `max_epochs` or `train_minutes` ({reached}), so the comparison also reflects that "
            f"difference in accuracy."
        )
    curves = [
        f"{name} {', '.join(percent(h.get('val_accuracy')) for h in record.history)}"
        for name, record in training.items()
        if record.history
    ]
    return note + ("\n\nValidation accuracy after each epoch: " + "; ".join(curves) + "." if curves else "")
