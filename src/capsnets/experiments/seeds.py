"""Run an experiment once per seed and summarise the spread (``capsnets experiment NAME --seeds 0 1 2``).

One run per model cannot tell a difference between a capsule model and a CNN from run-to-run noise: two
CNN runs of the CPU-scale viewpoints comparison differed by 5-11 points of novel-view error at the same
familiar-view error. :func:`run_experiment_seeds` runs the experiment once per seed, each into
``out/seed-N/`` (its own full report; checkpoints under ``checkpoint_dir/seed-N/``, so a rerun loads what
an earlier one trained), and writes ``out/report.md``: every headline metric per seed with its mean,
standard deviation and range; the experiment's *contrasts* (capsules minus CNN on the same seed) with the
number of seeds on which the sign held; a figure of the per-seed contrasts; and ``out/seeds.json``.

A seed changes everything the experiment draws at random: initialisation, data order, and the generated
validation and test sets where the experiment draws them from its seed.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure

from capsnets.engine.runtime import resolve_device
from capsnets.experiments.common import check_seed, get_contrasts, run_experiment
from capsnets.experiments.report import (ExperimentResult, annotate_report, markdown_table, percent, run_description,
                                         save_figure, write_report)
from capsnets.io import atomic_write

__all__ = ["run_experiment_seeds", "summarise_seeds"]


def run_experiment_seeds(name: str, out: str | os.PathLike, seeds: Sequence[int], *, smoke: bool = False,
                         device: str = "auto", data_dir: str | os.PathLike | None = None,
                         checkpoint_dir: str | os.PathLike | None = None, **options) -> ExperimentResult:
    """Run experiment ``name`` for each seed in ``seeds`` (into ``out/seed-N``) and write the summary report
    ``out/report.md``; returns its :class:`ExperimentResult` (metrics: ``"<metric>_mean"`` and ``"_std"``)."""
    seeds = _check_seeds(seeds)
    out, device = Path(out), str(resolve_device(device))
    runs = {}
    for seed in seeds:
        ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / f"seed-{seed}"
        runs[seed] = run_experiment(name, out / f"seed-{seed}", smoke=smoke, device=device, seed=seed,
                                    data_dir=data_dir, checkpoint_dir=ckpt, **options)
    description = run_description(name, out, smoke=smoke, device=device, seed=seeds, options=options)
    summary = summarise_seeds(name, out, {seed: r.metrics for seed, r in runs.items()}, description=description)
    summary.cut_short = [f"seed-{seed}/{key}" for seed, r in runs.items() for key in r.cut_short]
    return summary


def _check_seeds(seeds: Sequence[int]) -> list[int]:
    seeds = list(seeds)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of ints, got {seeds!r}")
    for seed in seeds:
        check_seed(seed)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct (each seed is one run), got {seeds!r}")
    return seeds


def summarise_seeds(name: str, out: str | os.PathLike, metrics: dict[int, dict[str, Any]], *,
                    description: str = "") -> ExperimentResult:
    """Write ``out/report.md``, ``out/seeds.json`` and ``out/contrasts.png`` from each seed's metrics."""
    out = Path(out)
    seeds = list(metrics)
    numeric, same_text, other = _split_metrics(metrics)
    sections = []
    found = dict.fromkeys(c for s in seeds for c in get_contrasts(name)(metrics[s]))
    contrasts = [(label, a, b) for label, a, b in found if a in numeric and b in numeric]
    differences = {label: [metrics[s][a] - metrics[s][b] for s in seeds] for label, a, b in contrasts}
    scales = _scales(contrasts, numeric)
    if contrasts:
        sections.append(("Contrasts", _contrast_table(contrasts, differences, seeds, scales)))
    varying = {key: values for key, values in numeric.items() if len(set(values)) > 1}
    same = {key: _fraction_format(values)(values[0]) for key, values in numeric.items() if key not in varying}
    if varying:
        sections.append(("Metrics that vary between seeds", _metric_table(varying, seeds)))
    if same or same_text:
        sections.append(("The same on every seed", markdown_table(["metric", "value"],
                                                                  [*same.items(), *same_text.items()])))
    if other:
        sections.append(("Other metrics", markdown_table(["metric", *(f"seed {s}" for s in seeds)],
                                                         [(key, *values) for key, values in other.items()])))
    sections.append(("Runs", "\n".join(f"- seed {s}: [seed-{s}/report.md](seed-{s}/report.md)" for s in seeds)))
    figures = [_plot_contrasts(differences, scales, seeds, out / "contrasts.png")] if contrasts else []
    summary = {f"{key}_{stat}": value for key, values in numeric.items()
               for stat, value in zip(("mean", "std"), _mean_std(values))}
    payload = {"experiment": name, "seeds": seeds, "metrics": {str(s): m for s, m in metrics.items()},
               "contrasts": {label: {"a": a, "b": b, "differences": differences[label]}
                             for label, a, b in contrasts}}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "seeds.json", lambda tmp: Path(tmp).write_text(json.dumps(payload, indent=1, default=str)))
    title = f"{name} over {len(seeds)} seed{'s' if len(seeds) != 1 else ''}"
    result = write_report(out, title, sections, figures=figures, metrics=summary, name=name)
    if description:
        annotate_report(result.report, description)
    return result


def _split_metrics(metrics: dict[int, dict[str, Any]]
                   ) -> tuple[dict[str, list[Any]], dict[str, Any], dict[str, list[Any]]]:
    """Split the metrics into: numeric on every seed (values in seed order); not numeric but the same on
    every seed (the value); the rest (values in seed order, None where a seed lacks the metric)."""
    seeds = list(metrics)
    keys = list(dict.fromkeys(k for m in metrics.values() for k in m))
    numeric, same, other = {}, {}, {}
    for key in keys:
        values = [metrics[s].get(key) for s in seeds]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            numeric[key] = values
        elif len({json.dumps(v, default=str) for v in values}) == 1:
            same[key] = values[0]
        else:
            other[key] = values
    return numeric, same, other


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
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
        mean, std = _mean_std(values)
        spread = "n/a" if std != std else (percent(std) if fmt is percent else f"{std:.4g}")
        rows.append((key, *map(fmt, values), fmt(mean), spread, f"{fmt(min(values))} - {fmt(max(values))}"))
    return markdown_table(["metric", *(f"seed {s}" for s in seeds), "mean", "std", "range"], rows)


def _scales(contrasts, numeric: dict[str, list[float]]) -> dict[str, float]:
    """100 for a contrast of two fractions (shown in percentage points), else 1 (the metric's unit)."""
    return {label: 100.0 if all(0.0 <= v <= 1.0 for v in numeric[a] + numeric[b]) else 1.0
            for label, a, b in contrasts}


def _contrast_table(contrasts, differences: dict[str, list[float]], seeds: list[int],
                    scales: dict[str, float]) -> str:
    rows = []
    for label, a, b in contrasts:
        scale = scales[label]

        def show(value: float, sign: str = "+") -> str:
            return "n/a" if value != value else f"{scale * value:{sign}.2f}" if scale == 100.0 else f"{value:{sign}.4g}"

        diffs = differences[label]
        mean, std = _mean_std(diffs)
        above = sum(d > 0 for d in diffs)
        below = sum(d < 0 for d in diffs)
        rows.append((label, *map(show, diffs), show(mean), show(std, ""), f"{above} above, {below} below zero"))
    table = markdown_table(["contrast", *(f"seed {s}" for s in seeds), "mean", "std", "sign"], rows)
    return (table + "\n\nEach contrast is `A - B` on the same seed (the metric keys are in `seeds.json`); "
            "differences of fractions (accuracies, errors, rates) are in percentage points, others in the "
            "metric's own unit. "
            f"With {len(seeds)} seed{'s' if len(seeds) != 1 else ''} the standard deviation is a rough guide, "
            "not a test: a difference whose sign changes between seeds is not established.")


def _plot_contrasts(differences: dict[str, list[float]], scales: dict[str, float], seeds: list[int],
                    out_png: Path) -> Path:
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
