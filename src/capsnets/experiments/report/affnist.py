"""The report of the ``affnist`` experiment (Sabour, Frosst & Hinton 2017, Sec. 5.2): accuracy on each test set
beside the paper's, and how the models were trained and compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from capsnets.experiments.report import markdown_table, matching_note, percent, settings_table
from capsnets.experiments.runs import Training

__all__ = ["PAPER_ACCURACY", "affnist_sections"]

#: Sabour, Frosst & Hinton (2017), Sec. 5.2: (expanded MNIST, affNIST) test accuracy.
PAPER_ACCURACY = {"CapsNet": (0.9923, 0.79), "CNN": (0.9922, 0.66)}


def affnist_sections(
    models: dict[str, tuple[str, int]],
    tests: Sequence[str],
    accuracy: dict[tuple[str, str], float],
    training: dict[str, Training],
    s: Any,
    *,
    missing: str | None,
    seed: int,
    device: str,
    smoke: bool,
) -> list[tuple[str, str]]:
    """The report's sections: results (with the notes on data and matching) and settings.

    Args:
        models: name -> ``(model name, parameters)``; tests: the test sets' names.
        accuracy: ``(name, test)`` -> accuracy; training: name -> its :class:`~capsnets.experiments.runs.Training`.
        s: the experiment's settings; missing: why the real affNIST test set was not evaluated (None: it was).
    """
    headers = [
        "model",
        "parameters",
        "epochs",
        *[f"{t} accuracy" for t in tests],
        "paper: expanded MNIST",
        "paper: affNIST",
    ]
    rows = [
        (
            f"{name} ({model_name})",
            f"{params:,}",
            training[name].epochs,
            *[percent(accuracy[name, t]) for t in tests],
            percent(PAPER_ACCURACY[name][0]),
            percent(PAPER_ACCURACY[name][1]),
        )
        for name, (model_name, params) in models.items()
    ]
    notes = (
        "Training: MNIST digits at random positions on a 40x40 canvas, no other augmentation. "
        "affNIST-style: MNIST test digits, rotation +-20 deg, shear +-0.2, scales 0.8-1.2 (uniform), "
        "translated uniformly within the 40x40 frame. "
    )
    notes += "The real affNIST test set was evaluated." if missing is None else f"Real affNIST not evaluated: {missing}"
    notes += "\n\n" + matching_note(training, s.target_accuracy)
    return [
        ("Results", markdown_table(headers, rows) + "\n\n" + notes),
        ("Settings", settings_table({**s.to_dict(), "seed": seed, "device": device, "smoke": smoke})),
    ]
