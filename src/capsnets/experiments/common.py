"""What every paper experiment shares: a registry and a report writer (training helpers: :mod:`.training`).

An experiment is a function registered under a name::

    @register_experiment("multimnist")
    def run(out: Path, *, smoke: bool = False, device: str = "auto", seed: int = 0,
            data_dir: str | None = None, checkpoint_dir: str | None = None, **options) -> ExperimentResult:
        ...
        return write_report(out, "MultiMNIST", [("Results", markdown_table(headers, rows))],
                            figures=[png], metrics={"capsnet_error": 0.05})

``out`` is created by :func:`run_experiment` before the function is called. ``smoke`` asks for a tiny
CPU-sized version (minutes); ``options`` are experiment-specific knobs (tests use them to shrink runs
further). :mod:`capsnets.experiments.training` trains and scores models on tensors that already live on
the device (generated data sets that the engine's trainer does not know).
"""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from capsnets._files import atomic_write
from capsnets.engine.runtime import resolve_device, seed_everything
from capsnets.experiments.training import recording_cut_short

ExperimentFn = Callable[..., "ExperimentResult"]
#: ``metrics -> [(label, key_a, key_b), ...]``: the differences ``metrics[key_a] - metrics[key_b]`` that a
#: multi-seed summary reports per seed (e.g. capsules minus CNN on the same test set).
ContrastFn = Callable[[dict[str, Any]], list[tuple[str, str, str]]]
_EXPERIMENTS: dict[str, ExperimentFn] = {}
_CONTRASTS: dict[str, ContrastFn] = {}

# --------------------------------------------------------------------------------------------------------
# Registry


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


def register_experiment(name: str, *, contrasts: ContrastFn | None = None) -> Callable[[ExperimentFn], ExperimentFn]:
    """Decorator registering an experiment function under ``name`` (see the module docstring).

    ``contrasts`` names the comparisons a multi-seed run summarises (:mod:`capsnets.experiments.seeds`)."""

    def decorate(fn: ExperimentFn) -> ExperimentFn:
        if name in _EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is already registered")
        _EXPERIMENTS[name] = fn
        if contrasts is not None:
            _CONTRASTS[name] = contrasts
        return fn

    return decorate


def get_contrasts(name: str) -> ContrastFn:
    """The contrast function registered with experiment ``name`` (one returning no contrasts if none was)."""
    get_experiment(name)
    return _CONTRASTS.get(name, lambda metrics: [])


def list_experiments() -> list[str]:
    """Names of the registered experiments, sorted."""
    return sorted(_EXPERIMENTS)


def get_experiment(name: str) -> ExperimentFn:
    """The function registered as ``name``; an unknown name raises ``ValueError`` listing the known ones."""
    if name not in _EXPERIMENTS:
        close = difflib.get_close_matches(name, _EXPERIMENTS, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown experiment {name!r}.{hint} Known experiments: {', '.join(list_experiments())}")
    return _EXPERIMENTS[name]


def run_experiment(name: str, out: str | os.PathLike, *, smoke: bool = False, device: str = "auto", seed: int = 0,
                   data_dir: str | os.PathLike | None = None, checkpoint_dir: str | os.PathLike | None = None,
                   **options) -> ExperimentResult:
    """Seed everything, create ``out`` and run the experiment ``name`` (its report goes to ``out/report.md``)."""
    fn = get_experiment(name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    device = str(resolve_device(device))
    with recording_cut_short() as cut_short:
        result = fn(out, smoke=smoke, device=device, seed=seed, data_dir=data_dir, checkpoint_dir=checkpoint_dir,
                    **options)
    result.cut_short = cut_short
    _annotate_report(result.report, run_description(name, out, smoke=smoke, device=device, seed=seed,
                                                    options=options))
    return result


def run_description(name: str, out: str | os.PathLike, *, smoke: bool, device: str, seed: int | Sequence[int],
                    options: dict[str, Any]) -> str:
    """Markdown saying how a report was made: the equivalent command line, and whether this is the full
    version, the smoke version, or a run with settings overridden (whose numbers are not the full run's).
    A list of seeds describes a multi-seed run (``--seeds``)."""

    def value(v: Any) -> str:
        return json.dumps(list(v) if isinstance(v, tuple) else v, separators=(",", ":"))

    sets = [f"{k}={value(v)}" for k, v in options.items()]
    seed_flags = ["--seed", str(seed)] if isinstance(seed, int) else ["--seeds", *map(str, seed)]
    command = " ".join(["capsnets experiment", name, *(["--smoke"] if smoke else []), "--out", str(out),
                        "--device", device, *seed_flags, *(f"--set '{item}'" for item in sets)])
    if smoke:
        scale = "**Smoke version**: tiny data and models; the numbers test the pipeline, not the paper."
    elif options:
        scale = ("**Reduced run**: the full version with these settings overridden: "
                 + ", ".join(f"`{item}`" for item in sets)
                 + ". Its numbers are not the full experiment's; the Settings table lists every value.")
    else:
        scale = "Full version (the experiment's default settings)."
    return f"{scale}\n\nCommand: `{command}`"


def _annotate_report(report: Path, text: str) -> None:
    """Insert ``text`` as a paragraph after the title line of ``report`` (rewritten atomically)."""
    title, _, rest = report.read_text().partition("\n")
    _atomic_write_text(report, f"{title}\n\n{text}\n{rest}")


def merge_settings(name: str, defaults: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` overridden by ``options``; an option the experiment does not have raises ``ValueError``
    naming the ones it takes."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise ValueError(f"{name} does not take {', '.join(unknown)}; it takes: {', '.join(sorted(defaults))}")
    return {**defaults, **options}


# --------------------------------------------------------------------------------------------------------
# Reports


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
    _atomic_write_text(report, "\n".join(parts))
    return ExperimentResult(name or title, report, figures, dict(metrics or {}))


def settings_table(settings: dict[str, Any]) -> str:
    """A two-column markdown table of an experiment's settings."""
    return markdown_table(["setting", "value"], [(k, v) for k, v in settings.items()])


def save_figure(fig, out_png: str | os.PathLike) -> Path:
    """Render a :class:`matplotlib.figure.Figure` to ``out_png`` atomically (see :mod:`capsnets.plots`)."""
    from capsnets import plots

    return plots.save_figure(fig, out_png)


def training_cell(training: str, history: Sequence[dict], loaded: bool) -> str:
    """A report's training cell: ``training`` (e.g. ``"7 of 50 (time limit) x 60,000 pairs"``); for a model
    loaded from a checkpoint ``"loaded"``, followed by ``training`` when the checkpoint kept the history."""
    if not loaded:
        return training
    return f"loaded ({training})" if history else "loaded"


def epoch_table(histories: dict[str, Sequence[dict]], columns: Sequence[tuple[str, str, Callable[[Any], str]]]) -> str:
    """A markdown table with one row per epoch and, for each model in ``histories`` (name -> per-epoch records,
    as :func:`~capsnets.experiments.training.train_classifier` returns them), one column per
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


def _atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
