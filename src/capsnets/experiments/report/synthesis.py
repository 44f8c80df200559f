"""The report of the ``synthesis`` experiment (Bass et al. 2019): the generators' errors on the test label maps,
what those numbers measure, and the data section.
"""

from __future__ import annotations

from typing import Any

from capsnets.experiments.report import markdown_table, percent, settings_table, training_cell
from capsnets.experiments.training import epochs_trained

__all__ = ["synthesis_sections"]


def synthesis_sections(
    models: dict[str, dict], s: Any, *, size: int, classes: int, inside: float, seed: int, device: str, smoke: bool
) -> list[tuple[str, str]]:
    """The report's sections: results, data and settings.

    Args:
        models: name -> ``{"model_name", "parameters", "discriminator_parameters", "l1", "psnr", "history",
            "loaded"}``.
        s: the experiment's settings; size: the images' side; classes: the label maps' channels; inside: the
            fraction of test pixels inside a silhouette.
    """
    rows = [
        (
            f"{name} ({m['model_name']})",
            f"{m['parameters']:,}",
            f"{m['discriminator_parameters']:,}",
            f"{m['l1']:.4f}",
            f"{m['psnr']:.2f} dB",
            training_cell(
                f"{epochs_trained(m['history'], s.epochs)} x {s.train_images:,} images", m["history"], m["loaded"]
            ),
        )
        for name, m in models.items()
    ]
    headers = ["generator", "parameters", "discriminator parameters", "test L1 error", "test PSNR", "training"]
    return [
        (
            "Results",
            markdown_table(headers, rows) + "\n\nL1: mean absolute pixel error of the generated test images "
            "(pixels in [0, 1]); PSNR: mean per image of -10 log10(MSE). Both reward the average garment inside the "
            "silhouette; the examples show what the numbers do not (texture, seams, sharpness). The paper compares "
            "the generators qualitatively and gives no number to put beside these.",
        ),
        (
            "Data",
            f"Fashion-MNIST, 28x28 padded to {size}x{size}: {s.train_images:,} training and "
            f"{s.test_images:,} test images; the label map has one channel per class ({classes}), the "
            f"garment's silhouette (pixels above 0.05) in the channel of its class. "
            f"{percent(inside)} of the test pixels are inside a silhouette.",
        ),
        ("Settings", settings_table({**s.to_dict(), "seed": seed, "device": device, "smoke": smoke})),
    ]
