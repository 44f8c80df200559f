"""The report of a multi-seed run (``capsnets experiment NAME --seeds ...``): the contrasts between models per
seed, the metrics that vary and those that do not, links to each seed's report, and the contrasts figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from capsnets.experiments.report import markdown_table, percent, save_figure

__all__ = ["mean_std", "seeds_figures", "seeds_sections", "seeds_title"]


def seeds_title(name: str, seeds: Sequence[int]) -> str:
    """``"NAME over N seeds"``."""
    return f"{name} over {len(seeds)} seed{'s' if len(seeds) != 1 else ''}"


def seeds_sections(
    seeds: list[int],
    numeric: dict[str, list[float]],
    same_text: dict[str, Any],
    other: dict[str, list[Any]],
    contrasts: Sequence[tuple[str, str, str]],
    differences: dict[str, list[float]],
) -> list[tuple[str, str]]:
    """The summary's sections: contrasts, metrics that vary between seeds, those that do not, the rest, the runs.

    Args:
        numeric: metric -> values in seed order (numeric on every seed); same_text: metric -> the value of a
            non-numeric metric that is the same on every seed; other: metric -> values (None where missing).
        contrasts: ``(label, a, b)`` of metrics compared per seed; differences: label -> ``a - b`` per seed.
    """
    sections = []
    if contrasts:
        sections.append(("Contrasts", _contrast_table(contrasts, differences, seeds, _scales(contrasts, numeric))))
    varying = {key: values for key, values in numeric.items() if len(set(values)) > 1}
    same = {key: _fraction_format(values)(values[0]) for key, values in numeric.items() if key not in varying}
    if varying:
        sections.append(("Metrics that vary between seeds", _metric_table(varying, seeds)))
    if same or same_text:
        sections.append(
            ("The same on every seed", markdown_table(["metric", "value"], [*same.items(), *same_text.items()]))
        )
    if other:
        sections.append(
            (
                "Other metrics",
                markdown_table(
                    ["metric", *(f"seed {s}" for s in seeds)], [(key, *values) for key, values in other.items()]
                ),
            )
        )
    sections.append(("Runs", "\n".join(f"- seed {s}: [seed-{s}/report.md](seed-{s}/report.md)" for s in seeds)))
    return sections


def seeds_figures(
    seeds: list[int],
    numeric: dict[str, list[float]],
    contrasts: Sequence[tuple[str, str, str]],
    differences: dict[str, list[float]],
    out: Path,
) -> list[Path]:
    """``contrasts.png`` (the per-seed contrasts) when there are contrasts."""
    if not contrasts:
        return []
    return [_plot_contrasts(differences, _scales(contrasts, numeric), seeds, out / "contrasts.png")]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _fraction_format(values: Sequence[float]):
    """Percentages for fractions (accuracies, errors, rates), thousands separators for integers."""
    if all(isinstance(v, int) for v in values):  # counts; their mean need not be whole
        return lambda v: "n/a" if v != v else f"{v:,.0f}" if float(v).is_integer() else f"{v:,.2f}"
    if all(0.0 <= v <= 1.0 for v in values):
        return percent
    return lambda v: f"{v:.4g}"


def _metric_table(numeric: dict[str, list[float]], seeds: list[int]) -> str:
    rows = []
    for key, values in numeric.items():
        fmt = _fraction_format(values)
        mean, std = mean_std(values)
        spread = "n/a" if std != std else (percent(std) if fmt is percent else f"{std:.4g}")
        rows.append((key, *map(fmt, values), fmt(mean), spread, f"{fmt(min(values))} - {fmt(max(values))}"))
    return markdown_table(["metric", *(f"seed {s}" for s in seeds), "mean", "std", "range"], rows)


def _scales(contrasts, numeric: dict[str, list[float]]) -> dict[str, float]:
    """100 for a contrast of two fractions (shown in percentage points), else 1 (the metric's unit)."""
    return {label: 100.0 if all(0.0 <= v <= 1.0 for v in numeric[a] + numeric[b]) else 1.0 for label, a, b in contrasts}


def _contrast_table(contrasts, differences: dict[str, list[float]], seeds: list[int], scales: dict[str, float]) -> str:
    rows = []
    for label, _, _ in contrasts:
        scale = scales[label]

        def show(value: float, sign: str = "+", scale: float = scale) -> str:
            return "n/a" if value != value else f"{scale * value:{sign}.2f}" if scale == 100.0 else f"{value:{sign}.4g}"

        diffs = differences[label]
        mean, std = mean_std(diffs)
        above = sum(d > 0 for d in diffs)
        below = sum(d < 0 for d in diffs)
        rows.append((label, *map(show, diffs), show(mean), show(std, ""), f"{above} above, {below} below zero"))
    table = markdown_table(["contrast", *(f"seed {s}" for s in seeds), "mean", "std", "sign"], rows)
    return (
        table + "\n\nEach contrast is `A - B` on the same seed (the metric keys are in `seeds.json`); "
        "differences of fractions (accuracies, errors, rates) are in percentage points, others in the "
        "metric's own unit. "
        f"With {len(seeds)} seed{'s' if len(seeds) != 1 else ''} the standard deviation is a rough guide, "
        "not a test: a difference whose sign changes between seeds is not established."
    )


def _plot_contrasts(
    differences: dict[str, list[float]], scales: dict[str, float], seeds: list[int], out_png: Path
) -> Path:
    labels = [f"{label}{' (points)' if scales[label] == 100.0 else ''}" for label in differences]
    fig = Figure(figsize=(8, 1.2 + 0.35 * len(labels)), layout="constrained")
    ax = fig.subplots()
    for row, label in enumerate(differences):
        values = scales[label] * np.asarray(differences[label], dtype=float)
        ax.plot(values, np.full(len(values), row), "o", color="tab:blue", alpha=0.7)
        ax.plot([values.mean()], [row], "|", color="black", ms=14, mew=2)
    ax.axvline(0.0, color="grey", lw=1)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("A - B (fractions in percentage points); dots: one seed each, bar: the mean")
    ax.set_title(f"Contrasts over seeds {', '.join(map(str, seeds))}")
    return save_figure(fig, out_png)
