"""The papers' experiments (issue 4), one registered function each, run by ``capsnets experiment NAME``.

- :func:`run_experiment` ``(name, out, smoke=..., device=..., seed=..., data_dir=..., checkpoint_dir=...)``
  writes ``out/report.md`` and PNG figures and returns an :class:`ExperimentResult`.
- :func:`run_experiment_seeds` ``(name, out, seeds, ...)`` runs it once per seed into ``out/seed-N`` and
  summarises the spread, and each contrast (capsules minus CNN per seed), in ``out/report.md``.
- :func:`register_experiment`, :func:`list_experiments`: the registry (see :mod:`.common` for the contract
  and the report helpers, :func:`write_report`, :func:`markdown_table`; :mod:`.training` for
  :func:`train_classifier`, :func:`evaluate_accuracy`, :func:`load_or_train` and :class:`TrainingState`,
  which lets a later run continue a training that a time limit cut short).

Experiment modules register themselves on import; every module named in ``_MODULES`` that exists is
imported here, so adding an experiment means adding its file and its name below.
"""
from __future__ import annotations

import importlib

from .common import (ExperimentResult, get_experiment, list_experiments, markdown_table, percent, register_experiment,
                     run_experiment, save_figure, settings_table, write_report)
from .training import TrainingState, evaluate_accuracy, load_or_train, train_classifier

_MODULES = ("multimnist", "dimensions", "affnist", "adversarial", "viewpoints", "segmentation", "synthesis")

from .seeds import run_experiment_seeds, summarise_seeds

for _name in _MODULES:
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _err:  # that experiment's file is not written yet
        if _err.name != f"{__name__}.{_name}":
            raise

__all__ = [
    "ExperimentResult", "TrainingState", "evaluate_accuracy", "get_experiment", "list_experiments", "load_or_train",
    "markdown_table", "percent", "register_experiment", "run_experiment", "save_figure", "settings_table",
    "run_experiment_seeds", "summarise_seeds", "train_classifier", "write_report",
]
