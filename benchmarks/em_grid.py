"""The grid of ``em_sweep.py``: the training recipes as their public code sets them, and the settings.

Recipes (``docs/results/em-recipes.md`` has the table of what each sets, with the files it was read from):

- ``cli``: :class:`~capsnets.engine.TrainConfig`'s defaults, what ``capsnets train`` uses;
- ``yl1993``: yl-1993/Matrix-Capsules-EM-PyTorch, ``train.py`` and ``loss/spread_loss.py`` (Adam 3e-3, weight
  decay 2e-7, 0.96 per 20,000 steps, a margin from 0.2 to 0.9 over 10 epochs, inputs standardised, no shifts);
- ``authors``: the flag defaults of google-research/google-research, ``capsule_em/experiment.py``, with
  ``model.py``, ``layers.py`` and ``utils.py`` (Adam 1e-2, 0.96 per 20,000 steps, weight decay 2e-7 on a loss
  averaged over the classes, the sigmoid margin, 2-px shifts).

A recipe is a function ``(epochs, steps per epoch) -> TrainConfig fields``, plus ``normalize`` (None or
``(mean, std)``), which the config has no field for. Batch 32 for all (the comparison's), not their 128 and 64.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from capsnets.engine.config import DEFAULTS

FORMULATIONS = ("official", "paper")
ITERATIONS = (1, 2, 3)
#: The inverse temperature axis: a fixed lambda, or None for the authors' schedule (each formulation's default).
LAMBDAS: dict[str, float | None] = {"1e-3": 1e-3, "1e-2": 1e-2, "authors": None}
#: Stage A of the pruned grid: the recipe, and each formulation's usual inverse temperature.
STAGE_A_RECIPE = "yl1993"
STAGE_A_LAMBDA = {"official": "authors", "paper": "1e-3"}
MNIST_MEAN_STD = (0.1307, 0.3081)


def yl1993_margin(epochs: int) -> dict[str, float]:
    """yl-1993's spread-loss margin, ``0.2 + 0.7 r`` with ``r`` the fraction of a 10-epoch training done
    (``train.py``), as the loss arguments of a run of ``epochs`` epochs."""
    return {"margin_start": 0.2, "margin_end": 0.2 + 0.7 * min(epochs / 10, 1.0), "ramp": min(10 / epochs, 1.0)}


def authors_margin(steps: int) -> dict[str, float]:
    """The released code's margin ``0.2 + 0.79 sigmoid(min(10, step / 50000 - 4))`` (``capsule_em/layers.py``,
    ``optimizer``), as a linear ramp between its values at the first and the last step (within 2e-4 of it
    for runs up to 10,000 steps)."""

    def margin(step):
        return 0.2 + 0.79 / (1 + math.exp(-min(10.0, step / 50000 - 4)))

    return {"margin_start": margin(0), "margin_end": margin(steps), "ramp": 1.0}


def spread(**margin: float) -> dict[str, Any]:
    """The spread loss with every argument named (the library's defaults, then ``margin``), so that no model's
    recipe adds to the loss arguments (:func:`capsnets.models.training_recipe`)."""
    loss_args = {"margin_start": 0.2, "margin_end": 0.9, "ramp": 0.5, "ramp_epochs": None, **margin}
    return {"loss": "spread", "loss_args": loss_args}


def _cli(epochs: int, steps_per_epoch: int) -> dict[str, Any]:
    # TrainConfig's defaults without a model recipe: what `capsnets train` gave every model before the matrix
    # networks carried one (2-px shifts on MNIST's 28 px)
    return {**DEFAULTS, "max_shift": 2, **spread()}


def _yl1993(epochs: int, steps_per_epoch: int) -> dict[str, Any]:
    return {
        "lr": 3e-3,
        "weight_decay": 2e-7,
        "lr_schedule": "exponential",
        "lr_decay": 0.96 ** (steps_per_epoch / 20000),  # 0.96 per 20,000 steps, per epoch here
        **spread(**yl1993_margin(epochs)),
        "max_shift": 0,
        "normalize": MNIST_MEAN_STD,
    }


def _authors(epochs: int, steps_per_epoch: int) -> dict[str, Any]:
    return {
        "lr": 1e-2,
        # 2e-7 * sum(w^2) / 2 beside a spread loss averaged over the 10 classes: with this library's loss, summed
        # over the classes, Adam takes the same steps with 10 times the decay
        "weight_decay": 2e-6,
        "lr_schedule": "exponential",
        "lr_decay": 0.96 ** (steps_per_epoch / 20000),
        **spread(**authors_margin(epochs * steps_per_epoch)),
        "max_shift": 2,
        "normalize": None,
    }


#: recipe name -> ``(epochs, steps per epoch) -> TrainConfig fields`` (plus ``normalize``: None or (mean, std)).
#: Each names every field a model's recipe sets, so that the model's recipe changes none of them.
RECIPES: dict[str, Callable[[int, int], dict[str, Any]]] = {"cli": _cli, "yl1993": _yl1993, "authors": _authors}


def _variant(**changes: Any) -> Callable[[int, int], dict[str, Any]]:
    return lambda epochs, steps_per_epoch: {**_yl1993(epochs, steps_per_epoch), **changes}


#: Further recipes, which only ``--grid full`` holds (``--only paper/it2/lambda=authors/default/`` runs one):
#: ``default``, the model's own recipe (what ``capsnets train --model NAME`` uses), and ablations of yl-1993's:
#: ``raw`` leaves the inputs in [0, 1]; the others change one more thing: Adam 5e-3, or a margin kept at 0.2, as
#: the released code's sigmoid nearly does over the first 65,000 steps.
VARIANTS: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "default": lambda epochs, steps_per_epoch: {},
    "yl1993-raw": _variant(normalize=None),
    "yl1993-raw-lr5e-3": _variant(normalize=None, lr=5e-3),
    "yl1993-raw-flat": _variant(normalize=None, **spread(margin_start=0.2, margin_end=0.2, ramp=1.0)),
}
#: Every recipe by name: the grid's and the further ones.
ALL_RECIPES = {**RECIPES, **VARIANTS}


class Setting(NamedTuple):
    """One point of the grid."""

    formulation: str
    iterations: int
    inverse_temperature: str
    recipe: str

    @property
    def key(self) -> str:
        return f"{self.formulation}/it{self.iterations}/lambda={self.inverse_temperature}/{self.recipe}"

    def model_args(self) -> dict[str, Any]:
        routing: dict[str, Any] = {"type": "em", "formulation": self.formulation, "iterations": self.iterations}
        if LAMBDAS[self.inverse_temperature] is not None:
            routing["inverse_temperature"] = LAMBDAS[self.inverse_temperature]
        return {"routing": routing}


def full_grid() -> list[Setting]:
    return [
        Setting(f, i, lam, recipe)
        for f in FORMULATIONS
        for i in ITERATIONS
        for lam in LAMBDAS
        for recipe in ALL_RECIPES
    ]


def stage_a() -> list[Setting]:
    return [Setting(f, i, STAGE_A_LAMBDA[f], STAGE_A_RECIPE) for f in FORMULATIONS for i in ITERATIONS]


def final_accuracy(runs: dict, setting: Setting, seeds) -> float | None:
    """Mean over ``seeds`` of the last recorded accuracy, or None if a seed is missing."""
    accs = [runs.get(run_key(setting, s), {}).get("final_test_accuracy") for s in seeds]
    return None if None in accs else sum(accs) / len(accs)


def stage_b(runs: dict, seeds, top: int) -> list[Setting] | None:
    """The recipe x inverse temperature axes at the ``top`` best settings of stage A (None until it is done)."""
    scores = {s: final_accuracy(runs, s, seeds) for s in stage_a()}
    if None in scores.values():
        return None
    best = sorted(scores, key=lambda s: -scores[s])[:top]
    extra = [b._replace(inverse_temperature=lam, recipe=r) for b in best for lam in LAMBDAS for r in RECIPES]
    return [s for s in extra if s not in scores]


def run_key(setting: Setting, seed: int) -> str:
    return f"{setting.key}/seed={seed}"
