"""The report of the ``segmentation`` experiment (LaLonde & Bagci 2018, Sec. 4): Dice of SegCaps, the capsule
U-Net, U-Net and the threshold floor beside the paper's LUNA16 numbers (SegCaps' and U-Net's), the per-epoch
training table and the data section.
"""

from __future__ import annotations

from typing import Any

from capsnets.experiments.report import epoch_table, markdown_table, percent, settings_table

__all__ = ["PAPER", "segmentation_sections"]

#: LaLonde & Bagci (2018), Table 1: (Dice on LUNA16, parameters).
PAPER = {"SegCaps": (0.9848, "1.4M"), "U-Net": (0.9845, "31M")}


def segmentation_sections(
    models: dict[str, dict],
    s: Any,
    *,
    threshold: float,
    test_images: int,
    object_fraction: float,
    val_images: int,
    seed: int,
    device: str,
    smoke: bool,
) -> list[tuple[str, str]]:
    """The report's sections: results, training, data and settings.

    Args:
        models: name -> ``{"model_name", "parameters", "dice", "training"}`` (a
            :class:`~capsnets.experiments.runs.Training`).
        s: the experiment's settings; threshold: the Dice of thresholding the test images themselves.
        test_images, val_images: the sizes of the test and validation sets; object_fraction: the fraction of
            test pixels in the mask.
    """
    rows = []
    for name, m in models.items():
        rows.append(
            (
                f"{name} ({m['model_name']})",
                f"{m['parameters']:,}",
                percent(m["dice"]),
                percent(PAPER[name][0]) if name in PAPER else "-",
                PAPER[name][1] if name in PAPER else "-",
                f"{m['training'].epochs} x {s.images_per_epoch:,} images",
            )
        )
    rows.append(("image > 0.5 (no model)", "0", percent(threshold), "-", "-", "-"))
    headers = ["model", "parameters", "test Dice (ours)", "paper Dice (LUNA16)", "paper parameters", "training"]
    return [
        (
            "Results",
            markdown_table(headers, rows) + "\n\nDice: mean over test images of 2|P & M| / (|P| + |M|), "
            "P the pixels with probability > 0.5, M the mask. The paper's numbers are for LUNA16 lung CT, not this "
            "data: compare the models with each other and with the threshold row, not with the paper's Dice.",
        ),
        ("Training", _history_table({name: m["training"].history for name, m in models.items()}, val_images)),
        (
            "Data",
            f"{test_images:,} fixed-seed {s.size}x{s.size} test images from {s.test_digits:,} MNIST test "
            f"digits, each one digit plus {s.clutter} {s.patch}x{s.patch} pieces of other digits; "
            f"{percent(object_fraction)} of the test pixels are object. Training: a fresh set of "
            f"{s.images_per_epoch:,} images from {s.train_digits:,} MNIST training digits every epoch.",
        ),
        ("Settings", settings_table({**s.to_dict(), "seed": seed, "device": device, "smoke": smoke})),
    ]


def _history_table(histories: dict[str, list], val_images: int) -> str:
    """Per epoch and model: mean training loss and Dice on the validation images (a collapse shows here)."""
    return (
        f"After every epoch: the mean training loss and the mean Dice (object and background) on {val_images:,} "
        "validation images built from training digits (fixed seed), which chooses each model's best epoch.\n\n"
        + epoch_table(
            histories, [("train_loss", "loss", lambda v: f"{v:.4g}"), ("val_mean_dice", "validation Dice", percent)]
        )
    )
