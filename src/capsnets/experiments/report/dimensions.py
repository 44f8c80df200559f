"""The report of the ``dimensions`` experiment (Sabour, Frosst & Hinton 2017, Sec. 5.1, Fig. 4): the model, the
chosen digits with their couplings, and what the perturbation grids and the routing picture show.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from capsnets.experiments.report import markdown_table, percent, settings_table

__all__ = ["dimensions_sections"]


def _training_text(training: dict, epochs: int) -> str:
    """The model's training cell: ``"loaded from FOLDER"`` for a trainer run directory (``training["folder"]``),
    else the epochs (of a :class:`~capsnets.experiments.runs.Training`) and images."""
    if "folder" in training:
        return f"loaded from {training['folder']}"
    return f"{training['training'].epochs} x {training['images']:,} images"


def dimensions_sections(
    cfg: Any,
    *,
    parameters: int,
    accuracy: float,
    test_images: int,
    training: dict,
    digits: Sequence[tuple[int, int, int, Any]],
    num_classes: int,
    seed: int,
    device: str,
) -> list[tuple[str, str]]:
    """The report's sections: model, digits and settings.

    Args:
        cfg: the experiment's settings; training: how the model was made (``{"folder"}``: loaded from a trainer run
            directory; else ``{"history", "loaded", "images"}``).
        digits: per chosen digit ``(label, predicted class, test index, couplings to the predicted class)``.
        num_classes: the model's classes (uniform couplings are ``1 / num_classes``).
    """
    rows = [(label, w, i, f"{c.min():.3f} / {c.mean():.3f} / {c.max():.3f}") for label, w, i, c in digits]
    return [
        (
            "Model",
            markdown_table(
                ["model", "parameters", "test accuracy", "training"],
                [
                    (
                        cfg.model,
                        f"{parameters:,}",
                        percent(accuracy) + f" on {test_images:,}",
                        _training_text(training, cfg.epochs),
                    )
                ],
            ),
        ),
        (
            "Digits",
            markdown_table(["label", "predicted", "test index", "couplings to it: min / mean / max"], rows)
            + "\n\nEach grid: rows = the 16 dimensions of the winning class capsule, columns = perturbations "
            "-0.25 ... +0.25 in steps of 0.05 (paper Fig. 4: scale, thickness, stroke, skew, width, parts). "
            "`routing.png`: what the primary capsules route to the winning class, final coupling times capsule "
            f"length, summed over types. Uniform couplings would be 1/{num_classes}: the table shows how far "
            "routing moves them, which bounds what the picture can show.",
        ),
        ("Settings", settings_table({**cfg.to_dict(), "seed": seed, "device": device})),
    ]
