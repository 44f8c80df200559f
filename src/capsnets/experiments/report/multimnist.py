"""The report of the ``multimnist`` experiment (Sabour, Frosst & Hinton 2017, Sec. 6): the error table, the
per-epoch training table and the data section.
"""

from __future__ import annotations

from typing import Any

from capsnets.experiments.report import epoch_table, markdown_table, percent, settings_table

__all__ = ["PAPER_ERROR", "multimnist_sections"]

#: Sabour, Frosst & Hinton (2017), Sec. 6: MultiMNIST test error.
PAPER_ERROR = {"CapsNet": 0.052, "CNN baseline": 0.081}


def multimnist_sections(
    models: dict[str, dict], metrics: dict, cfg: Any, *, test_pairs: int, val_pairs: int, seed: int, device: str
) -> list[tuple[str, str]]:
    """The report's sections: results, training, data and settings.

    Args:
        models: name -> ``{"parameters", "error", "training"}`` (a :class:`~capsnets.experiments.runs.Training`).
        metrics: the experiment's metrics (the ``test_overlap_*`` statistics are read from them).
        cfg: the experiment's settings; test_pairs, val_pairs: the sizes of the test and validation sets.
    """
    rows = []
    for name, m in models.items():
        rows.append(
            (
                name,
                f"{m['parameters']:,}",
                percent(m["error"]),
                percent(PAPER_ERROR[name]),
                f"{m['training'].epochs} x {cfg.pairs_per_epoch:,} pairs",
            )
        )
    return [
        (
            "Results",
            markdown_table(["model", "parameters", "test error (ours)", "test error (paper)", "training"], rows)
            + "\n\nCorrect = the two highest scores are exactly the two labels (paper's metric).",
        ),
        ("Training", _history_table({name: m["training"].history for name, m in models.items()}, val_pairs)),
        (
            "Data",
            f"{test_pairs:,} fixed-seed test pairs from {cfg.test_digits:,} MNIST test digits. Average "
            f"overlap of the two digits' 28x28 frames {percent(metrics['test_overlap_frame'])} (paper: 80%, "
            f"most likely this statistic: its expectation under independent shifts of up to 4 px is 79.96%, "
            f"where the 20x20 boxes the paper names would overlap by 72.6%); "
            f"of their tight bounding boxes {percent(metrics['test_overlap_smaller'])} (intersection / "
            f"smaller box; intersection / union {percent(metrics['test_overlap_union'])}).",
        ),
        (
            "Settings",
            settings_table({**cfg.to_dict(), "seed": seed, "device": device, "combine": "max", "max_shift": 4}),
        ),
    ]


def _history_table(histories: dict[str, list], val_pairs: int) -> str:
    """Per epoch and model: mean training loss and mean average precision on the validation pairs."""
    return (
        f"After every epoch: the mean training loss and the mean average precision on {val_pairs:,} validation pairs "
        "of training digits (fixed seed), which chooses each model's best epoch.\n\n"
        + epoch_table(
            histories,
            [("train_loss", "loss", lambda v: f"{v:.4g}"), ("val_map", "validation mAP", lambda v: f"{v:.4f}")],
        )
    )
