"""The registry of paper experiments, their typed settings, and running one (``capsnets experiment NAME``).

An experiment is a function registered with its settings, a frozen dataclass whose defaults are the full
run's and whose ``SMOKE`` entries give the tiny CPU-sized version (minutes)::

    @dataclass(frozen=True)
    class Settings(ExperimentSettings):
        epochs: int = 50
        lr: float = 1e-3
        SMOKE: ClassVar[dict] = {"epochs": 1}

    @register_experiment("multimnist", Settings, "two overlapping digits: CapsNet against a CNN")
    def run(out: Path, s: Settings, *, smoke, device, seed, data_dir, runs) -> ExperimentResult:
        ...
        return write_report(out, "MultiMNIST", [("Results", markdown_table(headers, rows))], metrics={...})

``--set KEY=VALUE`` (the ``options`` of :func:`run_experiment`) overrides single settings, checked against
the field types. Reports are written with :mod:`capsnets.experiments.report`; the models are trained through the
engine's trainer in ``runs``, the :class:`~capsnets.experiments.runs.Runs` folder (``--checkpoint-dir``) that keeps
their run directories.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from capsnets.engine.runtime import resolve_device, seed_everything
from capsnets.experiments.report import ExperimentResult, annotate_report, run_description
from capsnets.experiments.runs import Runs
from capsnets.validation import ArgumentError, shown

#: ``metrics -> [(label, key_a, key_b), ...]``: the differences ``metrics[key_a] - metrics[key_b]`` that a
#: multi-seed summary reports per seed (e.g. capsules minus CNN on the same test set).
ContrastFn = Callable[[dict[str, Any]], list[tuple[str, str, str]]]


@dataclass(frozen=True)
class ExperimentSettings:
    """Base class of an experiment's settings: typed fields whose defaults are the full run's; ``SMOKE`` maps
    the fields that the tiny version (:meth:`smoke`) changes to their values."""

    SMOKE: ClassVar[dict[str, Any]] = {}

    @classmethod
    def smoke(cls) -> ExperimentSettings:
        """The settings of the tiny version: the defaults with ``SMOKE`` applied."""
        return cls(**cls.SMOKE)

    def with_options(self, name: str, options: dict[str, Any]) -> ExperimentSettings:
        """A copy with ``options`` applied, each checked against its field's type; an unknown key raises a
        :class:`~capsnets.validation.ArgumentError` naming every unknown key and the ones the experiment takes."""
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise ArgumentError(f"{name} does not take {', '.join(unknown)}; it takes: {', '.join(sorted(names))}")
        hints = typing.get_type_hints(type(self))
        return dataclasses.replace(
            self, **{key: _typed(name, key, hints[key], value) for key, value in options.items()}
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def subset(self, *names: str) -> dict[str, Any]:
        """``{name: value}`` of the named settings (e.g. the ones that make a training's recipe)."""
        return {name: getattr(self, name) for name in names}

    @classmethod
    def describe(cls) -> str:
        """One line per setting: name, type, full default and, where it differs, the smoke value."""
        hints, smoke = typing.get_type_hints(cls), cls.smoke()
        lines = []
        for f in dataclasses.fields(cls):
            full, tiny = getattr(cls(), f.name), getattr(smoke, f.name)
            shown = _type_name(hints[f.name])
            lines.append(f"  {f.name}: {shown} = {full!r}" + (f" (smoke: {tiny!r})" if tiny != full else ""))
        return "\n".join(lines)


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: its function, settings class, one-line description and contrasts."""

    run: Callable[..., ExperimentResult]
    settings: type[ExperimentSettings]
    description: str
    contrasts: ContrastFn | None = None


_EXPERIMENTS: dict[str, Experiment] = {}


def register_experiment(
    name: str, settings: type[ExperimentSettings], description: str, *, contrasts: ContrastFn | None = None
) -> Callable:
    """Decorator registering ``run(out, settings, *, smoke, device, seed, data_dir, runs)`` under
    ``name`` (see the module docstring). ``contrasts`` names the comparisons a multi-seed run summarises
    (:mod:`capsnets.experiments.seeds`)."""

    def decorate(fn: Callable[..., ExperimentResult]) -> Callable[..., ExperimentResult]:
        if name in _EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is already registered")
        _EXPERIMENTS[name] = Experiment(fn, settings, description, contrasts)
        return fn

    return decorate


def list_experiments() -> list[str]:
    """Names of the registered experiments, sorted."""
    return sorted(_EXPERIMENTS)


def get_experiment(name: str) -> Experiment:
    """The experiment registered as ``name``; an unknown name raises an ``ArgumentError`` listing the known ones."""
    if name not in _EXPERIMENTS:
        close = difflib.get_close_matches(name, _EXPERIMENTS, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ArgumentError(f"unknown experiment {name!r}.{hint} Known experiments: {', '.join(list_experiments())}")
    return _EXPERIMENTS[name]


def get_contrasts(name: str) -> ContrastFn:
    """The contrast function registered with experiment ``name`` (one returning no contrasts if none was)."""
    return get_experiment(name).contrasts or (lambda metrics: [])


def describe_experiments(name: str | None = None) -> str:
    """One line per experiment (name and description), or, for ``name``, its settings one per line."""
    if name is not None:
        experiment = get_experiment(name)
        return f"{name}: {experiment.description}\nsettings (--set KEY=VALUE):\n{experiment.settings.describe()}"
    width = max(map(len, _EXPERIMENTS), default=0)
    return "\n".join(f"{key:<{width}}  {_EXPERIMENTS[key].description}" for key in list_experiments())


def experiment_settings(name: str, *, smoke: bool = False, **options) -> ExperimentSettings:
    """The settings ``name`` runs with: the full or smoke version with ``options`` applied."""
    settings = get_experiment(name).settings
    return (settings.smoke() if smoke else settings()).with_options(name, options)


def run_experiment(
    name: str,
    out: str | os.PathLike,
    *,
    smoke: bool = False,
    device: str = "auto",
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    **options,
) -> ExperimentResult:
    """Seed everything, create ``out`` and run the experiment ``name`` (its report goes to ``out/report.md``);
    ``options`` override single settings (see :func:`describe_experiments`). The models' run directories are kept
    in ``checkpoint_dir`` (:class:`~capsnets.experiments.runs.Runs`; None: a temporary folder); the result's
    ``cut_short`` names the trainings a time limit left unfinished there."""
    check_seed(seed)
    settings = experiment_settings(name, smoke=smoke, **options)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    device = str(resolve_device(device))
    with Runs(checkpoint_dir) as runs:
        result = get_experiment(name).run(
            out, settings, smoke=smoke, device=device, seed=seed, data_dir=data_dir, runs=runs
        )
    result.cut_short = runs.cut_short
    annotate_report(result.report, run_description(name, out, smoke=smoke, device=device, seed=seed, options=options))
    return result


#: Seeds an experiment takes: ``[0, 2**32)``, NumPy's range (experiments derive further seeds from them).
SEED_LIMIT = 2**32


def check_seed(seed: Any) -> int:
    """``seed`` if it is an int in ``[0, 2**32)``, else an :class:`~capsnets.validation.ArgumentError` naming it."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ArgumentError(f"seed must be an integer in [0, 2**32), got {shown(seed)}")
    return seed


def _typed(name: str, key: str, hint: Any, value: Any) -> Any:
    """``value`` as a value of type ``hint`` (int, float, str, bool, dict, tuple/list of one type, optional),
    or an ``ArgumentError`` naming the setting. A single value where a tuple or list is expected is taken as one
    element; an int where a float is expected as that float."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return _typed(name, key, option, value)
            except ValueError:
                pass
    elif origin in (tuple, list):
        items = value if isinstance(value, (list, tuple)) else [value]
        return origin(_typed(name, key, args[0], item) for item in items)
    elif origin is dict or hint is dict:
        if isinstance(value, dict):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is Any or (isinstance(value, hint) and not (hint is int and isinstance(value, bool))):
        return value
    example = f" (a mapping, e.g. --set '{key}={{\"batch_norm\": true}}')" if origin is dict or hint is dict else ""
    raise ArgumentError(f"{name}: {key}={shown(value)} is not {_type_name(hint)}{example}")


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) if typing.get_origin(hint) is None else str(hint).replace("typing.", "")
