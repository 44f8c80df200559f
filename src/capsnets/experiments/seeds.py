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
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capsnets.engine.runtime import resolve_device
from capsnets.experiments.common import check_seed, get_contrasts, run_experiment
from capsnets.experiments.report import ExperimentResult, annotate_report, run_description, write_report
from capsnets.experiments.report.seeds import mean_std, seeds_figures, seeds_sections, seeds_title
from capsnets.files import atomic_write
from capsnets.outputs import json_header

__all__ = ["run_experiment_seeds", "summarise_seeds"]


def run_experiment_seeds(
    name: str,
    out: str | os.PathLike,
    seeds: Sequence[int],
    *,
    smoke: bool = False,
    device: str = "auto",
    data_dir: str | os.PathLike | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    **options,
) -> ExperimentResult:
    """Run experiment ``name`` for each seed in ``seeds`` (into ``out/seed-N``) and write the summary report
    ``out/report.md``; returns its :class:`ExperimentResult` (metrics: ``"<metric>_mean"`` and ``"_std"``)."""
    seeds = _check_seeds(seeds)
    out, device = Path(out), str(resolve_device(device))
    runs = {}
    for seed in seeds:
        ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / f"seed-{seed}"
        runs[seed] = run_experiment(
            name,
            out / f"seed-{seed}",
            smoke=smoke,
            device=device,
            seed=seed,
            data_dir=data_dir,
            checkpoint_dir=ckpt,
            **options,
        )
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


def summarise_seeds(
    name: str, out: str | os.PathLike, metrics: dict[int, dict[str, Any]], *, description: str = ""
) -> ExperimentResult:
    """Write ``out/report.md``, ``out/seeds.json`` and ``out/contrasts.png`` from each seed's metrics."""
    out = Path(out)
    seeds = list(metrics)
    numeric, same_text, other = _split_metrics(metrics)
    found = dict.fromkeys(c for s in seeds for c in get_contrasts(name)(metrics[s]))
    contrasts = [(label, a, b) for label, a, b in found if a in numeric and b in numeric]
    differences = {label: [metrics[s][a] - metrics[s][b] for s in seeds] for label, a, b in contrasts}
    sections = seeds_sections(seeds, numeric, same_text, other, contrasts, differences)
    figures = seeds_figures(seeds, numeric, contrasts, differences, out)
    summary = {
        f"{key}_{stat}": value
        for key, values in numeric.items()
        for stat, value in zip(("mean", "std"), mean_std(values))
    }
    payload = {
        **json_header("seeds"),
        "experiment": name,
        "seeds": seeds,
        "metrics": {str(s): m for s, m in metrics.items()},
        "contrasts": {label: {"a": a, "b": b, "differences": differences[label]} for label, a, b in contrasts},
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "seeds.json", lambda tmp: Path(tmp).write_text(json.dumps(payload, indent=1, default=str)))
    result = write_report(out, seeds_title(name, seeds), sections, figures=figures, metrics=summary, name=name)
    if description:
        annotate_report(result.report, description)
    return result


def _split_metrics(
    metrics: dict[int, dict[str, Any]],
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
