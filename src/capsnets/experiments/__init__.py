"""The papers' experiments, one registered function each, run by ``capsnets experiment NAME``.

- :func:`run_experiment` ``(name, out, smoke=..., device=..., seed=..., data_dir=..., checkpoint_dir=...,
  **settings)`` writes ``out/report.md`` and PNG figures and returns an :class:`ExperimentResult`.
- :func:`run_experiment_seeds` ``(name, out, seeds, ...)`` runs it once per seed into ``out/seed-N`` and
  summarises the spread, and each contrast (capsules minus CNN per seed), in ``out/report.md``.
- :func:`list_experiments`, :func:`describe_experiments` (one line each, or one experiment's settings),
  :func:`experiment_settings`: the registry (:mod:`.common`); each experiment's settings are a dataclass.
- :mod:`.report` writes every report; :mod:`.runs` trains the experiments' models through the engine's trainer, each
  in a run directory of its own under ``--checkpoint-dir`` (:class:`Runs`), reused when complete and resumed when a
  time limit cut it short.

Experiment modules register themselves on import; every module named in ``_MODULES`` is imported here, so
adding an experiment means adding its file and its name below. No experiment imports another.
"""

from __future__ import annotations

import importlib

from .common import (
    ExperimentSettings,
    describe_experiments,
    experiment_settings,
    get_experiment,
    list_experiments,
    register_experiment,
    run_experiment,
)
from .report import ExperimentResult, markdown_table, percent, save_figure, settings_table, write_report
from .runs import Runs, Training
from .seeds import run_experiment_seeds, summarise_seeds

_MODULES = ("multimnist", "dimensions", "affnist", "adversarial", "viewpoints", "segmentation", "synthesis", "routers")

for _name in _MODULES:
    importlib.import_module(f"{__name__}.{_name}")

__all__ = [
    "ExperimentResult",
    "ExperimentSettings",
    "describe_experiments",
    "experiment_settings",
    "get_experiment",
    "list_experiments",
    "markdown_table",
    "percent",
    "register_experiment",
    "Runs",
    "Training",
    "run_experiment",
    "run_experiment_seeds",
    "save_figure",
    "settings_table",
    "summarise_seeds",
    "write_report",
]
